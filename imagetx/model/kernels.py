"""The attention kernels (docs/model.md §4): one entry, ``attend``, for every attention a full
pass computes (self-attention under a pattern, local or global cross-attention, the encoder's
unmasked attention), and the two of decoding (``attend_prefix``, ``attend_slots``).

One layout throughout: q, k, v sequence-first (T, N, e), N = batch·heads, e the head size.
Patterns (``patterns.py``, ``cross_pattern.py``) are geometry only; which kernel computes the
attention they allow is decided here, once:

* FlexAttention (``ModelConfig.attention_kernel`` flex, or auto on CUDA: ``uses_flex``): the
  pattern's block mask. ``auto`` is the gathered-block SDPA path elsewhere, because FlexAttention
  on the CPU has a compiled forward but no backward: it raises for inputs that require a
  gradient; and on CUDA for heads narrower than ``FLEX_MIN_HEAD_SIZE``, which its compiled CUDA
  kernel refuses.
* SDPA: full causal attention in one causal call; 1D local attention on views of windows
  (``attend_windows``); 2D local attention and local cross-attention on the pattern's gathered
  blocks (``attend_in_blocks``). ``pairs_computed`` counts what each of these computes (FLOPs, §8).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .config import ATTENTION_KERNELS, FLEX_BLOCK_SIZE
from .patterns import AttentionPattern, BlockIndex, CausalPattern, FullCausal, Local1D

# FlexAttention's compiled CUDA kernel (Inductor's lowering) refuses heads of fewer channels: "NYI:
# embedding dimension of the query, key, and value must be at least 16". Its CPU kernel takes them.
FLEX_MIN_HEAD_SIZE = 16


def uses_flex(kernel: str, device: torch.device, head_size: int) -> bool:
    """Whether ``kernel`` (one of ``ATTENTION_KERNELS``) runs FlexAttention on ``device`` for heads of
    ``head_size`` channels. ``flex`` asked for where it cannot run raises, naming the way out."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r} is unknown: choose one of {', '.join(ATTENTION_KERNELS)}")
    narrow = device.type == "cuda" and head_size < FLEX_MIN_HEAD_SIZE
    if kernel == "flex" and narrow:
        raise ValueError(f"attention_kernel 'flex' needs heads of at least {FLEX_MIN_HEAD_SIZE} channels on CUDA, "
                         f"got {head_size} (d_model / n_heads): use 'auto' or 'sdpa', or fewer heads")
    return kernel == "flex" or (kernel == "auto" and device.type == "cuda" and not narrow)


def attend(q: Tensor, k: Tensor, v: Tensor, pattern: AttentionPattern | None = None, kernel: str = "auto") -> Tensor:
    """q (Tq, N, e) over k, v (Tk, N, e) -> (Tq, N, e): every key (no ``pattern``), or those the
    pattern allows, equal to the dense reference with its ``can_attend()``, through ``kernel``."""
    if pattern is None:
        return fused_attention(q, k, v)
    if uses_flex(kernel, q.device, q.shape[-1]):
        return flex_attend(q, k, v, pattern.block_mask(q.device))
    if isinstance(pattern, FullCausal):
        return fused_attention(q, k, v, causal=True)
    if isinstance(pattern, Local1D):
        return attend_windows(q, k, v, pattern.block_length, pattern.memory_blocks)
    return attend_in_blocks(q, k, v, pattern.blocks(q.device))


def prepare(pattern: AttentionPattern | None, kernel: str, device: torch.device, head_size: int) -> None:
    """Build what ``attend`` reads of ``pattern`` on ``device`` for heads of ``head_size`` channels
    (its block mask, or its blocks), where it is not built yet. Traced by torch.compile, building
    is a graph break (``BuiltOnce``): the layers call this before their projections, so that it
    breaks a frame that holds no tensors. Inside ``attend`` it would break ``attend``'s own frame, which self- and
    cross-attention share: compiled for one's shapes, then again for the other's with dynamic
    shapes, which FlexAttention's CPU kernel cannot build."""
    if pattern is not None:
        pattern.block_mask(device) if uses_flex(kernel, device, head_size) else pattern.blocks(device)


