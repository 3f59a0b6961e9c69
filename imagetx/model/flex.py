"""FlexAttention (``torch.nn.attention.flex_attention``) for the attention patterns
(docs/model.md §4): one block-sparse kernel for every pattern, with a relative position bias
as a ``score_mod``.

A pattern states its rule once, as a function of query and key step tensors (a ``MaskRule``):
evaluated on broadcast index grids it is the dense ``can_attend`` reference; wrapped as a
``mask_mod`` it decides, inside the kernel, every query-key pair of the blocks that are only
partly allowed. The ``BlockMask`` that ``create_block_mask`` derives from it (which kernel
blocks of 128 × 128 pairs to skip, which to run whole, which to mask) costs hundreds of µs to
build, so each pattern builds it once per device and every layer reuses it.

Which kernel runs is ``ModelConfig.attention_kernel`` (``uses_flex``): ``auto`` is flex on
CUDA and the gathered-block SDPA path elsewhere, because FlexAttention on the CPU (torch 2.15)
has a compiled forward but no backward: it raises for inputs that require a gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .config import ATTENTION_KERNELS
from .position_bias import distance_bias

# (query steps, key steps) -> bool, True where the query may attend to the key; elementwise
# over tensors that broadcast (index grids for the dense matrix, 0-d indices in a mask_mod).
MaskRule = Callable[[Tensor, Tensor], Tensor]
# (query steps, key steps) -> offset indices into a RelativePositionBias table
# (GenerationOrder.relative_offsets), or -> (row offsets, column offsets) (grid_offsets).
OffsetRule = Callable[[Tensor, Tensor], Tensor]
GridOffsetRule = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
# FlexAttention's (score, batch, head, query, key) -> the score to use.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def uses_flex(kernel: str, device: torch.device) -> bool:
    """Whether ``kernel`` (one of ``ATTENTION_KERNELS``) runs FlexAttention on ``device``."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r} is unknown: choose one of {', '.join(ATTENTION_KERNELS)}")
    return kernel == "flex" or (kernel == "auto" and device.type == "cuda")


def dense_mask(rule: MaskRule, query_length: int, key_length: int) -> Tensor:
    """(Tq, Tk) bool: ``rule`` on every query-key pair, on the CPU (the tests' reference)."""
    return rule(torch.arange(query_length)[:, None], torch.arange(key_length)[None, :])


def build_block_mask(rule: MaskRule, query_length: int, key_length: int, device: torch.device | str) -> BlockMask:
    """The ``BlockMask`` of ``rule``, broadcast over batch and heads. Kernel blocks the rule
    allows only in part keep it as their ``mask_mod``, so a pattern finer than a kernel block
    (a one-row 1D block, a narrow 2D flange) stays exact."""

    def mask_mod(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return rule(query, key)

    return create_block_mask(mask_mod, None, None, query_length, key_length, device=device)


def table_score_mod(table: Tensor, offsets: OffsetRule) -> ScoreMod:
    """A ``score_mod`` adding head h's learned relative position bias, ``table[h, offsets(q, k)]``,
    to each score (``RelativePositionBias``: the table is (heads, offset_count)). The kernel reads
    the captured table, and its backward sums every score's gradient into it."""

    def score_mod(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return score + table[head, offsets(query, key)]

    return score_mod


def distance_score_mod(offsets: GridOffsetRule) -> ScoreMod:
    """A ``score_mod`` adding the fixed distance bias (``position_bias.distance_bias``) computed
    from the query and key indices alone: no captured tensor, nothing to differentiate."""

    def score_mod(score: Tensor, batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return score + distance_bias(head, *offsets(query, key))

    return score_mod


@functools.cache
def compiled_flex_attention():
    """``flex_attention`` compiled, once per process: uncompiled it computes every score
    densely (and warns), which defeats the point. Shapes are static: each new (batch, length)
    compiles once more, and the CPU kernel that dynamic shapes generate does not build in
    torch 2.15 (a C++ compile error: an undeclared ``cur_qSplitSize``)."""
    return torch.compile(flex_attention, dynamic=False)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, score_mod: ScoreMod | None = None,
                n_heads: int = 1) -> Tensor:
    """q (Tq, N, e), k and v (Tk, N, e) -> (Tq, N, e) under ``block_mask`` (and ``score_mod``).

    N = batch·``n_heads``: heads are split out of N so that a ``score_mod`` reads each one's
    index; without one (n_heads 1) the N images·heads are the kernel's batch. Copied contiguous:
    in a compiled model, Inductor's CPU lowering rejects views of a graph's inputs (torch 2.15),
    and the copy is small next to the attention."""
    q, k, v = (rearrange(t, "t (b h) e -> b h t e", h=n_heads).contiguous() for t in (q, k, v))
    # Inside a compiled model the model's compilation builds the kernel.
    kernel = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
    out = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask)
    return rearrange(out, "b h t e -> t (b h) e")
