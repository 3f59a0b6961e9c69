"""Local cross-attention's pattern (docs/model.md §6): a super-resolution decoder's attention to
the encoder's output when ``cross_attention_radius`` is set. Each decoder step sees only the
encoder sub-pixels whose low-resolution cell lies within the radius of its own.

An ``AttentionPattern`` like the self-attention ones (``patterns.py``), so the same kernels run
it (``kernels.attend``), and like them its rule is arithmetic on query and key steps: it runs
inside FlexAttention's kernel with nothing to look up. Its dense ``can_attend`` is small (Tq × Tk
with Tk the low-resolution input's sub-pixels, 192 for 8×8): the blocks are read from it, and a
decoding step reads its row (``on_device``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import CHANNELS
from .order import GenerationOrder
from .patterns import AttentionPattern, BlockIndex, MaskRule


class CrossPattern(AttentionPattern):
    """The decoder steps of ``order`` over the encoder's sub-pixels of a ``side`` × ``side``
    low-resolution image (raster order, a pixel's 3 channels adjacent): a query sees the keys
    whose low-resolution cell lies within ``radius`` rows and columns of its own.

    ``scale``: decoder pixels per low-resolution pixel along a side; ``sub_pixels``: whether the
    decoder's columns are sub-pixels (categorical) or pixels (DMOL).

    Its blocks: queries whose rows of ``can_attend`` are equal (the decoder positions over one
    low-resolution cell) form groups of equal size, each over its own gathered keys. With
    radius 0 that is 3 keys per query instead of masking all 192."""

    def __init__(self, order: GenerationOrder, side: int, scale: int, radius: int, sub_pixels: bool) -> None:
        super().__init__(order.length, CHANNELS * side * side)
        self.order, self.side, self.scale, self.radius = order, side, scale, radius
        self.columns_per_pixel = CHANNELS if sub_pixels else 1

    def mask_rule(self) -> MaskRule:
        order, side, scale, radius, per_pixel = self.order, self.side, self.scale, self.radius, self.columns_per_pixel
        last_query, last_key = self.query_length - 1, self.key_length - 1

        def rule(query: Tensor, key: Tensor) -> Tensor:
            # A kernel's last block may ask about steps past the ends; it discards those pairs.
            row, col = order.grid_cell(query.clamp(max=last_query))
            key = key.clamp(max=last_key)
            near_row = (row // scale - key // (CHANNELS * side)).abs() <= radius
            near_col = (col // per_pixel // scale - key // CHANNELS % side).abs() <= radius
            return near_row & near_col

        return rule

    def on_device(self, device: torch.device) -> Tensor:
        """(Tq, Tk) ``can_attend`` on ``device``, whose rows decoding steps read."""
        return self.built.once("can_attend", device, lambda: self.can_attend().to(device))

    def build_blocks(self) -> BlockIndex:
        table = self.can_attend()
        _, set_of_query = torch.unique(table, dim=0, return_inverse=True)
        # Groups of equal size: each set's queries cut into runs of the gcd of the set sizes
        # (sets can differ in size where cells at the edge share a neighbourhood).
        query_order = torch.argsort(set_of_query, stable=True)
        size = math.gcd(*torch.bincount(set_of_query).tolist())
        rows = table[query_order[::size]]  # (groups, Tk): the key set of each group
        n_keys = int(rows.sum(dim=1).max())
        # Each group's allowed keys first (stable sort keeps them in index order), padded
        # with disallowed ones that the mask hides.
        key_index = torch.argsort((~rows).to(torch.int8), dim=1, stable=True)[:, :n_keys]
        allowed = torch.gather(rows, 1, key_index)
        can_attend = allowed[:, None, :].expand(-1, size, -1)
        return BlockIndex(key_index, can_attend, query_order, torch.argsort(query_order),
                          partial=not bool(allowed.all()))

    def describe(self) -> str:
        return f"CrossPattern(radius={self.radius})"
