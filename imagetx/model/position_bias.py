"""Relative position biases for local self-attention (``ModelConfig.relative_positions``
"table", "distance" and "rotary_distance"; not in the paper, which adds absolute row and column
encodings to the inputs only).

Each attention head adds a number to the score of every (query, key) pair, set by the pair's
offset on the generation grid: (query row − key row, query column − key column). The offsets a
local memory holds are few (a 1D block of two image rows with one memory block sees keys up to
three rows up), and the same offset means the same neighbour everywhere in the image, so "the
pixel above" or "the pixel to the left" gets one score shared by every position, there from the
first training step instead of being learnt through the absolute position encodings.

Two kinds, one starting point, the distance prior (``distance_bias``): each head begins by
looking at a neighbourhood of its own size.

* learned ("table"): a table of one entry per head and offset, trained from the prior;
* fixed ("distance", "rotary_distance"): the prior itself, nothing learned. FlexAttention then
  computes it from the step indices inside the kernel (``kernels.score_mod``): no tensor read,
  no gradient accumulated per score, which inside the kernel is slow.

The bias depends only on positions, never on values, so it cannot let a query see a key its
``can_attend`` hides: it is added before the mask, which still sets hidden keys to −∞.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def distance_bias(head: Tensor, row_offset: Tensor, col_offset: Tensor) -> Tensor:
    """−slope·(Euclidean length of the offset, in grid cells), with head h's slope 2^−h: head 0
    on the nearest cells and each later head on a neighbourhood about twice as wide (in the
    spirit of ALiBi's per-head slopes, in 2D). Integer tensors that broadcast -> float32; the
    same arithmetic builds the table's prior and runs inside a FlexAttention ``score_mod``."""
    distance = (row_offset * row_offset + col_offset * col_offset).to(torch.float32).sqrt()
    return -torch.exp2(-head.to(torch.float32)) * distance


class RelativePositionBias(nn.Module):
    """A (heads, (2·rows − 1)·(2·cols − 1)) table of biases, one per head and grid offset:
    a parameter starting from the distance prior (``learned``), or the prior as a fixed buffer.

    ``bias(offsets)`` takes offset indices (``GenerationOrder.relative_offsets``; each attention
    pattern computes those of its query-key pairs once) of any shape and returns
    (heads, *shape): the score added to each pair.
    """

    def __init__(self, n_heads: int, rows: int, cols: int, learned: bool = True) -> None:
        super().__init__()
        self.n_heads, self.learned = n_heads, learned
        prior = distance_prior(n_heads, rows, cols)
        if learned:
            self.table = nn.Parameter(prior)
        else:  # not in the state dict: the code computes it
            self.register_buffer("table", prior, persistent=False)

    def forward(self, offsets: Tensor) -> Tensor:
        return self.table[:, offsets]


def distance_prior(n_heads: int, rows: int, cols: int) -> Tensor:
    """(heads, (2·rows − 1)·(2·cols − 1)): ``distance_bias`` of every offset, in the layout of
    ``GenerationOrder.relative_offsets``. A zero table would start every head averaging its
    whole memory uniformly."""
    row_offsets = torch.arange(-(rows - 1), rows)[:, None]
    col_offsets = torch.arange(-(cols - 1), cols)[None, :]
    heads = torch.arange(n_heads)[:, None, None]
    return distance_bias(heads, row_offsets, col_offsets).flatten(1)
