"""Attention patterns: which keys each query may see (docs/model.md §4), as geometry only;
``attention.attend`` computes attention under them.

One layout throughout: q, k, v are (B, h, T, e), e the head size, the T steps in generation
order.

One pattern type, ``CausalPattern`` (full, 1D and 2D local), over the steps of a
``GenerationOrder`` (raster or block-raster order over the grid, first below). Each pattern
states two things:

* ``mask_rule()``: which keys a query may see, as arithmetic on query and key steps
  (``MaskRule``), so that it runs on any device;
* ``block_keys()``: where its queries look: queries in blocks of ``block_length`` steps, each
  block with the steps of the keys its queries may read (a superset of what the rule allows).

Every form the kernels and decoding read derives from those two, here (tests prove each equal to
the dense matrix):

* ``can_attend()``: the rule on index grids, the dense boolean (Tq, Tk) matrix (True = the query,
  a row, may attend to the key, a column): the reference of every test (``dense_attention`` of
  tests/helpers.py with it defines the right answer);
* ``blocks()``: the block keys, each with which of its queries the rule lets see it
  (``BlockIndex``): the SDPA path's gather, O(T·(keys per block)), never O(T²);
* ``ring()`` and ``step_masks(ring)``: decoding's ring buffer, read from the blocks, and each
  decoding step's mask over it.

A model builds those it reads once, with itself (``PatternForms``: buffers, on its device), and
FlexAttention's block mask, where it may run that kernel, from the rule (flex.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .config import ModelConfig

# ----- the order of generation --------------------------------------------------------------------
#
# Orders of generation over the grid (docs/model.md §1).
#
# Categorical models generate the 32×96 grid of sub-pixels (column = 3·pixel column +
# channel); DMOL models the 32×32 grid of pixels. 1D local and full attention use
# raster order; 2D local attention uses block-raster order (blocks in raster order,
# cells inside a block in raster order). The model works on sequences in generation
# order; these helpers move between that sequence and the grid.


class GenerationOrder:
    """Raster order (``block=None``) or block-raster order over a rows×cols grid."""

    def __init__(self, rows: int, cols: int, block: tuple[int, int] | None = None) -> None:
        if block is not None and (rows % block[0] or cols % block[1]):
            raise UserError(f"block {block} does not tile the {rows}x{cols} grid")
        self.rows, self.cols, self.block = rows, cols, block

    @classmethod
    def for_config(cls, config: ModelConfig) -> "GenerationOrder":
        rows, cols = config.grid_shape
        return cls(rows, cols, config.attention.query_block_shape if config.attention.kind == "local_2d" else None)

    @property
    def length(self) -> int:
        return self.rows * self.cols

    def grid_to_sequence(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, rows, cols, ...) -> (B, T, ...) with T in generation order."""
        if self.block is None:
            return rearrange(grid, "b r c ... -> b (r c) ...")
        qh, qw = self.block
        return rearrange(grid, "b (nh qh) (nw qw) ... -> b (nh nw qh qw) ...", qh=qh, qw=qw)

    def sequence_to_grid(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) in generation order -> (B, rows, cols, ...)."""
        if self.block is None:
            return rearrange(seq, "b (r c) ... -> b r c ...", r=self.rows)
        qh, qw = self.block
        return rearrange(seq, "b (nh nw qh qw) ... -> b (nh qh) (nw qw) ...",
                         nh=self.rows // qh, qh=qh, qw=qw)

    def grid_cell(self, steps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, col) of the grid cell generated at each of ``steps`` (long, any shape, any
        device; by default every step: two (T,) tensors). Arithmetic on the step numbers, no
        lookup table: the same code runs on index grids, on 0-d indices inside a FlexAttention
        kernel and on the decoding step counter, on any device."""
        if steps is None:
            steps = torch.arange(self.length)
        if self.block is None:
            return steps // self.cols, steps % self.cols
        qh, qw = self.block
        block, inside = steps // (qh * qw), steps % (qh * qw)
        blocks_per_row = self.cols // qw
        return block // blocks_per_row * qh + inside // qw, block % blocks_per_row * qw + inside % qw


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


# ----- the pattern type --------------------------------------------------------------------------

