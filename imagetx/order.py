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

from .config import CHANNELS, ModelConfig


class GenerationOrder:
    """Raster order (``block=None``) or block-raster order over a rows×cols grid."""

    def __init__(self, rows: int, cols: int, block: tuple[int, int] | None = None) -> None:
        if block is not None and (rows % block[0] or cols % block[1]):
            raise ValueError(f"block {block} does not tile the {rows}x{cols} grid")
        self.rows, self.cols, self.block = rows, cols, block
        self.cells_on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # cell_of_step() per device

    @classmethod
    def for_config(cls, config: ModelConfig) -> "GenerationOrder":
        rows, cols = config.grid_shape
        return cls(rows, cols, config.query_block_shape if config.attention == "local_2d" else None)

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

    def cell_of_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, col) of the grid cell generated at each step: two (T,) long tensors."""
        rows = torch.arange(self.rows).view(1, -1, 1).expand(1, self.rows, self.cols)
        cols = torch.arange(self.cols).view(1, 1, -1).expand(1, self.rows, self.cols)
        # contiguous: a one-row grid would otherwise give stride-0 views, which compiled kernels
        # (FlexAttention's captured lookups) do not take
        return self.grid_to_sequence(rows)[0].contiguous(), self.grid_to_sequence(cols)[0].contiguous()

    @property
    def offset_count(self) -> int:
        """Distinct (row, column) offsets between two cells: (2·rows − 1)·(2·cols − 1)."""
        return (2 * self.rows - 1) * (2 * self.cols - 1)

    def relative_offsets(self, query_steps: torch.Tensor, key_steps: torch.Tensor) -> torch.Tensor:
        """The grid offset (query row − key row, query col − key col) of each pair of steps, as
        one index in 0..offset_count−1 (row-major over the offsets), broadcast over the steps'
        shapes. Steps outside 0..T−1 (padding, cells outside the grid, ring slots not yet
        written) are clamped to a real step: the callers mask those pairs anyway."""
        device = query_steps.device
        if device not in self.cells_on:
            self.cells_on[device] = tuple(cell.to(device) for cell in self.cell_of_step())
        rows, cols = self.cells_on[device]
        last = self.length - 1
        query_steps, key_steps = query_steps.clamp(0, last), key_steps.clamp(0, last)
        row_offset = rows[query_steps] - rows[key_steps] + self.rows - 1
        col_offset = cols[query_steps] - cols[key_steps] + self.cols - 1
        return row_offset * (2 * self.cols - 1) + col_offset


def images_to_grid(images: torch.Tensor, head: str) -> torch.Tensor:
    """uint8/long images (B, H, W, 3) -> grid (B, H, 3W) of sub-pixels, or (B, H, W, 3) for DMOL."""
    if head == "categorical":
        return rearrange(images, "b h w c -> b h (w c)")
    return images


def grid_to_images(grid: torch.Tensor, head: str) -> torch.Tensor:
    if head == "categorical":
        return rearrange(grid, "b h (w c) -> b h w c", c=CHANNELS)
    return grid


def images_to_sequence(images: torch.Tensor, order: GenerationOrder, head: str) -> torch.Tensor:
    """(B, H, W, 3) -> (B, T) sub-pixel values (categorical) or (B, T, 3) pixels (DMOL)."""
    return order.grid_to_sequence(images_to_grid(images, head))


def sequence_to_images(seq: torch.Tensor, order: GenerationOrder, head: str) -> torch.Tensor:
    return grid_to_images(order.sequence_to_grid(seq), head)
