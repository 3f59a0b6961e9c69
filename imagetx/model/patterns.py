"""Attention patterns: which keys each query may see (docs/model.md §4), as geometry only;
``attention.attend`` computes attention under them.

One layout throughout: q, k, v are (B, h, T, e), e the head size, the T steps in generation
order.

One pattern type, ``CausalPattern`` (full, 1D and 2D local), over the steps of a
``GenerationOrder``. Each pattern states two things:

* ``mask_rule()``: which keys a query may see, as arithmetic on query and key steps
  (``MaskRule``), so that it runs on any device;
* ``block_keys()``: where its queries look: queries in blocks of ``block_length`` steps, each
  block with the steps of the keys its queries may read (a superset of what the rule allows).

Every form the kernels and decoding read derives from those two, here, and is built once per
device (tests prove each equal to the dense matrix):

* ``can_attend()``: the rule on index grids, the dense boolean (Tq, Tk) matrix (True = the query,
  a row, may attend to the key, a column): the reference of every test (``dense_attention`` of
  tests/helpers.py with it defines the right answer);
* ``blocks(device)``: the block keys, each with which of its queries the rule lets see it
  (``BlockIndex``): the SDPA path's gather, O(T·(keys per block)), never O(T²);
* ``block_mask(device, block_size)``: the rule as FlexAttention's ``mask_mod``;
* ``ring()``, ``piece()`` and ``step_masks(device)``: decoding's ring buffer, read from the
  blocks, and each decoding step's mask over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from .order import GenerationOrder

if TYPE_CHECKING:  # imported where a block mask is built: FlexAttention's module brings sympy (~0.5 s)
    from torch.nn.attention.flex_attention import BlockMask

# (query steps, key steps) -> bool, True where the query may attend to the key; elementwise
# over tensors that broadcast (index grids for the dense matrix, 0-d indices in a mask_mod).
MaskRule = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class BlockIndex:
    """Queries in n blocks of L steps, in order (steps past Tq − 1 are end padding), each block
    over S keys: ``key_steps`` (n, S) long, where step Tk stands for a zero key (before the
    sequence, outside the grid, end padding); ``can_attend`` (n, L, S) bool. ``causal``: each
    block's queries are its keys and see exactly those up to themselves (SDPA's own causal
    kernel, no mask to read)."""

    key_steps: Tensor
    can_attend: Tensor
    causal: bool = False

    @property
    def query_steps(self) -> Tensor:
        """(n, L): the step of each query of each block."""
        n_blocks, block_len, _ = self.can_attend.shape
        return torch.arange(n_blocks * block_len, device=self.key_steps.device).view(n_blocks, block_len)

    def to(self, device: torch.device | str) -> "BlockIndex":
        return BlockIndex(self.key_steps.to(device), self.can_attend.to(device), self.causal)


def form_key(form: str, device: torch.device | str, *sizes: int) -> tuple:
    """Where a pattern keeps a form it built: by name, device and, for a block mask, tile size."""
    return (form, torch.device(device), *sizes)


# ----- the pattern type --------------------------------------------------------------------------

class CausalPattern:
    """Which earlier steps of ``order`` each step's query may see. Subclasses state the rule
    (``mask_rule``) and where each block of ``block_length`` queries looks (``block_keys``);
    every other form derives from them here, built on first use and kept per device."""

    block_length: int  # queries per block of ``block_keys``

    def __init__(self, order: GenerationOrder) -> None:
        self.order = order
        self.kept: dict[tuple, object] = {}

    @property
    def length(self) -> int:
        return self.order.length

    def mask_rule(self) -> MaskRule:
        """(query steps, key steps) -> bool, True where the query may attend to the key."""
        raise NotImplementedError

    def block_keys(self) -> Tensor:
        """(n, S) long: the steps of the keys each block of ``block_length`` queries may read,
        every key the rule lets one of them see among them; a step outside [0, T): none."""
        raise NotImplementedError

    # ----- derived forms

    def can_attend(self) -> Tensor:
        """(T, T) bool, True where the query (row) may attend to the key (column)."""
        steps = torch.arange(self.length)
        return self.mask_rule()(steps[:, None], steps[None, :])

    def blocks(self, device: torch.device | str) -> BlockIndex:
        """The block keys and which of them each query sees, by the rule (keys outside the
        sequence: step T, seen by none)."""
        return self.on_device("blocks", device, self.build_blocks)

    def build_blocks(self) -> BlockIndex:
        keys, length = self.block_keys(), self.length
        queries = torch.arange(keys.shape[0] * self.block_length).view(keys.shape[0], self.block_length)
        inside = (keys >= 0) & (keys < length)
        can_attend = self.mask_rule()(queries[:, :, None], keys.clamp(0, length - 1)[:, None, :]) & inside[:, None, :]
        # One block whose keys are its queries, each seeing those up to itself: SDPA's causal kernel.
        causal = keys.shape == queries.shape and torch.equal(keys, queries) and \
            torch.equal(can_attend, can_attend.new_ones(can_attend.shape[1:]).tril().expand_as(can_attend))
        return BlockIndex(keys.masked_fill(~inside, length), can_attend, causal)

    def block_mask(self, device: torch.device | str, block_size: int) -> BlockMask:
        """FlexAttention's ``BlockMask`` of the rule on ``device``, broadcast over batch and heads:
        which kernel blocks of ``block_size`` × ``block_size`` pairs to skip, which to run whole,
        which to mask. Kernel blocks the rule allows only in part keep it as their ``mask_mod``, so
        a pattern finer than a kernel block (a one-row 1D block, a narrow 2D flange) stays exact.
        Hundreds of µs to build: every layer reuses it."""
        return self.keep(form_key("block_mask", device, block_size), lambda: self.build_block_mask(device, block_size))

    def build_block_mask(self, device: torch.device | str, block_size: int) -> BlockMask:
        from torch.nn.attention.flex_attention import create_block_mask

        rule = self.mask_rule()

        def mask_mod(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
            return rule(query, key)

        return create_block_mask(mask_mod, None, None, self.length, self.length, device=device, BLOCK_SIZE=block_size)

    def ring(self) -> int:
        """Slots of a decoding ring (``attention.SelfAttentionCache``): the fewest that still hold
        the oldest key any later query reads, the longest distance from a query back to a key it
        sees (a step attends over the ring before its own key overwrites a slot). Read from the
        blocks one at a time: for each, from its last query back to its earliest key one of its
        queries sees (the last query sees all of them, in every pattern here; elsewhere a ring a
        little longer than needed)."""
        return self.keep(("ring",), self.build_ring)

    def build_ring(self) -> int:
        blocks, ring = self.blocks("cpu"), 1
        for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
            real = can_attend[queries < self.length]  # end padding reads nothing
            if bool((real & (keys[None, :] > queries[: real.shape[0], None])).any()):
                raise ValueError("cached decoding needs a causal pattern: a query sees a later key")
            seen = real.any(0)
            if real.shape[0] and bool(seen.any()):
                ring = max(ring, int(queries[real.shape[0] - 1] - keys[seen].min()))
        return ring

    def step_masks(self, device: torch.device | str) -> Tensor:
        """(T, ring + 1) bool, on ``device``: which keys step s sees when the steps before it went
        through a decoding ring in order: slot j holds the latest step before s that is j modulo
        the ring (none yet: unseen), the last column is s itself. One decoding step's mask is a
        row of it, read in one look-up instead of the rule's arithmetic."""
        return self.on_device("step_masks", device, self.build_step_masks)

    def build_step_masks(self) -> Tensor:
        ring, rule, masks = self.ring(), self.mask_rule(), []
        # a ring's worth of steps at a time: the step numbers (long) of the whole table would be
        # eight times the table
        for steps in torch.arange(self.length).split(ring):
            steps = steps[:, None]
            held = steps - 1 - (steps - 1 - torch.arange(ring)) % ring  # (t, ring); negative: no step yet
            keys = torch.cat([held, steps], dim=1)
            masks.append((keys >= 0) & rule(steps, keys.clamp(min=0)))
        return torch.cat(masks)

    def piece(self) -> int:
        """The most steps a decoding ring attends at once (a prefill runs in pieces): a query
        block, whose keys are the ring's and its own, and at most the ring, so that a piece writes
        distinct slots."""
        return min(self.ring(), self.block_length)

    def keep(self, what: tuple, build: Callable[[], object]):
        """``build()`` the first time ``what`` is asked for; after that, the same object."""
        if what not in self.kept:
            self.kept[what] = build()
        return self.kept[what]

    def on_device(self, form: str, device: torch.device | str, build_on_cpu: Callable[[], object]):
        """A form built once on the CPU (``build_on_cpu``), kept, and copied once to each other device."""
        cpu = self.keep(form_key(form, "cpu"), build_on_cpu)
        return cpu if torch.device(device).type == "cpu" else self.keep(form_key(form, device), lambda: cpu.to(device))

    def is_built(self, device: torch.device | str, block_size: int | None = None) -> bool:
        """Whether the blocks (``block_size`` None) or the block mask of ``block_size`` are kept on
        ``device``."""
        key = form_key("blocks", device) if block_size is None else form_key("block_mask", device, block_size)
        return key in self.kept

    def describe(self) -> str:
        return type(self).__name__