class CausalPattern:
    """Which earlier steps of ``order`` each step's query may see. Subclasses state the rule
    (``mask_rule``) and where each block of ``block_length`` queries looks (``block_keys``);
    every other form derives from them here (``PatternForms`` builds those a model reads, once)."""

    block_length: int  # queries per block of ``block_keys``

    def __init__(self, order: GenerationOrder) -> None:
        self.order = order

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

    def blocks(self) -> BlockIndex:
        """The block keys and which of them each query sees, by the rule (keys outside the
        sequence: step T, seen by none)."""
        keys, length = self.block_keys(), self.length
        queries = torch.arange(keys.shape[0] * self.block_length).view(keys.shape[0], self.block_length)
        inside = (keys >= 0) & (keys < length)
        can_attend = self.mask_rule()(queries[:, :, None], keys.clamp(0, length - 1)[:, None, :]) & inside[:, None, :]
        # One block whose keys are its queries, each seeing those up to itself: SDPA's causal kernel.
        causal = keys.shape == queries.shape and torch.equal(keys, queries) and \
            torch.equal(can_attend, can_attend.new_ones(can_attend.shape[1:]).tril().expand_as(can_attend))
        return BlockIndex(keys.masked_fill(~inside, length), can_attend, causal)

    def ring(self, blocks: BlockIndex | None = None) -> int:
        """Slots of a decoding ring (``attention.SelfAttentionCache``): the fewest that still hold
        the oldest key any later query reads, the longest distance from a query back to a key it
        sees (a step attends over the ring before its own key overwrites a slot). Read from the
        blocks (``blocks()``, or those given) one at a time: for each, from its last query back to
        its earliest key one of its queries sees (the last query sees all of them, in every
        pattern here; elsewhere a ring a little longer than needed)."""
        blocks, ring = blocks or self.blocks(), 1
        for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
            real = can_attend[queries < self.length]  # end padding reads nothing
            if bool((real & (keys[None, :] > queries[: real.shape[0], None])).any()):
                raise ValueError("cached decoding needs a causal pattern: a query sees a later key")
            seen = real.any(0)
            if real.shape[0] and bool(seen.any()):
                ring = max(ring, int(queries[real.shape[0] - 1] - keys[seen].min()))
        return ring

    def step_masks(self, ring: int, blocks: BlockIndex | None = None) -> Tensor:
        """(T, ring + 1) bool: which keys step s sees when the steps before it went through a
        decoding ring of ``ring`` slots in order: slot j holds the latest step before s that is j
        modulo the ring (none yet: unseen), the last column is s itself. One decoding step's mask
        is a row of it, read in one look-up instead of the rule's arithmetic. Read from the blocks
        (``blocks()``, or those given), a query block at a time: a step sees a key where its block
        lists the key and lets the step see it (every key the rule allows is listed)."""
        blocks, length = blocks or self.blocks(), self.length
        n_keys = blocks.key_steps.shape[1]
        masks = []
        for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
            steps = queries[queries < length][:, None]  # (l, 1): the block's real queries
            held = steps - 1 - (steps - 1 - torch.arange(ring)) % ring  # (l, ring); negative: no step yet
            wanted = torch.cat([held.masked_fill(held < 0, length), steps], dim=1)  # step T: no key
            column = torch.full((length + 1,), n_keys, dtype=torch.long)  # each step's column in the
            column[keys] = torch.arange(n_keys)  # block's keys; column S (all False): not listed
            column[length] = n_keys
            sees = F.pad(can_attend[: steps.shape[0]], (0, 1))  # (l, S + 1)
            masks.append(sees.gather(1, column[wanted]))
        return torch.cat(masks)

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


# ----- what a model keeps of its pattern ---------------------------------------------------------

class PatternForms(nn.Module):
    """What attention reads of ``pattern``, built here, once, when the model is: buffers, which move
    with it (``model.to``), one set for every layer of a decoder (as the rotary angles are). Three
    forms:

    * the rule (``rule``): which keys a query may see, as arithmetic on steps (the tests' dense
      reference is this rule on index grids, ``CausalPattern.can_attend``);
    * the training form: the gathered blocks (``blocks``, the SDPA path) and, given
      ``flex_block_size``, FlexAttention's block mask in kernel blocks of that size (its tensors
      ``flex_*`` and ``mask_mod``, which ``flex.block_mask`` reads); the kernel that reads one or the other is chosen by the device a pass runs
      on (``attention.uses_flex``), so a model that may run either keeps both;
    * the decoding form: the ring's size (``ring``, ``piece``), each single step's mask over it
      (``step_masks``), and the keys each query block reads (``key_steps``: a prefill piece's).
    """

    def __init__(self, pattern: CausalPattern, flex_block_size: int | None = None) -> None:
        super().__init__()
        self.pattern, self.flex_block_size = pattern, flex_block_size
        self.derive_closures()
        blocks = pattern.blocks()
        self.causal = blocks.causal
        self.register_buffer("key_steps", blocks.key_steps, persistent=False)  # (n, S)
        self.register_buffer("block_can_attend", blocks.can_attend, persistent=False)  # (n, L, S)
        self.ring = pattern.ring(blocks)
        # The most steps a ring attends at once (a prefill runs in pieces): within one query block,
        # whose keys are the ring's and its own, and at most the ring, so that a piece writes
        # distinct slots.
        self.piece = min(self.ring, pattern.block_length)
        self.register_buffer("step_masks", pattern.step_masks(self.ring, blocks), persistent=False)  # (T, ring + 1)
        if flex_block_size is not None:  # FlexAttention's block mask (flex.py: imported where a model keeps one)
            from .flex import block_mask_buffers

            for name, tensor in block_mask_buffers(pattern, flex_block_size).items():
                self.register_buffer(name, tensor, persistent=False)

    def derive_closures(self) -> None:
        """The rule and, where the block mask is kept, its ``mask_mod``, from the pattern: closures,
        which pickle cannot write, so a pickled model (torch.save of the module, a spawned process's
        copy) keeps the pattern and derives them again here, as its constructor did."""
        self.rule, self.mask_mod = self.pattern.mask_rule(), None
        if self.flex_block_size is not None:
            from .flex import flex_mask_mod

            self.mask_mod = flex_mask_mod(self.rule)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["rule"], state["mask_mod"]
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.derive_closures()

    @property
    def blocks(self) -> BlockIndex:
        """The gathered blocks, on the model's device."""
        return BlockIndex(self.key_steps, self.block_can_attend, self.causal)


def pattern_for(config) -> CausalPattern:
    """The self-attention pattern (and, with it, the generation order) of a decoder built
    from ``config``: raster order for 1D and full attention, block-raster order for 2D."""
    attention, order = config.attention, GenerationOrder.for_config(config)
    if attention.kind == "full":
        return FullCausal(order)
    if attention.kind == "local_1d":
        return Local1D(order, attention.query_block_length, attention.memory_blocks)
    return Local2D(order, attention.memory_flange)