def pairs_computed(pattern: AttentionPattern) -> int:
    """Query-key pairs ``attend``'s SDPA path computes per image and head under ``pattern``
    (masked pairs included: the kernel computes them)."""
    if isinstance(pattern, FullCausal):  # SDPA's causal kernels skip the upper tiles
        return pattern.length * (pattern.length + 1) // 2
    if isinstance(pattern, Local1D):
        lq, m = pattern.block_length, pattern.memory_blocks
        n_blocks = -(-pattern.length // lq)
        causal = min(m, n_blocks) * lq  # the first m blocks in one causal call
        return causal * (causal + 1) // 2 + (n_blocks - min(m, n_blocks)) * lq * (m + 1) * lq
    n_blocks, block_len, n_keys = pattern.blocks("cpu").can_attend.shape  # L queries × S keys per block
    return n_blocks * block_len * n_keys


# ----- SDPA --------------------------------------------------------------------------------------

def fused_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """(Tq, N, e) queries over every key of (Tk, N, e), or causally: one fused call on views."""
    q, k, v = (rearrange(t, "t n e -> 1 n t e") for t in (q, k, v))
    return rearrange(F.scaled_dot_product_attention(q, k, v, is_causal=causal), "1 n t e -> t n e")


def attend_in_blocks(q: Tensor, k: Tensor, v: Tensor, blocks: BlockIndex) -> Tensor:
    """Queries in blocks (``BlockIndex``), each block over its own gathered keys: q (Tq, N, e);
    k, v (Tk, N, e) with a zero row appended for key step Tk. The blocks are the batch axis of
    one fused call. -> (Tq, N, e)."""
    n_blocks, n_keys = blocks.key_steps.shape
    block_len, length = blocks.can_attend.shape[1], q.shape[0]
    if blocks.query_order is not None:
        q = q.index_select(0, blocks.query_order)
    q = F.pad(q, (0, 0, 0, 0, 0, n_blocks * block_len - length))  # end padding: its outputs are dropped
    zero = q.new_zeros(1, *q.shape[1:])
    keys, values = (rearrange(torch.cat([t, zero]).index_select(0, blocks.key_steps.flatten()),
                              "(b s) n e -> b n s e", s=n_keys) for t in (k, v))
    queries = rearrange(q, "(b l) n e -> b n l e", b=n_blocks)
    mask = blocks.can_attend[:, None] if blocks.partial else None  # unmasked: SDPA's fused kernel
    out = rearrange(F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask), "b n l e -> (b l) n e")
    return out[:length] if blocks.query_position is None else out.index_select(0, blocks.query_position)


