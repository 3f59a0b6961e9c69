"""2D rotary position embeddings of queries and keys (``ModelConfig.attention.relative_positions``
"rotary"; not in the paper).

RoPE (Su et al. 2021) turns each pair of a head's dimensions by an angle proportional to the
position, in queries and keys alike, so that q·k depends on positions only through their
difference. On the generation grid (axial 2D RoPE, as in Heo et al. 2024 for vision
transformers) half of the pairs turn with the grid row, half with the grid column:

    angle(step, i) = row(step)·ω_i  for the first e/4 pairs,  col(step)·ω_i  for the others,
    ω_i = ROTARY_BASE^(−i / (e/4)),  i = 0 .. e/4 − 1.

The scores then carry the (row, column) offset of every pair, learnt through the projections,
with no bias term, no table and nothing inside the attention kernel: every path of
``attention.attend`` (the pattern's gathered blocks through SDPA, FlexAttention, the decoding
ring's masked SDPA) runs as it does without positions. A categorical model's columns are
sub-pixel columns (3·pixel column + channel).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .order import GenerationOrder

# The slowest frequency is ROTARY_BASE^−(1 − 1/n) radians per cell (n = e/4 frequencies per
# axis): for heads of 32 (n = 8) a wavelength of 2π·100^(7/8) ≈ 350 cells, longer than twice the
# widest grid (96 sub-pixel columns), so no two offsets of a grid look alike on every frequency;
# the fastest, 1 radian per cell, tells neighbours apart. 100 is Heo et al.'s axial base for
# image grids (10,000, the text default, spends most frequencies on distances no grid has).
ROTARY_BASE = 100.0


class Rotary2D(nn.Module):
    """Turns (B, h, t, e) queries or keys of the given steps by their grid rows and columns."""

    def __init__(self, head_dim: int, order: GenerationOrder) -> None:
        super().__init__()
        n = head_dim // 4
        frequencies = ROTARY_BASE ** (-torch.arange(n, dtype=torch.float64) / n)
        rows, cols = order.grid_cell()
        angles = torch.cat([rows[:, None] * frequencies, cols[:, None] * frequencies], dim=1)  # (T, e/2)
        # Kept in float64, so that a float64 model turns by exact angles; ``forward`` rounds them
        # to the precision it turns in. ``model.float()`` would round them once, as it should.
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T, e/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def angles(self, steps: Tensor | slice, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The cosines and sines (t, e/2) of ``steps``' angles, to turn tensors of ``dtype`` by
        (``rotate``): in float32 at least, so that bf16 queries and keys (mixed precision) are
        rounded once, after the rotation, not at each product."""
        dtype = torch.promote_types(dtype, torch.float32)
        return self.cos[steps].to(dtype), self.sin[steps].to(dtype)

    def forward(self, x: Tensor, steps: Tensor | slice = slice(None)) -> Tensor:
        """x (B, h, t, e) of ``steps`` (all T by default, or the decoding step's (1,) index) -> x turned."""
        return rotate(x, *self.angles(steps, x.dtype))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., t, e) turned by the angles of ``Rotary2D.angles``: dimension i pairs with i + e/2."""
    first, second = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)
