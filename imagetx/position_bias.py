"""Relative position biases for local self-attention (``ModelConfig.relative_position_bias``;
not in the paper, which adds absolute row and column encodings to the inputs only).

Each attention head adds a learned number to the score of every (query, key) pair, looked
up by the pair's offset on the generation grid: (query row − key row, query column − key
column). The offsets a local memory holds are few (a 1D block of two image rows with one
memory block sees keys up to three rows up), and the same offset means the same neighbour
everywhere in the image, so "the pixel above" or "the pixel to the left" gets one score
shared by every position, found from the first training step instead of being learnt
through the absolute position encodings. The table starts as a distance prior (below):
each head begins by looking at a neighbourhood of its own size.

The bias depends only on positions, never on values, so it cannot let a query see a key
its ``can_attend`` hides: it is added before the mask, which still sets hidden keys to −∞.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RelativePositionBias(nn.Module):
    """A (heads, (2·rows − 1)·(2·cols − 1)) table of biases, one per head and grid offset.

    ``bias(offsets)`` takes offset indices (``GenerationOrder.relative_offsets``; each attention
    pattern computes those of its query-key pairs once) of any shape and returns
    (heads, *shape): the score added to each pair.
    """

    def __init__(self, n_heads: int, rows: int, cols: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.table = nn.Parameter(distance_prior(n_heads, rows, cols))

    def forward(self, offsets: Tensor) -> Tensor:
        return self.table[:, offsets]


def distance_prior(n_heads: int, rows: int, cols: int) -> Tensor:
    """(heads, (2·rows − 1)·(2·cols − 1)): −slope·(Euclidean offset length, in grid cells),
    with slopes 1, 1/2, 1/4, ... so head 0 starts on the nearest cells and each later head
    on a neighbourhood about twice as wide (in the spirit of ALiBi's per-head slopes, in 2D).
    A zero table would start every head averaging its whole memory uniformly."""
    row_offsets = torch.arange(-(rows - 1), rows, dtype=torch.float32)[:, None]
    col_offsets = torch.arange(-(cols - 1), cols, dtype=torch.float32)[None, :]
    distance = (row_offsets**2 + col_offsets**2).sqrt().flatten()
    slopes = 2.0 ** -torch.arange(n_heads, dtype=torch.float32)
    return -slopes[:, None] * distance[None, :]
