"""Multi-head attention layers (docs/model.md §3): self-attention under a pattern
(``patterns.py``), or unmasked as in the encoder, and cross-attention to the encoder's output.

Heads are folded into the batch axis: a (B, T, d) input becomes q, k, v of shape (T, B·h, e),
the layout of ``patterns.py``. Self-attention projects q, k and v with one fused linear map
(as nanoGPT and timm); cross-attention projects q from the decoder and k, v (fused) from the
context. The attention itself is ``kernels.attend``'s (``kernel``, ``ModelConfig.attention_kernel``,
chooses SDPA or FlexAttention).

Decoding one step at a time, the same ``forward`` takes a cache (``start_decoding``) and the
``steps`` it runs (the model's decoding cache owns the step counter): a self-attention layer
writes the step's key and value into a ring buffer laid out by its pattern's ``decode_index``
and reads the slots the step may see; cross-attention reads the context's keys and values,
projected once. Given more than one step, a fresh cache is prefilled: the first t steps (the
given rows of a completion) run at once, as the full pass runs them, and leave the ring as t
single steps would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .cross_pattern import CrossPattern
from .kernels import attend, attend_prefix, attend_slots, prepare
from .patterns import CausalPattern, DecodeIndex
from .rotary import Rotary2D


def project_heads(proj: nn.Linear, x: Tensor, n_heads: int, parts: int) -> tuple[Tensor, ...]:
    """x (B, T, d) through ``proj`` (d -> parts·d) -> ``parts`` tensors (T, B·h, e).

    The projection's output features are ordered (head, part, e): projecting the transposed
    (T, B, d) input, every part of every head then folds into the batch axis as a view, with
    no copy (a (part, head, e) order would need one)."""
    out = proj(x.transpose(0, 1))  # (T, B, h·parts·e)
    return rearrange(out, "t b (h p e) -> p t (b h) e", h=n_heads, p=parts).unbind(0)


def merge_heads(proj: nn.Linear, out: Tensor, n_heads: int) -> Tensor:
    """(T, B·h, e) -> (B, T, d) through the output projection."""
    return proj(rearrange(out, "t (b h) e -> t b (h e)", h=n_heads)).transpose(0, 1)


@dataclass
class SelfAttentionCache:
    """One self-attention layer's decoding state: keys and values (N, ring, e) in the ring
    slots of ``index``."""

    index: DecodeIndex
    keys: Tensor
    values: Tensor


@dataclass
class CrossAttentionCache:
    """The context's keys and values (N, S, e), projected once; ``can_attend`` (Tq, S) bool, the
    keys each step may read (None: all of them)."""

    keys: Tensor
    values: Tensor
    can_attend: Tensor | None


class SelfAttention(nn.Module):
    """Self-attention under ``pattern`` (the decoder; causal), or over every position without
    one (the encoder), with optional relative positions (decoder only): queries and keys turned
    by their grid positions (``rotary``)."""

    def __init__(self, d_model: int, n_heads: int, pattern: CausalPattern | None = None, kernel: str = "auto",
                 rotary: Rotary2D | None = None) -> None:
        super().__init__()
        self.n_heads, self.pattern, self.kernel = n_heads, pattern, kernel
        self.head_size = d_model // n_heads
        self.rotary = rotary
        # T2T's attention projections carry no bias.
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def start_decoding(self, batch: int) -> SelfAttentionCache:
        """Empty rings for ``forward(..., cache=)``, laid out by the pattern's decode index."""
        if self.pattern is None:
            raise ValueError("unmasked self-attention (no pattern) is not causal: it cannot decode step by step")
        weight = self.to_qkv.weight
        index = self.pattern.decode_index(weight.device)
        shape = (batch * self.n_heads, index.ring, self.head_size)
        keys = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        return SelfAttentionCache(index, keys, torch.zeros_like(keys))

    def forward(self, x: Tensor, steps: Tensor | slice = slice(None),
                cache: SelfAttentionCache | None = None) -> Tensor:
        """(B, t, d) of ``steps`` -> (B, t, d): every step (no cache), or with ``cache`` one
        decoding step (``steps`` a (1,) index) or the first t steps into a fresh cache (a prefill)."""
        if cache is None:
            prepare(self.pattern, self.kernel, x.device, self.head_size)
        q, k, v = project_heads(self.to_qkv, x, self.n_heads, 3)
        if self.rotary is not None:  # cached keys are kept turned: each by its own step
            q, k = self.rotary(q, steps), self.rotary(k, steps)
        if cache is None:
            out = attend(q, k, v, self.pattern, self.kernel)
        elif x.shape[1] == 1:
            out = self.attend_step(q, k, v, cache, steps)
        else:
            out = self.prefill(q, k, v, cache)
        return merge_heads(self.to_out, out, self.n_heads)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, cache: SelfAttentionCache) -> Tensor:
        """The first t steps (t, N, e) at once: their keys and values written into the ring as t
        single steps would leave it (the last ``ring`` of them: each earlier one was overwritten
        by the step ``ring`` after it), their attention as the full pass computes it."""
        ring, length = cache.index.ring, q.shape[0]
        kept = torch.arange(max(0, length - ring), length, device=q.device)
        cache.keys.index_copy_(1, kept % ring, k.index_select(0, kept).transpose(0, 1))
        cache.values.index_copy_(1, kept % ring, v.index_select(0, kept).transpose(0, 1))
        return attend_prefix(self.pattern, q, k, v)

    def attend_step(self, q: Tensor, k: Tensor, v: Tensor, cache: SelfAttentionCache, step: Tensor) -> Tensor:
        """Write the key and value (1, N, e) of ``step`` (a (1,) index) into its ring slot, attend
        over the slots the step may read."""
        index = cache.index
        slot = step % index.ring
        cache.keys.index_copy_(1, slot, k.transpose(0, 1))
        cache.values.index_copy_(1, slot, v.transpose(0, 1))
        readable = index.readable(step)  # (ring,)
        return attend_slots(q, cache.keys, cache.values, readable[None])


