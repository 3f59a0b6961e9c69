"""FlexAttention (docs/model.md §4, "Kernels"): the optional block-sparse kernel of decoder
self-attention, beside the SDPA path of ``attention.attend``, which imports this module only where
it runs FlexAttention (``attention.uses_flex``), and ``PatternIndex`` only where a model keeps its
block mask: the decoder's own modules never import it, nor FlexAttention's (which brings sympy).

A pattern's rule (``CausalPattern.mask_rule``) is FlexAttention's ``mask_mod``; ``create_block_mask``
evaluates it once, with the model, on the CPU (it cannot be traced), and the model keeps the
block mask's tensors as buffers (``PatternIndex``), from which each pass rebuilds the
``BlockMask``, its ``mask_mod`` derived again from the pattern, inside a compiled graph too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..compat import flex_tiles
from .attention import FLEX_BLOCK_SIZE
from .patterns import CausalPattern, MaskRule, PatternIndex

if TYPE_CHECKING:  # FlexAttention's module is imported where it runs: it brings sympy (~0.5 s) into a process
    from torch.nn.attention.flex_attention import BlockMask

# FlexAttention's ``BlockMask`` as its tensors (``PatternIndex``' buffers ``flex_NAME``, which move with
# the model) and the arguments of its public constructor that rebuild it from them, at no cost.
BLOCK_MASK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                      "q_indices", "full_q_num_blocks", "full_q_indices")


def flex_mask_mod(rule: MaskRule) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """``rule`` as FlexAttention's ``mask_mod``: (batch, head, query, key) -> bool, the same for
    every image and head."""

    def mask_mod(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return rule(query, key)

    return mask_mod


def build_block_mask(pattern: CausalPattern, block_size: int, device: torch.device | str = "cpu") -> BlockMask:
    """FlexAttention's ``BlockMask`` of ``pattern``'s rule on ``device``, broadcast over batch and
    heads: which kernel blocks of ``block_size`` × ``block_size`` pairs to skip, which to run whole,
    which to mask. Kernel blocks the rule allows only in part keep it as their ``mask_mod``, so a
    pattern finer than a kernel block (a one-row 1D block, a narrow 2D flange) stays exact."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(flex_mask_mod(pattern.mask_rule()), None, None, pattern.length, pattern.length,
                             device=device, BLOCK_SIZE=block_size)


def block_mask_buffers(pattern: CausalPattern, block_size: int) -> dict[str, Tensor]:
    """The tensors of ``pattern``'s block mask, by the names ``PatternIndex`` keeps them under."""
    mask = build_block_mask(pattern, block_size)
    return {f"flex_{name}": getattr(mask, name) for name in BLOCK_MASK_TENSORS}


def block_mask(index: PatternIndex) -> BlockMask:
    """The ``BlockMask`` a model keeps (``index``' buffers; the pattern's rule), on its device."""
    if index.flex_block_size is None:
        raise RuntimeError("this model keeps no FlexAttention block mask: it was built for the SDPA path "
                           "(kernel 'sdpa', or 'auto' without CUDA); build it with kernel 'flex' to run "
                           "FlexAttention")
    from torch.nn.attention.flex_attention import BlockMask

    tensors = {name: getattr(index, f"flex_{name}") for name in BLOCK_MASK_TENSORS}
    length, size = index.pattern.length, index.flex_block_size
    return BlockMask(seq_lengths=(length, length), **tensors, BLOCK_SIZE=(size, size),
                     mask_mod=flex_mask_mod(index.pattern.mask_rule()))


@functools.cache
def compiled_flex_attention():
    """``flex_attention`` compiled, once per process: uncompiled it computes every score densely
    (and warns), which defeats the point. Shapes are static: each new (batch, length) compiles
    once more, and the CPU kernel that dynamic shapes generate does not build (a C++ compile
    error: an undeclared ``cur_qSplitSize``)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def tile_options(mask: BlockMask, device: torch.device) -> dict | None:
    """The CUDA kernel's tiles for a block mask finer than its default tiles: one tile per block,
    pinned, since its tiles must divide the mask's blocks and a default tile larger than a block
    is refused; None (the kernel's own choice) otherwise."""
    q_block, kv_block = mask.BLOCK_SIZE
    if device.type != "cuda" or min(q_block, kv_block) >= FLEX_BLOCK_SIZE:
        return None
    # forward: M queries × N keys; backward: dK/dV over N1 keys by M1 queries, dQ over M2 queries
    # by N2 keys, where the kernel needs N1 a multiple of M1 and M2 a multiple of N2
    both = min(q_block, kv_block)
    return flex_tiles(forward=(q_block, kv_block), backward_kv=(both, kv_block), backward_q=(q_block, both))


def flex_attend(q: Tensor, k: Tensor, v: Tensor, index: PatternIndex) -> Tensor:
    """q (B, h, Tq, e), k and v (B, h, Tk, e) -> (B, h, Tq, e) under the block mask ``index`` keeps
    (one for every image and head). Copied contiguous: in a compiled model, Inductor's CPU
    lowering rejects views of a graph's inputs, and the copy is small next to the attention."""
    q, k, v = (t.contiguous() for t in (q, k, v))
    from torch.nn.attention.flex_attention import flex_attention

    mask = block_mask(index)
    # Inside a compiled model the model's compilation builds the kernel.
    kernel = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
    return kernel(q, k, v, block_mask=mask, kernel_options=tile_options(mask, q.device))
