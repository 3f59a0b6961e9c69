"""The decoding arithmetic of formats 1 to 6, kept for their files (docs/compress.md, "Formats").

A file decodes only where the decoder computes, bit for bit, the distributions the encoder computed.
Files of formats 1 to 6 were coded with a decoder whose self-attention step attended over its
whole ring of cached keys, R = ``patterns.reach`` slots (the model's ``cache_length`` − 1), and its
own key, under a mask of R + 1 columns looked up per step (``step_masks``), its key kept after the
step. The model's own decoding reads its query block's key slots and mask row
(``attention.KVCache``): the same attention, other float sums. ``WholeRingCache`` is that earlier
kv-cache, which ``coder.code_pass`` hands the model's
``forward`` for files of those formats (the cache is an argument of forward: nothing else of the
model's arithmetic changed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.attention import KVCache
from ..model.patterns import BlockIndex
from ..model.transformer import DecodingCache, ImageTransformer

# The first format whose files the model's own decoding codes (coder.code_pass).
BLOCK_KEYS_VERSION = 7


def step_masks(blocks: BlockIndex, length: int, ring: int) -> Tensor:
    """(T, ring + 1) bool: which keys step s sees when the steps before it went through a ring of
    ``ring`` slots in order: slot j holds the latest step before s that is j modulo the ring (none
    yet: unseen), the last column is s itself; read from ``blocks``, a query block at a time."""
    n_keys = blocks.key_steps.shape[1]
    masks = []
    for queries, keys, can_attend in zip(blocks.query_steps, blocks.key_steps, blocks.can_attend):
        steps = queries[queries < length][:, None]  # (l, 1): the block's real queries
        held = steps - 1 - (steps - 1 - torch.arange(ring)) % ring  # (l, ring); negative: no step yet
        wanted = torch.cat([held.masked_fill(held < 0, length), steps], dim=1)  # step T: no key
        column = torch.full((length + 1,), n_keys, dtype=torch.long)  # each step's column in the
        column[keys] = torch.arange(n_keys)  # block's keys; column S (all False): not listed
        column[length] = n_keys
        sees = F.pad(can_attend[: steps.shape[0]], (0, 1))  # (l, S + 1)
        masks.append(sees.gather(1, column[wanted]))
    return torch.cat(masks)


@dataclass
class WholeRingCache(KVCache):
    """The kv-cache of formats 1 to 6: keys and values (B, h, R, e), step s in slot s % R, a step
    attending over all R and its own key under its row of ``step_masks`` (T, R + 1), then kept."""

    step_masks: Tensor

    def attend(self, q: Tensor, k: Tensor, v: Tensor, steps: Tensor) -> Tensor:
        if steps.shape[0] != 1:
            raise ValueError("the codec decodes one step at a time")
        out = F.scaled_dot_product_attention(q, torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2),
                                             attn_mask=self.step_masks[steps])
        slots = steps % self.keys.shape[2]
        self.keys.index_copy_(2, slots, k)
        self.values.index_copy_(2, slots, v)
        return out


def start_decoding(model: ImageTransformer, count: int, version: int) -> DecodingCache:
    """The model's empty decoding cache for ``count`` images, with the kv-caches format ``version``
    was coded with: the model's own from ``BLOCK_KEYS_VERSION`` on, else ``WholeRingCache``s."""
    cache = model.start_decoding(count)
    if version < BLOCK_KEYS_VERSION:
        index = model.layers[0].self_attn.index
        ring = index.cache_length - 1  # the widest reach: the model's cache holds one step more, its own
        masks = step_masks(index.blocks, model.order.length, ring)
        cache.layers = [WholeRingCache(torch.zeros_like(layer.keys[:, :, :ring]),
                                       torch.zeros_like(layer.values[:, :, :ring]), index, masks)
                        for layer in cache.layers]
    return cache