class FullCausal(CausalPattern):
    """Every query sees every earlier position and itself: the O(T²) baseline."""

    def __init__(self, order: GenerationOrder) -> None:
        super().__init__(order)
        self.block_length = order.length  # one block: full attention's sparsity is no sparsity

    def mask_rule(self) -> MaskRule:
        def rule(query: Tensor, key: Tensor) -> Tensor:
            return key <= query

        return rule

    def block_keys(self) -> Tensor:
        return torch.arange(self.length)[None]


class Local1D(CausalPattern):
    """Query blocks of ``block_length`` steps in raster order (docs/model.md §4, 1D).

    A query sees every position of the previous ``memory_blocks`` blocks and its own block up
    to and including itself. The sequence's end is padded to whole blocks; padding comes after
    every real position, so causality alone keeps it unseen.
    """

    def __init__(self, order: GenerationOrder, block_length: int, memory_blocks: int = 1) -> None:
        super().__init__(order)
        self.block_length, self.memory_blocks = block_length, memory_blocks

    def mask_rule(self) -> MaskRule:
        lq, m = self.block_length, self.memory_blocks

        def rule(query: Tensor, key: Tensor) -> Tensor:
            return (key <= query) & (key // lq >= query // lq - m)

        return rule

    def block_keys(self) -> Tensor:
        """Block b's keys: the steps of blocks b−m .. b, (m+1)·lq of them."""
        lq, m = self.block_length, self.memory_blocks
        n_blocks = -(-self.length // lq)
        return (torch.arange(n_blocks)[:, None] - m) * lq + torch.arange((m + 1) * lq)

    def describe(self) -> str:
        return f"Local1D(lq={self.block_length}, memory_blocks={self.memory_blocks})"


class Local2D(CausalPattern):
    """Query blocks of qh×qw grid cells with a memory flange (docs/model.md §4, 2D).

    The sequence is in block-raster order (``order.block`` = (qh, qw)). A block with top-left
    cell (r0, c0) sees the top flange rows [r0−fh, r0) × cols [c0−fw, c0+qw+fw), the left
    flange rows [r0, r0+qh) × cols [c0−fw, c0), and itself causally. Cells outside the grid
    are never attended.
    """

    def __init__(self, order: GenerationOrder, flange: tuple[int, int]) -> None:
        if order.block is None:
            raise ValueError("2D local attention needs a block-raster order: GenerationOrder(rows, cols, block)")
        super().__init__(order)
        self.block, self.flange = tuple(order.block), tuple(flange)
        self.block_length = self.block[0] * self.block[1]

    def mask_rule(self) -> MaskRule:
        (qh, qw), (fh, fw) = self.block, self.flange
        grid_cell = self.order.grid_cell
        last = self.length - 1

        def rule(query: Tensor, key: Tensor) -> Tensor:
            # A kernel's last block may ask about steps past T − 1. Clamped, such a key reads the
            # last cell (bottom right: in no block's flange) and, later than every real query,
            # fails ``own``.
            query_row, query_col = grid_cell(query.clamp(max=last))
            r0, c0 = query_row // qh * qh, query_col // qw * qw  # query block corner
            key_row, key_col = grid_cell(key.clamp(max=last))
            top = (key_row >= r0 - fh) & (key_row < r0) & (key_col >= c0 - fw) & (key_col < c0 + qw + fw)
            left = (key_row >= r0) & (key_row < r0 + qh) & (key_col >= c0 - fw) & (key_col < c0)
            own = (key_row // qh * qh == r0) & (key_col // qw * qw == c0) & (key <= query)
            return top | left | own

        return rule

    def block_keys(self) -> Tensor:
        """Every block's keys: M flange cells and the L = qh·qw block cells — the top flange
        (raster), the left flange, then the block itself; a cell outside the grid is step −1."""
        (qh, qw), (fh, fw) = self.block, self.flange
        # Step numbers laid on the grid, padded with 0 ("outside") above and either side;
        # windows: nh, nw, fh+qh, qw+2fw — each block's rows and columns of context.
        steps = self.order.sequence_to_grid(torch.arange(1, self.length + 1)[None])[0]
        windows = F.pad(steps, (fw, fw, fh, 0)).unfold(0, fh + qh, qh).unfold(1, qw + 2 * fw, qw)
        top = rearrange(windows[:, :, :fh, :], "nh nw r c -> (nh nw) (r c)")
        left = rearrange(windows[:, :, fh:, :fw], "nh nw r c -> (nh nw) (r c)")
        own = rearrange(torch.arange(1, self.length + 1), "(n l) -> n l", l=self.block_length)
        return torch.cat([top, left, own], dim=1) - 1

    def describe(self) -> str:
        return f"Local2D(query={self.block}, flange={self.flange})"


def pattern_for(config) -> CausalPattern:
    """The self-attention pattern (and, with it, the generation order) of a decoder built
    from ``config``: raster order for 1D and full attention, block-raster order for 2D."""
    attention, order = config.attention, GenerationOrder.for_config(config)
    if attention.kind == "full":
        return FullCausal(order)
    if attention.kind == "local_1d":
        return Local1D(order, attention.query_block_length, attention.memory_blocks)
    return Local2D(order, attention.memory_flange)
