"""Attention patterns, which keys each query may see (docs/model.md §4), as geometry only, over T steps
in generation order (``GenerationOrder``: raster, or block-raster for 2D). A pattern (``CausalPattern``:
full, 1D and 2D local) states two things: ``mask_rule()``, arithmetic on query and key steps (on any
device, as attention-gym's ``mask_mod``), and ``block_keys()``, the keys of each block of
``block_length`` queries. From those derive the dense (Tq, Tk) mask (``can_attend()``) and the block
keys with the rule's mask over them (``blocks()``), which a model keeps as buffers (``PatternIndex``).
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


# ----- the order of generation over the grid (docs/model.md §1) ---------------------------------------
class GenerationOrder:
    """Raster order (``block=None``) or block-raster order over a rows×cols grid."""

    def __init__(self, rows: int, cols: int, block: tuple[int, int] | None = None) -> None:
        if block is not None and (rows % block[0] or cols % block[1]):
            raise UserError(f"block {block} does not tile the {rows}x{cols} grid")
        self.rows, self.cols, self.block = rows, cols, block
        self.tile = block or (1, cols)  # raster order is block-raster order with blocks one grid row each

    @property
    def length(self) -> int:
        return self.rows * self.cols

    def grid_to_sequence(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, rows, cols, ...) -> (B, T, ...) with T in generation order."""
        qh, qw = self.tile
        return rearrange(grid, "b (nh qh) (nw qw) ... -> b (nh nw qh qw) ...", qh=qh, qw=qw)

    def sequence_to_grid(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) in generation order -> (B, rows, cols, ...)."""
        qh, qw = self.tile
        return rearrange(seq, "b (nh nw qh qw) ... -> b (nh qh) (nw qw) ...", nh=self.rows // qh, qh=qh, qw=qw)

    def grid_cell(self, steps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, col) of the grid cell generated at each of ``steps`` (long, any shape; by default every
        step: two (T,) tensors). Arithmetic, no lookup table, so that it runs on index grids, on 0-d
        indices inside a FlexAttention kernel and on the decoding step counter, on any device."""
        if steps is None:
            steps = torch.arange(self.length)
        qh, qw = self.tile
        block, inside = steps // (qh * qw), steps % (qh * qw)
        blocks_per_row = self.cols // qw
        return block // blocks_per_row * qh + inside // qw, block % blocks_per_row * qw + inside % qw


# (query steps, key steps) -> bool, True where the query may attend to the key; elementwise
# over tensors that broadcast (index grids for the dense matrix, 0-d indices in a mask_mod).
MaskRule = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class BlockIndex:
    """Queries in n blocks of L steps, in order (steps past Tq − 1: end padding), each block over S
    keys: ``key_steps`` (n, S) long, step Tk standing for a zero key (before the sequence, outside the
    grid, end padding); ``can_attend`` (n, L, S) bool, the mask. ``causal``: each block's keys are its
    queries, each seeing those up to itself (SDPA's own causal kernel, no mask to read)."""

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
    """Which earlier steps of ``order`` each step's query may see. Subclasses state the mask rule
    (``mask_rule``) and each query block's keys (``block_keys``); the masks derive from them here."""

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

    def describe(self) -> str:
        return type(self).__name__


class FullCausal(CausalPattern):
    """Every query sees every earlier position and itself: the O(T²) baseline."""

    def __init__(self, order: GenerationOrder) -> None:
        super().__init__(order)
        self.block_length = order.length  # one block: full attention's sparsity is no sparsity

    def mask_rule(self) -> MaskRule:
        return lambda query, key: key <= query

    def block_keys(self) -> Tensor:
        return torch.arange(self.length)[None]


