"""FLOPs per image of the Image Transformer: one forward pass, and one training step (forward
and backward), counted from the work the model really does (docs/model.md §8, "FLOPs and MFU").

What is counted, as ``torch.utils.flop_counter.FlopCounterMode`` and the model FLOPs of MFU
(PaLM, Chowdhery et al. 2022) count it: matrix products, at 2 FLOPs per multiply-add — every
linear layer, and the scores (q·k) and weighted values of every attention call. Element-wise
work (norms, softmax, activations, dropout, the heads' log-likelihoods) and embedding look-ups
are not: they are memory-bound, and FlopCounterMode leaves them out too.

Attention counts the query-key pairs each call computes, masked pairs included (the kernel
computes them), never the dense T² it does not:

* decoder self-attention: what ``attention.attend`` computes under each pattern, as the SDPA
  path counts it (``pairs_computed``): its gathered blocks, or one causal call;
* the encoder: every pair of its 3·h·w sub-pixels; cross-attention: every decoder step over
  all of them. The cell add (``low_res_reading: cell_add``) is no attention: its map runs once
  per low-resolution pixel.

Where FlexAttention runs instead (the model's kernel flex, or auto on CUDA: ``attention.uses_flex``),
a pattern's attention is every tile (``flex_block_size`` squared pairs) of its block mask that
the kernel does not skip, computed whole: fewer pairs than the gathered blocks where a block's
keys are mostly outside the image (2D), more where blocks are narrower than a tile (``quick``'s
32-pixel rows).

Training = forward + backward. The backward of a product is twice its forward (the gradients of
both operands), except for the layers that read raw data (the DMOL pixel embedding, the cell
remainder projection), whose input needs no gradient: once. The scores that fused attention
kernels recompute in their backward (FlopCounterMode counts 2.5× the forward for them) are
left out, as model FLOPs leave out every recomputation: training ≈ 3 × forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .config import CHANNELS
from .attention import uses_flex
from .heads import PixelEmbedding
from .flex import block_mask, build_block_mask
from .patterns import BlockIndex
from .superres import SuperResolutionTransformer
from .transformer import ImageTransformer

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

# 2 FLOPs (a multiply and an add) per multiply-add of a matrix product.
FLOPS_PER_MAC = 2


@dataclass(frozen=True)
class Flops:
    """Forward FLOPs of one image, by how their backward is counted."""

    projections: int  # linear layers on hidden states: attention projections, feed-forward, heads
    inputs: int  # linear layers on raw data: the backward computes their weights' gradient only
    attention: int  # scores and weighted values of every attention call

    @property
    def forward(self) -> int:
        return self.projections + self.inputs + self.attention

    @property
    def training(self) -> int:
        """Forward and backward: 3× the projections and attention, 2× the input layers."""
        return 3 * self.projections + 2 * self.inputs + 3 * self.attention


def pairs_computed(blocks: BlockIndex) -> int:
    """Query-key pairs the SDPA path computes per image and head over a pattern's ``blocks``
    (masked pairs included: the kernel computes them; a causal block's upper half is skipped)."""
    n_blocks, block_len, n_keys = blocks.can_attend.shape  # L queries × S keys per block
    if blocks.causal:
        return n_blocks * block_len * (block_len + 1) // 2
    return n_blocks * block_len * n_keys


def tile_pairs(mask: BlockMask) -> int:
    """Query-key pairs FlexAttention computes under ``mask``: every tile it does not skip, whole
    (one host read of the mask's tile counts)."""
    q_tile, kv_tile = mask.BLOCK_SIZE
    tiles = mask.kv_num_blocks.sum()
    if mask.full_kv_num_blocks is not None:
        tiles = tiles + mask.full_kv_num_blocks.sum()
    return int(tiles) * q_tile * kv_tile


def decoder_attention_pairs(model: ImageTransformer, device: torch.device | str = "cpu") -> int:
    """Query-key pairs one decoder self-attention layer computes per image and head on ``device``."""
    attention = model.layers[0].self_attn
    index = attention.index
    if uses_flex(attention.kernel, torch.device(device), model.config.head_size):
        # the model's own block mask; one built for counting where it keeps none (built without CUDA)
        kept = index.flex_block_size is not None
        return tile_pairs(block_mask(index) if kept else build_block_mask(model.pattern, model.flex_block_size))
    return pairs_computed(index.blocks)


def count_flops(model: ImageTransformer, device: torch.device | str = "cpu") -> Flops:
    """FLOPs of one image through ``model`` (any ``ModelConfig``: build it with
    ``build_model(config)``), with the attention kernels it runs on ``device``."""
    cfg = model.config
    steps = model.order.length  # decoder positions: sub-pixels or pixels
    decoder = model.decoder if isinstance(model, SuperResolutionTransformer) else model
    embedding = decoder.value_embedding
    raw = {embedding.proj} if isinstance(embedding, PixelEmbedding) else set()  # a table's look-up is no product
    # Every linear layer runs once per decoder step, except the encoder's and the projection of
    # cross-attention's keys and values, which run once per low-resolution sub-pixel, and the
    # cell add's map, once per low-resolution pixel (its 3 sub-pixels at once).
    context, per_context, per_low_res_pixel, crossing, encoder_layers = 0, set(), set(), 0, 0
    if isinstance(model, SuperResolutionTransformer):
        context = model.encoder.order.length  # low-resolution sub-pixels
        encoder_layers = len(model.encoder.layers)
        per_context = set(model.encoder.modules())
        per_context |= {layer.cross_attn.kv for layer in decoder.layers if layer.cross_attn is not None}
        per_low_res_pixel = {cell_add.proj for cell_add in model.cell_adds or []}
        raw |= {model.cell_remainder.proj} if model.cell_remainder is not None else set()
        crossing = sum(layer.cross_attn is not None for layer in decoder.layers)
    projections = inputs = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            runs = steps
            if module in per_context:
                runs = context
            elif module in per_low_res_pixel:
                runs = context // CHANNELS
            flops = FLOPS_PER_MAC * module.in_features * module.out_features * runs
            if module in raw:
                inputs += flops
            else:
                projections += flops
    # Scores (q·k) and values (weights·v): 2 products of e per pair and head, h·e the attention's width.
    per_pair = 2 * FLOPS_PER_MAC * cfg.attention.n_heads * cfg.head_size
    pairs = cfg.n_layers * decoder_attention_pairs(decoder, device)
    # the encoder and cross-attention to all of it: every pair
    pairs += encoder_layers * context * context + crossing * steps * context
    return Flops(projections, inputs, per_pair * pairs)
