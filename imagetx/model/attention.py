"""Multi-head attention (docs/model.md §3, §4, §7): the layers, and ``attend``, the one function that
computes attention for training, prefill and decoding alike. q, k, v are (B, h, T, e), e the head size:
views of one fused projection with output features in (part, head, e) order, as nanoGPT's and timm's.
What the queries may see is one argument of ``attend``: a mask pattern's index (``PatternIndex``: its
gathered blocks through SDPA, or the optional FlexAttention kernel, flex.py, imported where it runs), a
(Tq, Tk) bool mask, or None: every key (the encoder, cross-attention). 2D RoPE (``Rotary2D``) rotates
queries and keys before any of these.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .patterns import BlockIndex, GenerationOrder, PatternIndex

# How attention runs, the same numbers every way: "flex" = FlexAttention, block-sparse; "sdpa" = the pattern's
# gathered blocks through SDPA; "auto" = flex on CUDA, sdpa elsewhere (FlexAttention has no CPU backward).
ATTENTION_KERNELS = ("auto", "flex", "sdpa")
# FlexAttention's tiles, queries × keys: powers of two from its CUDA kernel's smallest to its default, 128.
# Smaller tiles skip more masked pairs of a fine pattern; larger ones keep the GPU's matrix units busier.
FLEX_BLOCK_SIZE = 128
FLEX_BLOCK_SIZES = (16, 32, 64, FLEX_BLOCK_SIZE)
# FlexAttention's compiled CUDA kernel (Inductor's lowering) refuses heads of fewer channels: "NYI:
# embedding dimension of the query, key, and value must be at least 16". Its CPU kernel takes them.
FLEX_MIN_HEAD_SIZE = 16


# ----- the one entry ----------------------------------------------------------------------------
def attend(q: Tensor, k: Tensor, v: Tensor, allowed: PatternIndex | Tensor | None = None,
           kernel: str = "auto") -> Tensor:
    """q (B, h, Tq, e) over k, v (B, h, Tk, e) -> (B, h, Tq, e): over the keys ``allowed`` lets each query
    see (a pattern's index; a (Tq, Tk) bool mask; None: every key), equal to the dense reference."""
    if allowed is None or isinstance(allowed, Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    if uses_flex(kernel, q.device, q.shape[-1]):
        from .flex import flex_attend  # the optional kernel, in a module of its own: imported where it runs

        return flex_attend(q, k, v, allowed)
    return attend_in_blocks(q, k, v, allowed.blocks)


def check_kernel(kernel: str, flex_block_size: int = FLEX_BLOCK_SIZE) -> None:
    """Refuse, in one line naming the choices, a kernel or kernel block size there is none of."""
    if kernel not in ATTENTION_KERNELS:
        raise UserError(f"attention kernel {kernel!r} is unknown: choose one of {', '.join(ATTENTION_KERNELS)}")
    if not isinstance(flex_block_size, int) or flex_block_size not in FLEX_BLOCK_SIZES:
        raise UserError(f"flex_block_size {flex_block_size!r} is invalid: choose one of "
                        f"{', '.join(map(str, FLEX_BLOCK_SIZES))}")


def uses_flex(kernel: str, device: torch.device, head_size: int) -> bool:
    """Whether ``kernel`` runs FlexAttention on ``device`` for heads of ``head_size``; flex where it cannot: refused."""
    check_kernel(kernel)
    narrow = device.type == "cuda" and head_size < FLEX_MIN_HEAD_SIZE
    if kernel == "flex" and narrow:
        raise UserError(f"attention kernel 'flex' needs heads of at least {FLEX_MIN_HEAD_SIZE} channels on CUDA, "
                        f"got {head_size}: use 'auto' or 'sdpa', or wider heads")
    return kernel == "flex" or (kernel == "auto" and device.type == "cuda" and not narrow)


def may_use_flex(kernel: str, head_size: int) -> bool:
    """Whether a model built with ``kernel`` may run FlexAttention on this machine (so keeps its block mask)."""
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return any(uses_flex(kernel, torch.device(device), head_size) for device in devices)


# ----- the SDPA reference path --------------------------------------------------------------------
def attend_in_blocks(q: Tensor, k: Tensor, v: Tensor, blocks: BlockIndex) -> Tensor:
    """q (B, h, Tq, e) over k, v (B, h, Tk, e) -> (B, h, Tq, e): each block of queries over its own
    gathered keys (key step Tk: a zero row, no key), in one SDPA call, O(T·S) for S keys a block. The
    blocks lead the batch axis, so that one (n, 1, L, S) mask serves every image and head."""
    n_blocks, n_keys = blocks.key_steps.shape
    block_len, length, heads = blocks.can_attend.shape[1], q.shape[2], q.shape[1]
    q = F.pad(q, (0, 0, 0, n_blocks * block_len - length))  # end padding: its outputs are dropped
    zero = q.new_zeros(*q.shape[:2], 1, q.shape[3])
    # gathered along one axis of a (B·h, T + 1, e) view: index_select on the third axis of a 4D tensor
    # takes 4x as long on the CPU (the same copy)
    keys, values = (rearrange(torch.cat([t, zero], dim=2).flatten(0, 1).index_select(1, blocks.key_steps.flatten()),
                              "(b h) (n s) e -> n (b h) s e", h=heads, s=n_keys) for t in (k, v))
    queries = rearrange(q, "b h (n l) e -> n (b h) l e", n=n_blocks)
    mask = None if blocks.causal else blocks.can_attend[:, None]  # causal: SDPA's own, no mask read
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=blocks.causal)
    return rearrange(out, "n (b h) l e -> b h (n l) e", h=heads)[:, :, :length]


# ----- rotary positions: axial 2D RoPE (docs/model.md §4) ---------------------------------------------
# Half of each head's dimension pairs rotate by row·ω_i, half by col·ω_i, ω_i = ROTARY_BASE^(−i/n),
# n = e/4, so that q·k depends on the (row, column) offset only, with nothing inside the kernel. The
# slowest wavelength, 2π·100^(1 − 1/n) cells (≈ 350 for heads of 32), is over twice the widest grid (96
# columns), so no two offsets look alike on every frequency; the fastest, 1 radian a cell, tells
# neighbours apart. 100 is Heo et al.'s axial base for image grids (the text default, 10,000, spends
# most frequencies on distances no grid has).
ROTARY_BASE = 100.0


class Rotary2D(nn.Module):
    """Rotates (B, h, t, e) queries or keys of the given steps by their grid rows and columns."""

    def __init__(self, head_dim: int, order: GenerationOrder) -> None:
        super().__init__()
        n = head_dim // 4
        frequencies = ROTARY_BASE ** (-torch.arange(n, dtype=torch.float64) / n)
        rows, cols = order.grid_cell()
        angles = torch.cat([rows[:, None] * frequencies, cols[:, None] * frequencies], dim=1)  # (T, e/2)
        # Kept in float64, so that a float64 model rotates by exact angles; ``angles`` rounds them.
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T, e/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def angles(self, steps: Tensor | slice, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The cosines and sines (t, e/2) of ``steps``' angles for tensors of ``dtype``: in float32 at
        least, so that bf16 queries and keys are rounded once, after the rotation."""
        dtype = torch.promote_types(dtype, torch.float32)
        return self.cos[steps].to(dtype), self.sin[steps].to(dtype)

    def forward(self, x: Tensor, steps: Tensor | slice = slice(None)) -> Tensor:
        """x (B, h, t, e) of ``steps`` (all T by default) -> x rotated."""
        return rotate(x, *self.angles(steps, x.dtype))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., t, e) rotated by ``Rotary2D.angles``: dimension i pairs with i + e/2."""
    first, second = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


# ----- the layers ---------------------------------------------------------------------------------
def project_heads(proj: nn.Linear, x: Tensor, n_heads: int, parts: int) -> tuple[Tensor, ...]:
    """x (B, T, d) through ``proj`` (d -> parts·h·e, output features in (part, head, e) order)
    -> ``parts`` tensors (B, h, T, e), views of the one projection."""
    return rearrange(proj(x), "b t (p h e) -> p b h t e", p=parts, h=n_heads).unbind(0)


def merge_heads(proj: nn.Linear, out: Tensor) -> Tensor:
    """(B, h, T, e) -> (B, T, d) through the output projection."""
    return proj(rearrange(out, "b h t e -> b t (h e)"))


@dataclass
class KVCache:
    """One self-attention layer's kv-cache, written in place: keys and values (B, h, C, e) of the last
    C = ``index.cache_length`` steps, step s in slot s % C: every key a later step still attends to."""

    keys: Tensor
    values: Tensor
    index: PatternIndex

    def attend(self, q: Tensor, k: Tensor, v: Tensor, steps: Tensor) -> Tensor:
        """q, k, v (B, h, t, e) of ``steps`` (t,) -> (B, h, t, e), then k, v kept. One decoding step: the
        slots of its block's keys, under the block's mask row for the step. A prefill: the full pass's blocks."""
        length, index = self.keys.shape[2], self.index
        if steps.shape[0] > 1:
            out = self.attend_chunk(q, k, v, int(steps[0]))  # one host read a prefill, which runs eagerly
            k, v, steps = k[:, :, -length:], v[:, :, -length:], steps[-length:]  # what later steps read
        slots = steps % length
        self.keys.index_copy_(2, slots, k)
        self.values.index_copy_(2, slots, v)
        if steps.shape[0] > 1:
            return out
        held = index.key_slots.index_select(0, steps // index.block_length).view(-1)  # (S,): the block's keys' slots
        row = index.can_attend.flatten(0, 1).index_select(0, steps)  # (1, S): the step's row of its block's mask
        if index.gathers:  # a kv-cache much wider than a block's keys (2D, wide images): those S keys
            keys, values = (t.flatten(0, 1).index_select(1, held).view(*q.shape[:2], -1, q.shape[3])
                            for t in (self.keys, self.values))  # (B, h, S, e), gathered as attend_in_blocks does
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=row)
        # the whole kv-cache in place, the row laid out by slot (an OR: a slot listed twice is seen once at most)
        mask = row.new_zeros(1, length, dtype=torch.uint8).index_add_(1, held, row.to(torch.uint8)) > 0  # (1, C)
        return F.scaled_dot_product_attention(q, self.keys, self.values, attn_mask=mask)

    def attend_chunk(self, q: Tensor, k: Tensor, v: Tensor, first: int) -> Tensor:
        """The t steps from ``first`` on through the blocks they fall in (``attend_in_blocks``), each
        key from the cache (a step before ``first``), from ``k``, ``v`` (one of these steps) or none."""
        length, block_length, t = self.keys.shape[2], self.index.block_length, q.shape[2]
        first_block, end_block = first // block_length, -(-(first + t) // block_length)
        key_steps = self.index.key_steps[first_block:end_block]
        source = torch.where(key_steps < first, key_steps % length,  # rows of cat([cache, new, a zero row])
                             torch.where(key_steps < first + t, length + key_steps - first, length + t))
        blocks = BlockIndex(source, self.index.can_attend[first_block:end_block], self.index.causal)
        before = first - first_block * block_length  # the block's queries before ``first``: computed, dropped
        out = attend_in_blocks(F.pad(q, (0, 0, before, 0)), torch.cat([self.keys, k], dim=2),
                               torch.cat([self.values, v], dim=2), blocks)
        return out[:, :, before:]


class SelfAttention(nn.Module):
    """Self-attention, causal under a mask pattern's ``index`` (the decoder), or over every position
    without one (the encoder); optional 2D RoPE (``rotary``). Both are shared by a decoder's layers."""

    def __init__(self, d_model: int, n_heads: int, index: PatternIndex | None = None, kernel: str = "auto",
                 rotary: Rotary2D | None = None, head_size: int | None = None) -> None:
        super().__init__()
        check_kernel(kernel)
        if kernel == "flex" and index is not None and index.flex_block_size is None:
            raise UserError("kernel 'flex' reads the pattern's block mask: give PatternIndex(pattern, flex_block_size)")
        self.n_heads, self.index, self.kernel = n_heads, index, kernel
        self.head_size = head_size or d_model // n_heads
        self.rotary = rotary
        width = n_heads * self.head_size
        # T2T's attention projections carry no bias.
        self.qkv = nn.Linear(d_model, 3 * width, bias=False)  # output features (part, head, e)
        self.proj = nn.Linear(width, d_model, bias=False)

    def start_decoding(self, batch: int) -> KVCache:
        """An empty kv-cache for ``forward(..., cache=)``."""
        if self.index is None:
            raise ValueError("unmasked self-attention (no pattern) is not causal: it cannot decode step by step")
        keys = self.qkv.weight.new_zeros(batch, self.n_heads, self.index.cache_length, self.head_size)
        return KVCache(keys, torch.zeros_like(keys), self.index)

    def forward(self, x: Tensor, cache: KVCache | None = None, start: Tensor | int = 0) -> Tensor:
        """(B, t, d), the steps from ``start`` on -> (B, t, d): every step (no cache), or with
        ``cache`` the next t steps (one decoding step, or a prefill)."""
        q, k, v = project_heads(self.qkv, x, self.n_heads, 3)  # each (B, h, t, e)
        steps = start + torch.arange(x.shape[1], device=x.device)
        if self.rotary is not None:  # cached keys are kept rotated, each by its own step
            angles = self.rotary.angles(steps, q.dtype)
            q, k = rotate(q, *angles), rotate(k, *angles)
        out = attend(q, k, v, self.index, self.kernel) if cache is None else cache.attend(q, k, v, steps)
        return merge_heads(self.proj, out)  # (B, t, d)


@dataclass
class CrossAttentionCache:
    """The context's keys and values (B, h, S, e), projected once."""

    keys: Tensor
    values: Tensor


class CrossAttention(nn.Module):
    """Attention of the decoder to every position of a context (the encoder's output)."""

    def __init__(self, d_model: int, n_heads: int, head_size: int | None = None) -> None:
        super().__init__()
        self.n_heads = n_heads
        width = n_heads * (head_size or d_model // n_heads)
        self.q = nn.Linear(d_model, width, bias=False)
        self.kv = nn.Linear(d_model, 2 * width, bias=False)  # output features (part, head, e)
        self.proj = nn.Linear(width, d_model, bias=False)

    def prepare(self, context: Tensor) -> CrossAttentionCache:
        """The context (B, S, d) -> its keys and values (B, h, S, e), projected once for a pass or a decoding."""
        return CrossAttentionCache(*project_heads(self.kv, context, self.n_heads, 2))

    def forward(self, x: Tensor, context: CrossAttentionCache) -> Tensor:
        """x (B, t, d) over the ``prepare``d context -> (B, t, d)."""
        (q,) = project_heads(self.q, x, self.n_heads, 1)
        return merge_heads(self.proj, attend(q, context.keys, context.values))
