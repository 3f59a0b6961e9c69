"""Orders of generation over the grid (docs/model.md §1).

Categorical models generate the 32×96 grid of sub-pixels (column = 3·pixel column +
channel); DMOL models the 32×32 grid of pixels. 1D local and full attention use
raster order; 2D local attention uses block-raster order (blocks in raster order,
cells inside a block in raster order). The model works on sequences in generation
order; these helpers move between that sequence and the grid.
"""

from __future__ import annotations

import torch
from einops import rearrange

from ..errors import UserError
from .config import ModelConfig


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