class CrossAttention(nn.Module):
    """Attention of the decoder to a context (the encoder's output): to all of it, or under
    ``pattern``, only to the keys its ``can_attend`` allows."""

    def __init__(self, d_model: int, n_heads: int, pattern: CrossPattern | None = None,
                 kernel: str = "auto") -> None:
        super().__init__()
        self.n_heads, self.pattern, self.kernel = n_heads, pattern, kernel
        self.head_size = d_model // n_heads
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def start_decoding(self, context: Tensor) -> CrossAttentionCache:
        """The context's keys and values (N, S, e), projected here once, and the pattern's
        ``can_attend`` on their device (built here, not in a compiled step)."""
        keys, values = (rearrange(t, "s n e -> n s e").contiguous()
                        for t in project_heads(self.to_kv, context, self.n_heads, 2))
        can_attend = None if self.pattern is None else self.pattern.on_device(keys.device)
        return CrossAttentionCache(keys, values, can_attend)

    def forward(self, x: Tensor, context: Tensor | None = None, cache: CrossAttentionCache | None = None,
                steps: Tensor | slice = slice(None)) -> Tensor:
        """x (B, t, d) of ``steps``, context (B, S, d) -> (B, t, d); with ``cache``, no ``context``
        (the cache holds it)."""
        if cache is None:
            prepare(self.pattern, self.kernel, x.device, self.head_size)
        (q,) = project_heads(self.to_q, x, self.n_heads, 1)
        if cache is not None:
            # (t, S), read on the device: a decoding step's index is a (1,) tensor, as in DecodeIndex.readable
            mask = None if cache.can_attend is None else cache.can_attend[steps]
            out = attend_slots(q, cache.keys, cache.values, mask)
        else:
            k, v = project_heads(self.to_kv, context, self.n_heads, 2)
            out = attend(q, k, v, self.pattern, self.kernel)
        return merge_heads(self.to_out, out, self.n_heads)
