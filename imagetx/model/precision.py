"""The layers that stay in float32 under mixed precision (bf16-mixed): those at the two ends of
the network, where bfloat16's 8-bit mantissa cannot tell neighbouring pixel levels apart.

On the [-1, 1] scale a level is 2/255 ≈ 0.0078 from the next, and bfloat16 resolves steps of
1/128 ≈ 0.0078 near ±1: rounded to it, a pixel's raw value (the DMOL pixel embedding, the cell
remainder input) merges with its neighbours, and so do a DMOL head's means and scales, moving
mass between bins; in float32 both ends keep most of what bfloat16 loses (docs/experiments.md,
entry 15), and their products are tiny next to the network's ((B, T, 3) × (3, d) in,
(B, T, d) × (d, 10·K) out).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
