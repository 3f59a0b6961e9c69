"""Input embeddings and row + column position encodings (docs/model.md §2), and the linear maps at the
network's two ends, kept in float32 under mixed precision (``full_precision_linear``)."""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import CHANNELS, HALF_RANGE, LEVELS


# float32 at the network's two ends (docs/model.md §5): on [-1, 1] neighbouring levels are 2/255 ≈ 0.0078
# apart, and bfloat16 resolves steps of 1/128 ≈ 0.0078 near ±1, so it would merge them.


def scoring_dtype(tensor: Tensor) -> torch.dtype:
    """float32, or the tensor's own dtype where it is wider (a float64 model works in float64)."""
    return torch.promote_types(tensor.dtype, torch.float32)


def full_precision_linear(proj: nn.Linear, x: Tensor) -> Tensor:
    """``proj(x)`` in ``scoring_dtype`` of the weights, with autocast off."""
    dtype = scoring_dtype(proj.weight)
    bias = None if proj.bias is None else proj.bias.to(dtype)
    # (the meta device of FLOP counting has no autocast to turn off)
    with nullcontext() if x.is_meta else torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(dtype), proj.weight.to(dtype), bias)


class SubPixelEmbedding(nn.Module):
    """Values (B, T) with channel ids (T,) -> (B, T, d): row v + 256·c, times √d. ``ordinal=True`` starts
    each channel's rows on the line between two random vectors, so that intensity is readable from the
    first step (docs/model.md §6)."""

    def __init__(self, d_model: int, ordinal: bool = False) -> None:
        super().__init__()
        self.table = nn.Embedding(CHANNELS * LEVELS, d_model)
        # T2T initialises with std d^-½ so that after the √d scale entries are ~unit size.
        nn.init.normal_(self.table.weight, std=d_model**-0.5)
        if ordinal:
            self.make_ordinal()
        self.scale = math.sqrt(d_model)

    @torch.no_grad()
    def make_ordinal(self) -> None:
        """Row v of each channel := lerp(row 0, row 255, v / 255), keeping their random ends."""
        table = self.table.weight.view(CHANNELS, LEVELS, -1)
        fraction = torch.linspace(0.0, 1.0, LEVELS, dtype=table.dtype)[None, :, None]
        table.copy_(table[:, :1] + (table[:, -1:] - table[:, :1]) * fraction)

    def forward(self, values: Tensor, channels: Tensor) -> Tensor:
        return self.table(values.long() + LEVELS * channels) * self.scale


class PixelEmbedding(nn.Module):
    """Pixels (B, T, 3) -> (B, T, d); T2T's 1×3 stride-3 convolution is this linear map."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(CHANNELS, d_model)

    def forward(self, pixels: Tensor, channels: Tensor | None = None) -> Tensor:
        """``channels``: not read (a pixel holds all three), taken as ``SubPixelEmbedding`` takes them."""
        values = pixels.to(scoring_dtype(self.proj.weight)) / HALF_RANGE - 1.0
        return torch.relu(full_precision_linear(self.proj, values))


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """(T,) integer positions -> (T, dim) sin/cos features with geometric frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32) / max(half, 1))
    angles = positions.float()[:, None] * freqs[None, :]
    out = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return nn.functional.pad(out, (0, dim - out.shape[-1]))  # odd dim: one zero column


class PositionEncoding(nn.Module):
    """Row and column encodings for a rows×cols grid, concatenated to d, looked up in tables: learned,
    or sinusoids kept as a buffer, so that one decoding step's position is an index, not a recomputation."""

    def __init__(self, rows: int, cols: int, d_model: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.row_dim = d_model // 2
        self.col_dim = d_model - self.row_dim
        if kind == "learned":
            self.rows = nn.Embedding(rows, self.row_dim)
            self.cols = nn.Embedding(cols, self.col_dim)
            nn.init.normal_(self.rows.weight, std=0.02)
            nn.init.normal_(self.cols.weight, std=0.02)
        else:
            self.register_buffer("row_table", sinusoid(torch.arange(rows), self.row_dim), persistent=False)
            self.register_buffer("col_table", sinusoid(torch.arange(cols), self.col_dim), persistent=False)

    def forward(self, rows: Tensor, cols: Tensor) -> Tensor:
        """(T,) grid rows and columns -> (T, d)."""
        if self.kind == "learned":
            return torch.cat([self.rows(rows), self.cols(cols)], dim=-1)
        return torch.cat([self.row_table[rows], self.col_table[cols]], dim=-1)
