"""Attention patterns: which keys each query may see (docs/model.md §4), as geometry only;
``attention.attend`` computes attention under them.

One layout throughout: q, k, v are sequence-first (T, N, e), N = batch·heads and e the head
size, in generation order.

One pattern type, ``CausalPattern`` (full, 1D and 2D local), over the steps of a
``GenerationOrder``. A pattern answers:

* ``mask_rule()``: its rule, as arithmetic on query and key steps (``MaskRule``),
  so that it runs on any device. On index grids it gives ``can_attend()``, the dense boolean
  (Tq, Tk) matrix (True = the query, a row, may attend to the key, a column): the reference of
  every test (``dense_attention`` of tests/helpers.py with it defines the right answer). As
  FlexAttention's ``mask_mod`` it gives ``block_mask(device)``, built once per device.
* ``blocks(device)``: its sparsity, built once per device: queries in blocks, each block with
  the steps of its keys and which of them each query may see. The SDPA path and decoding's ring
  buffer (its length, ``ring``, and the steps it attends at once, ``piece``) are read from it, at
  a cost of O(T·(keys per block)), never O(T²). Tests prove each equal to the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from .order import GenerationOrder

# FlexAttention's kernel blocks, queries × keys: powers of two (its tiles), from its CUDA kernel's
# smallest to its default, FLEX_BLOCK_SIZE (128 × 128). Blocks a pattern allows none of are
# skipped, so blocks the size of a one-row query block compute fewer masked pairs; larger blocks
# keep the GPU's matrix units busier. The same numbers for every size.
FLEX_BLOCK_SIZE = 128
FLEX_BLOCK_SIZES = (16, 32, 64, FLEX_BLOCK_SIZE)

Built = TypeVar("Built")
# (query steps, key steps) -> bool, True where the query may attend to the key; elementwise
# over tensors that broadcast (index grids for the dense matrix, 0-d indices in a mask_mod).
MaskRule = Callable[[Tensor, Tensor], Tensor]


def dense_mask(rule: MaskRule, query_length: int, key_length: int) -> Tensor:
    """(Tq, Tk) bool: ``rule`` on every query-key pair, on the CPU (the tests' reference)."""
    return rule(torch.arange(query_length)[:, None], torch.arange(key_length)[None, :])


def build_block_mask(rule: MaskRule, query_length: int, key_length: int, device: torch.device | str,
                     block_size: int = FLEX_BLOCK_SIZE) -> BlockMask:
    """FlexAttention's ``BlockMask`` of ``rule``, broadcast over batch and heads: which kernel
    blocks of ``block_size`` × ``block_size`` pairs to skip, which to run whole, which to mask.
    Kernel blocks the rule allows only in part keep it as their ``mask_mod``, so a pattern finer
    than a kernel block (a one-row 1D block, a narrow 2D flange) stays exact. Hundreds of µs to
    build: a pattern builds it once per device (``block_mask``) and every layer reuses it."""

    def mask_mod(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return rule(query, key)

    return create_block_mask(mask_mod, None, None, query_length, key_length, device=device, BLOCK_SIZE=block_size)


# ----- a pattern's sparsity, built once ------------------------------------------------------

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

    def to(self, device: torch.device) -> "BlockIndex":
        return BlockIndex(self.key_steps.to(device), self.can_attend.to(device), self.causal)


def ring_length(blocks: BlockIndex, length: int) -> int:
    """The fewest slots of a decoding ring (step s in slot s % ring) that still hold the oldest key
    any later query reads: the longest distance from a query back to a key it sees, since a step
    attends over the ring before its own key overwrites a slot (``attention.SelfAttentionCache``).
    Read from the blocks one at a time (the largest tensor one block's, never T²)."""
    ring = 1
    for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
        allowed = can_attend & (queries[:, None] < length) & (keys[None, :] < length)
        query, key = allowed.nonzero(as_tuple=True)
        if bool((keys[key] > queries[query]).any()):
            raise ValueError("cached decoding needs a causal pattern: a query sees a later key")
        if query.numel():
            ring = max(ring, int((queries[query] - keys[key]).max()))
    return ring


class BuiltOnce:
    """What a pattern builds from its geometry alone (its blocks, block mask, decoding ring),
    kept once per device. A pattern holds one as ``self.built``."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, torch.device], object] = {}

    def once(self, what: str, device: torch.device | str, build: Callable[[], Built]) -> Built:
        """``build()`` the first time ``what`` is asked for on ``device``; after that, the same object.

        Traced by ``torch.compile``, ``build`` runs eagerly, outside the graph: it is set-up, done
        once, not a step of every pass (and ``create_block_mask`` cannot be traced). That leaves a
        graph break where it was first asked for; a model run once before it is compiled
        (which builds everything) compiles without one. Run eagerly, ``build`` is called as it
        is: ``torch.compiler.disable`` imports torch._dynamo (~115 MiB resident, ~2 s), which
        eager scoring and sampling never need."""
        key = (what, torch.device(device))
        if key not in self.kept:
            self.kept[key] = torch.compiler.disable(build)() if torch.compiler.is_compiling() else build()
        return self.kept[key]  # type: ignore[return-value]


# ----- the pattern type --------------------------------------------------------------------------

class CausalPattern:
    """Which earlier steps of ``order`` each step's query may see. Subclasses define the rule
    (``mask_rule``) and their blocks (``build_blocks``); the rest derives from them."""

    def __init__(self, order: GenerationOrder, flex_block_size: int = FLEX_BLOCK_SIZE) -> None:
        self.order = order
        self.flex_block_size = flex_block_size  # the block mask's kernel blocks (FLEX_BLOCK_SIZES)
        self.built = BuiltOnce()

    @property
    def length(self) -> int:
        return self.order.length

    def mask_rule(self) -> MaskRule:
        """(query steps, key steps) -> bool, True where the query may attend to the key."""
        raise NotImplementedError

    def can_attend(self) -> Tensor:
        """(T, T) bool, True where the query (row) may attend to the key (column)."""
        return dense_mask(self.mask_rule(), self.length, self.length)

    def build_blocks(self) -> BlockIndex:
        """The pattern's blocks, on the CPU (``blocks`` keeps them, per device)."""
        raise NotImplementedError

    def blocks(self, device: torch.device | str) -> BlockIndex:
        cpu = self.built.once("blocks", "cpu", self.build_blocks)
        return self.built.once("blocks", device, lambda: cpu.to(device))

    def block_mask(self, device: torch.device | str) -> BlockMask:
        """FlexAttention's block mask of the rule, on ``device``."""
        return self.built.once("block_mask", device, lambda: build_block_mask(
            self.mask_rule(), self.length, self.length, device, self.flex_block_size))

    def ring(self) -> int:
        """Slots of the decoding ring (``attention.SelfAttentionCache``)."""
        return self.built.once("ring", "cpu", lambda: ring_length(self.blocks("cpu"), self.length))

    def piece(self) -> int:
        """The most steps a decoding ring attends at once (a prefill runs in pieces): a query
        block, whose keys are the ring's and its own, and at most the ring, so that a piece writes
        distinct slots."""
        return min(self.ring(), self.blocks("cpu").can_attend.shape[1])

    def describe(self) -> str:
        return type(self).__name__


class FullCausal(CausalPattern):
    """Every query sees every earlier position and itself: the O(T²) baseline."""

    def mask_rule(self) -> MaskRule:
        def rule(query: Tensor, key: Tensor) -> Tensor:
            return key <= query

        return rule

    def build_blocks(self) -> BlockIndex:
        # One causal block holding the whole sequence: full attention's sparsity is no sparsity.
        return BlockIndex(torch.arange(self.length)[None], self.can_attend()[None], causal=True)

    def ring(self) -> int:
        return max(1, self.length - 1)  # the last step reads the first

    def piece(self) -> int:
        return self.ring()  # its one block is the sequence: a prefill is O(t²) by the pattern itself


class Local1D(CausalPattern):
    """Query blocks of ``block_length`` steps in raster order (docs/model.md §4, 1D).

    A query sees every position of the previous ``memory_blocks`` blocks and its own block up
    to and including itself. The sequence's end is padded to whole blocks; padding comes after
    every real position, so causality alone keeps it unseen.
    """

    def __init__(self, order: GenerationOrder, block_length: int, memory_blocks: int = 1,
                 flex_block_size: int = FLEX_BLOCK_SIZE) -> None:
        super().__init__(order, flex_block_size)
        self.block_length, self.memory_blocks = block_length, memory_blocks

    def mask_rule(self) -> MaskRule:
        lq, m = self.block_length, self.memory_blocks

        def rule(query: Tensor, key: Tensor) -> Tensor:
            return (key <= query) & (key // lq >= query // lq - m)

        return rule

    def build_blocks(self) -> BlockIndex:
        """Block b's keys: the steps of blocks b−m .. b, (m+1)·lq of them."""
        lq, m = self.block_length, self.memory_blocks
        n_blocks = -(-self.length // lq)
        key_steps = (torch.arange(n_blocks)[:, None] - m) * lq + torch.arange((m + 1) * lq)
        query_steps = torch.arange(n_blocks * lq).view(n_blocks, lq)
        can_attend = (key_steps[:, None, :] >= 0) & (key_steps[:, None, :] <= query_steps[:, :, None])
        key_steps = key_steps.masked_fill((key_steps < 0) | (key_steps >= self.length), self.length)
        return BlockIndex(key_steps, can_attend)

    def describe(self) -> str:
        return f"Local1D(lq={self.block_length}, memory_blocks={self.memory_blocks})"


class Local2D(CausalPattern):
    """Query blocks of qh×qw grid cells with a memory flange (docs/model.md §4, 2D).

    The sequence is in block-raster order (``order.block`` = (qh, qw)). A block with top-left
    cell (r0, c0) sees the top flange rows [r0−fh, r0) × cols [c0−fw, c0+qw+fw), the left
    flange rows [r0, r0+qh) × cols [c0−fw, c0), and itself causally. Cells outside the grid
    are never attended.
    """

    def __init__(self, order: GenerationOrder, flange: tuple[int, int],
                 flex_block_size: int = FLEX_BLOCK_SIZE) -> None:
        if order.block is None:
            raise ValueError("2D local attention needs a block-raster order: GenerationOrder(rows, cols, block)")
        super().__init__(order, flex_block_size)
        self.block, self.flange = tuple(order.block), tuple(flange)

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

    def build_blocks(self) -> BlockIndex:
        """Every block's keys: M flange cells and the L = qh·qw block cells — the top flange
        (raster), the left flange, then the block itself; a cell outside the grid is step T.
        can_attend: inside-the-grid flange cells, and the block's own cells causally."""
        (qh, qw), (fh, fw) = self.block, self.flange
        block_len = qh * qw
        # Step numbers laid on the grid, padded with 0 ("outside") above and either side;
        # windows: nh, nw, fh+qh, qw+2fw — each block's rows and columns of context.
        steps = self.order.sequence_to_grid(torch.arange(1, self.length + 1)[None])[0]
        windows = F.pad(steps, (fw, fw, fh, 0)).unfold(0, fh + qh, qh).unfold(1, qw + 2 * fw, qw)
        top = rearrange(windows[:, :, :fh, :], "nh nw r c -> (nh nw) (r c)")
        left = rearrange(windows[:, :, fh:, :fw], "nh nw r c -> (nh nw) (r c)")
        own = rearrange(torch.arange(1, self.length + 1), "(n l) -> n l", l=block_len)
        key_steps = torch.cat([top, left, own], dim=1) - 1  # -1: outside the grid
        n_blocks, n_memory = top.shape[0], top.shape[1] + left.shape[1]
        causal = torch.ones(block_len, block_len, dtype=torch.bool).tril()
        memory = (key_steps[:, None, :n_memory] >= 0).expand(-1, block_len, -1)
        can_attend = torch.cat([memory, causal.expand(n_blocks, -1, -1)], dim=2)
        return BlockIndex(key_steps.masked_fill(key_steps < 0, self.length), can_attend)

    def describe(self) -> str:
        return f"Local2D(query={self.block}, flange={self.flange})"


def pattern_for(config, flex_block_size: int = FLEX_BLOCK_SIZE) -> CausalPattern:
    """The self-attention pattern (and, with it, the generation order) of a decoder built
    from ``config``: raster order for 1D and full attention, block-raster order for 2D; its
    FlexAttention block mask in blocks of ``flex_block_size``."""
    if not isinstance(flex_block_size, int) or flex_block_size not in FLEX_BLOCK_SIZES:
        raise ValueError(f"flex_block_size {flex_block_size!r} is invalid: choose one of "
                         f"{', '.join(map(str, FLEX_BLOCK_SIZES))}")
    attention, order, tiles = config.attention, GenerationOrder.for_config(config), flex_block_size
    if attention.kind == "full":
        return FullCausal(order, tiles)
    if attention.kind == "local_1d":
        return Local1D(order, attention.query_block_length, attention.memory_blocks, tiles)
    return Local2D(order, attention.memory_flange, tiles)