class Local1D(CausalPattern):
    """Query blocks of ``block_length`` steps in raster order (docs/model.md §4, 1D): a query sees the
    previous ``memory_blocks`` blocks and its own up to itself. End padding comes after every real
    step, so causality alone keeps it unseen."""

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
    """Query blocks of qh×qw cells (``order.block``, block-raster) with a memory flange (docs/model.md
    §4, 2D): the block with top-left cell (r0, c0) sees the top flange rows [r0−fh, r0) × cols
    [c0−fw, c0+qw+fw), the left flange rows [r0, r0+qh) × cols [c0−fw, c0), itself causally, and
    no cell outside the grid."""

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
            # A kernel's last block may ask about steps past T − 1. Clamped, such a key is the last
            # cell (bottom right: in no block's flange) and, later than every real query, fails ``own``.
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
        # windows: nh, nw, fh+qh, qw+2fw — the rows and columns of each block's keys.
        steps = self.order.sequence_to_grid(torch.arange(1, self.length + 1)[None])[0]
        windows = F.pad(steps, (fw, fw, fh, 0)).unfold(0, fh + qh, qh).unfold(1, qw + 2 * fw, qw)
        top = rearrange(windows[:, :, :fh, :], "nh nw r c -> (nh nw) (r c)")
        left = rearrange(windows[:, :, fh:, :fw], "nh nw r c -> (nh nw) (r c)")
        own = rearrange(torch.arange(1, self.length + 1), "(n l) -> n l", l=self.block_length)
        return torch.cat([top, left, own], dim=1) - 1

    def describe(self) -> str:
        return f"Local2D(query={self.block}, flange={self.flange})"


# ----- the index a model keeps of its pattern -----------------------------------------------------
def reach(blocks: BlockIndex, length: int) -> int:
    """The longest distance from a query back to a key it sees (at least 1), a block at a time: from its
    last real query to the earliest key any of its queries sees (which the last query sees, in every
    pattern here; elsewhere an overestimate). A kv-cache of reach + 1 steps holds every key a decoding
    step attends to, its own included."""
    longest = 1
    for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
        real = can_attend[queries < length]  # end padding reads nothing
        if bool((real & (keys[None, :] > queries[: real.shape[0], None])).any()):
            raise ValueError("cached decoding needs a causal pattern: a query sees a later key")
        seen = real.any(0)
        if real.shape[0] and bool(seen.any()):
            longest = max(longest, int(queries[real.shape[0] - 1] - keys[seen].min()))
    return longest


class PatternIndex(nn.Module):
    """A pattern's blocks (``CausalPattern.blocks``) as buffers that move with the model, built once and
    shared by every layer, for training, prefill and decoding; the steps a kv-cache holds
    (``cache_length``) and the slots of each block's keys in it (``key_slots``). Given ``flex_block_size``,
    also FlexAttention's block mask in tiles of that size (its buffers ``flex_*``, flex.py)."""

    def __init__(self, pattern: CausalPattern, flex_block_size: int | None = None) -> None:
        super().__init__()
        self.pattern, self.flex_block_size = pattern, flex_block_size
        blocks = pattern.blocks()
        self.causal, self.block_length = blocks.causal, pattern.block_length
        self.register_buffer("key_steps", blocks.key_steps, persistent=False)  # (n, S)
        self.register_buffer("can_attend", blocks.can_attend, persistent=False)  # (n, L, S)
        self.cache_length = reach(blocks, pattern.length) + 1
        self.register_buffer("key_slots", blocks.key_steps % self.cache_length, persistent=False)  # (n, S)
        # A decoding step attends to the whole kv-cache in place unless it holds over twice a block's S
        # keys (2D on wide images), when it gathers those S: a gather copies what it attends to (at
        # C = S, 64 images, a step in place took a quarter of a gathering one's time: entry 41), and
        # the factor 2 bounds a step's keys at twice its block's (a choice, not measured for 2D).
        self.gathers = 2 * blocks.key_steps.shape[1] < self.cache_length
        if flex_block_size is not None:
            from .flex import block_mask_buffers  # flex.py: imported where a model keeps a block mask

            for name, tensor in block_mask_buffers(pattern, flex_block_size).items():
                self.register_buffer(name, tensor, persistent=False)

    @property
    def blocks(self) -> BlockIndex:
        return BlockIndex(self.key_steps, self.can_attend, self.causal)


def pattern_for(config: ModelConfig) -> CausalPattern:
    """The self-attention pattern (and, with it, the generation order) of a decoder built
    from ``config``: raster order for 1D and full attention, block-raster order for 2D."""
    attention = config.attention
    order = GenerationOrder(*config.grid_shape, attention.query_block_shape if attention.kind == "local_2d" else None)
    if attention.kind == "full":
        return FullCausal(order)
    if attention.kind == "local_1d":
        return Local1D(order, attention.query_block_length, attention.memory_blocks)
    return Local2D(order, attention.memory_flange)
