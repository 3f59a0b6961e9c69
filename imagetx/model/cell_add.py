"""The cell add (docs/model.md §6): a cheaper reading of the super-resolution encoder than
cross-attention, chosen with ``ModelConfig.low_res_reading = "cell_add"``. Not in the paper.

In each decoder layer, after self-attention, every step gets a linear map of the encoder's
outputs for the 3 sub-pixels of the low-resolution pixel it lies in. That is what radius-0
cross-attention reads, without the query's choice of weights among the 3: the map runs once
per low-resolution pixel (64 of them for 8×8) and is gathered for the steps, where
cross-attention projects a query and an output for every step.

Decoding one step at a time, ``start_decoding`` maps every low-resolution pixel once and each
step gathers its own (a prefill, the first t steps at once, gathers theirs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .config import CHANNELS


@dataclass
class CellAddCache:
    """(B, h·w, d) every low-resolution pixel's mapped encoding."""

    mapped: Tensor


class CellAdd(nn.Module):
    """Encoder output (B, 3·h·w, d) -> (B, T, d): per step, a linear map of its low-res pixel's
    3 sub-pixel encodings."""

    def __init__(self, d_model: int, low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel (raster index) each decoder step lies in."""
        super().__init__()
        self.proj = nn.Linear(CHANNELS * d_model, d_model)
        self.register_buffer("low_res_pixel_of_step", low_res_pixel_of_step, persistent=False)

    def map_cells(self, context: Tensor) -> Tensor:
        """(B, 3·h·w, d) -> (B, h·w, d). The encoder's sub-pixels are in raster order, a
        pixel's 3 channels adjacent (``Encoder.order``): one row of 3·d per low-res pixel."""
        return self.proj(rearrange(context, "b (p c) d -> b p (c d)", c=CHANNELS))

    def start_decoding(self, context: Tensor) -> CellAddCache:
        return CellAddCache(self.map_cells(context))

    def forward(self, context: Tensor | None = None, cache: CellAddCache | None = None, start: Tensor | int = 0,
                count: int | None = None) -> Tensor:
        """(B, t, d): each of ``count`` steps from ``start`` (by default every step) its low-res
        pixel's mapped encoding, from ``context`` or, decoding, from ``cache``."""
        mapped = self.map_cells(context) if cache is None else cache.mapped
        count = self.low_res_pixel_of_step.numel() if count is None else count
        steps = start + torch.arange(count, device=mapped.device)
        return mapped.index_select(1, self.low_res_pixel_of_step[steps])