def attend_windows(q: Tensor, k: Tensor, v: Tensor, block_length: int, memory_blocks: int) -> Tensor:
    """1D local attention on views: blocks 0..m−1 have every earlier position in memory: one
    causal call. Every later block b needs the window of blocks [b−m, b]. Windows
    that start at blocks s, s+(m+1), s+2(m+1), … do not overlap, so for each s in 0..m they are a
    plain view of k and v (no gathered copies); the last block of each window is queried against
    the whole window with one shared (lq, (m+1)·lq) mask."""
    lq, m, length = block_length, memory_blocks, q.shape[0]
    n_blocks = -(-length // lq)
    pad = n_blocks * lq - length
    if pad:  # padding comes after every real position: causality keeps it unseen
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
    out = q.new_empty(q.shape)
    head = min(m, n_blocks) * lq
    out[:head] = fused_attention(q[:head], k[:head], v[:head], causal=True)
    window = (m + 1) * lq
    can_attend = torch.ones(lq, window, dtype=torch.bool, device=q.device).tril(m * lq)
    blocks_out = rearrange(out, "(b l) n e -> b l n e", l=lq)
    for s in range(m + 1):
        n_windows = -(-(n_blocks - m - s) // (m + 1))
        if n_windows <= 0:
            continue
        span = slice(s * lq, (s + n_windows * (m + 1)) * lq)
        # windows: (w, n, (m+1)·lq, e) views; queries: the last block of each window
        keys, values = (rearrange(t[span], "(w l) n e -> w n l e", l=window) for t in (k, v))
        queries = rearrange(q[span], "(w j l) n e -> w j n l e", j=m + 1, l=lq)[:, m]
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend)
        first_block = s + m
        blocks_out[first_block : first_block + n_windows * (m + 1) : m + 1] = rearrange(
            attended, "w n l e -> w l n e")
    return out[:length]


# ----- decoding ----------------------------------------------------------------------------------

def attend_prefix(pattern: CausalPattern, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The first t steps' attention under ``pattern`` (t, N, e) -> (t, N, e), from their own
    queries, keys and values: the full pass's attention of those steps, which by causality
    reads nothing later.

    The pattern's first ceil(t / L) query blocks, through ``attend_in_blocks`` as the training
    pass runs them, the last block's queries past t padded with zeros (their outputs dropped).
    Key steps from t on read the zero key: no real query may see them (each sees only keys up
    to itself), so the result is exact, at a cost of those blocks only, never the whole image."""
    length = q.shape[0]
    blocks = pattern.blocks(q.device)
    used = -(-length // blocks.can_attend.shape[1])
    # attend_in_blocks appends the zero key at index len(k) = t: later steps (and step T, its
    # marker for "no key") all point there
    prefix_blocks = BlockIndex(blocks.key_steps[:used].clamp(max=length), blocks.can_attend[:used])
    return attend_in_blocks(q, k, v, prefix_blocks)


def attend_slots(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """The queries of t steps (t, N, e) over cached keys and values (N, S, e) -> (t, N, e).
    ``mask``: the slots each may read, bool (t, S); None: all."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)  # (N, t, e)
    return out.transpose(0, 1)


# ----- FlexAttention -----------------------------------------------------------------------------

@functools.cache
def compiled_flex_attention():
    """``flex_attention`` compiled, once per process: uncompiled it computes every score
    densely (and warns), which defeats the point. Shapes are static: each new (batch, length)
    compiles once more, and the CPU kernel that dynamic shapes generate does not build (a C++
    compile error: an undeclared ``cur_qSplitSize``)."""
    return torch.compile(flex_attention, dynamic=False)


def tile_options(block_mask: BlockMask, device: torch.device) -> dict | None:
    """The CUDA kernel's tiles for a block mask finer than its default tiles: one tile per block,
    pinned, since its tiles must divide the mask's blocks and a default tile larger than a block
    is refused; None (the kernel's own choice) otherwise."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    if device.type != "cuda" or min(q_block, kv_block) >= FLEX_BLOCK_SIZE:
        return None
    # forward: M queries × N keys; backward: dK/dV over N1 keys by M1 queries, dQ over M2 queries
    # by N2 keys, where the kernel needs N1 a multiple of M1 and M2 a multiple of N2
    both = min(q_block, kv_block)
    return {"BLOCK_M": q_block, "BLOCK_N": kv_block, "BLOCK_M1": both, "BLOCK_N1": kv_block,
            "BLOCK_M2": q_block, "BLOCK_N2": both}


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask) -> Tensor:
    """q (Tq, N, e), k and v (Tk, N, e) -> (Tq, N, e) under ``block_mask``: the N images·heads
    are the kernel's batch. Copied contiguous: in a compiled model, Inductor's CPU lowering
    rejects views of a graph's inputs, and the copy is small next to the attention."""
    q, k, v = (rearrange(t, "t n e -> n 1 t e").contiguous() for t in (q, k, v))
    # Inside a compiled model the model's compilation builds the kernel.
    kernel = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
    out = kernel(q, k, v, block_mask=block_mask, kernel_options=tile_options(block_mask, q.device))
    return rearrange(out, "n 1 t e -> t n e")
