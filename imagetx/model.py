"""The Image Transformer network (docs/model.md §1–§3, §5, §6): a plain ``nn.Module``.

Read top to bottom: one transformer layer (post- or pre-LayerNorm, optional
cross-attention), the super-resolution encoder, then the decoder that embeds
images in generation order, shifts them right by one step, runs the local
attention stack and returns the head's distribution parameters.

Decoding one step at a time (the sampler) runs the same code: ``decode(..., cache=)``
with the inputs of one step and a ``DecodingCache`` from ``start_decoding``, which
every layer reads and updates in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import Tensor, nn

from .attention import (AttentionPattern, CrossAttentionCache, LocalCrossAttention, MultiHeadAttention,
                        SelfAttentionCache, StepIndex, cross_can_attend, pattern_for)
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, LEVELS, ModelConfig
from .embedding import PixelEmbedding, PositionEncoding, SubPixelEmbedding
from .heads import CategoricalHead, DMOLHead
from .order import GenerationOrder, images_to_sequence
from .position_bias import RelativePositionBias


@dataclass
class LayerCache:
    """One decoder layer's decoding state: its self-attention ring, its cross-attention keys."""

    self_attn: SelfAttentionCache
    cross_attn: CrossAttentionCache | None = None


@dataclass
class DecodingCache:
    """Everything ``ImageTransformer.decode`` keeps between decoding steps (updated in place).

    ``step``: the next step to decode; ``index``: the ring geometry every layer shares.
    """

    layers: list[LayerCache]
    remainder: RemainderCache | None
    index: StepIndex
    step: int = 0


class TransformerLayer(nn.Module):
    """Self-attention [+ cross-attention] + feed-forward, each with add-and-norm (docs/model.md §3)."""

    def __init__(self, config: ModelConfig, pattern: AttentionPattern | None, cross_attention: bool,
                 position_bias: RelativePositionBias | None = None) -> None:
        super().__init__()
        d = config.d_model
        self.pre_norm = config.norm == "pre"
        self.self_attn = MultiHeadAttention(d, config.n_heads, pattern, position_bias)
        self.self_norm = nn.LayerNorm(d)
        self.cross_attn = MultiHeadAttention(d, config.n_heads) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d) if cross_attention else None
        self.ffn = nn.Sequential(nn.Linear(d, config.d_filter), nn.ReLU(), nn.Linear(config.d_filter, d))
        self.ffn_norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.dropout)

    def sublayer(self, x: Tensor, fn: Callable[[Tensor], Tensor], norm: nn.LayerNorm) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))  # the paper's "dropout, add, norm"

    def start_decoding(self, batch: int, index: StepIndex, context: Tensor | None = None,
                       local_cross: LocalCrossAttention | None = None) -> LayerCache:
        """This layer's empty decoding cache (cross-attention: keys and values over ``context``)."""
        cross = None if self.cross_attn is None else self.cross_attn.start_decoding(batch, context, local_cross)
        return LayerCache(self.self_attn.start_decoding(batch, index=index), cross)

    def forward(self, x: Tensor, context: Tensor | None = None, local_cross: LocalCrossAttention | None = None,
                cache: LayerCache | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); with ``cache``, one step (B, 1, d) (see ``MultiHeadAttention``)."""
        self_cache, cross_cache = (None, None) if cache is None else (cache.self_attn, cache.cross_attn)
        x = self.sublayer(x, partial(self.self_attn, cache=self_cache), self.self_norm)
        if self.cross_attn is not None:
            x = self.sublayer(x, partial(self.cross_attn, context=context, local=local_cross, cache=cross_cache),
                              self.cross_norm)
        return self.sublayer(x, self.ffn, self.ffn_norm)


class Encoder(nn.Module):
    """Unmasked self-attention over the low-resolution image's sub-pixels (docs/model.md §6).

    Each low-resolution sub-pixel is placed, for its position encoding, at the
    centre of the high-resolution cells it summarises, using the decoder's own
    position encoding, so that cross-attention can match the low-resolution input
    under each target cell by position (a 20-minute CPU run did not learn to: see
    ``cross_attention_radius`` for the local alternative, which the quick preset uses).
    Its value table starts ordinal (``SubPixelEmbedding``), so intensities are
    readable from the first step.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        side = config.low_res_size
        self.order = GenerationOrder(side, side * CHANNELS)
        rows, cols = self.order.cell_of_step()
        pixel_cols, channels = cols // CHANNELS, cols % CHANNELS
        self.register_buffer("cell_rows", rows, persistent=False)  # low-res pixel of each sub-pixel
        self.register_buffer("cell_cols", pixel_cols, persistent=False)
        scale = config.image_size // side
        target_rows = rows * scale + scale // 2
        target_cols = pixel_cols * scale + scale // 2
        if config.head == "categorical":  # decoder columns are sub-pixels
            target_cols = target_cols * CHANNELS + channels
        self.register_buffer("channels", channels, persistent=False)
        self.register_buffer("rows", target_rows, persistent=False)
        self.register_buffer("cols", target_cols, persistent=False)
        self.embedding = SubPixelEmbedding(config.d_model, ordinal=True)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(config, None, False) for _ in range(config.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, low_res: Tensor, positions: PositionEncoding) -> Tensor:
        """(B, h, w, 3) uint8 -> (B, 3·h·w, d), positions from the decoder's encoding."""
        values = images_to_sequence(low_res, self.order, "categorical")
        x = self.embedding(values, self.channels) + positions(self.rows, self.cols)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


class ImageTransformer(nn.Module):
    """Decoder-only (or encoder–decoder) autoregressive model over sub-pixels or pixels."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config.validate()
        d = config.d_model
        self.order = GenerationOrder.for_config(config)
        self.pattern = pattern_for(config)
        rows, cols = self.order.cell_of_step()
        self.register_buffer("step_rows", rows, persistent=False)
        self.register_buffer("step_cols", cols, persistent=False)
        self.register_buffer("step_channels", cols % CHANNELS, persistent=False)
        categorical = config.head == "categorical"
        self.value_embedding = SubPixelEmbedding(d) if categorical else PixelEmbedding(d)
        self.positions = PositionEncoding(*config.grid_shape, d, config.position_encoding)
        self.class_embedding = nn.Embedding(config.num_classes, d) if config.num_classes else None
        self.input_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config) if config.encoder_layers else None
        self.local_cross = self.local_cross_attention()
        self.cell_remainder = None
        if config.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, self.step_cells(), self.step_channels)
        self.layers = nn.ModuleList(
            TransformerLayer(config, self.pattern, cross_attention=self.encoder is not None,
                             position_bias=RelativePositionBias(config.n_heads, rows, cols)
                             if config.relative_position_bias else None)
            for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(d) if config.norm == "pre" else nn.Identity()
        self.head = CategoricalHead(d) if categorical else DMOLHead(d, config.mixture_components)

    def local_cross_attention(self) -> LocalCrossAttention | None:
        """Cross-attention of each decoder step to the encoder's sub-pixels within the radius,
        or None where it sees all of them (no radius, or no encoder)."""
        radius = self.config.cross_attention_radius
        if self.encoder is None or radius is None:
            return None
        return LocalCrossAttention(cross_can_attend(self.step_cells(), (self.encoder.cell_rows, self.encoder.cell_cols), radius))

    def step_cells(self) -> tuple[Tensor, Tensor]:
        """(rows, cols), each (T,): the low-resolution pixel each decoder step lies in."""
        scale = self.config.image_size // self.config.low_res_size
        pixel_cols = self.step_cols // CHANNELS if self.config.head == "categorical" else self.step_cols
        return self.step_rows // scale, pixel_cols // scale

    @property
    def cross_can_attend(self) -> Tensor | None:
        """(T, 3·h·w) ``can_attend`` of decoder steps over encoder sub-pixels, or None (all)."""
        return None if self.local_cross is None else self.local_cross.can_attend

    # ----- inputs -----------------------------------------------------------
    def targets(self, images: Tensor) -> Tensor:
        """(B, H, W, 3) -> (B, T) sub-pixel values or (B, T, 3) pixels, in generation order."""
        return images_to_sequence(images.long(), self.order, self.config.head)

    def embed_values(self, targets: Tensor, steps: slice = slice(None)) -> Tensor:
        """Targets (B, T[, 3]) in generation order -> (B, T, d) value embeddings, not yet
        shifted; ``steps``: which steps the targets are (one step when decoding)."""
        if self.config.head == "categorical":
            return self.value_embedding(targets, self.step_channels[steps])
        return self.value_embedding(targets)

    def condition(self, labels: Tensor | None) -> Tensor | None:
        """(B, 1, d) class vector added to every position, or None."""
        if self.class_embedding is None:
            return None
        return self.class_embedding(labels).unsqueeze(1)

    def encode(self, low_res: Tensor | None) -> Tensor | None:
        return None if self.encoder is None else self.encoder(low_res, self.positions)

    # ----- the decoder ------------------------------------------------------
    def decoder_inputs(self, value_embeddings: Tensor, labels: Tensor | None, shift: bool = True,
                       remainder: Tensor | None = None, steps: slice = slice(None)) -> Tensor:
        """Shift right by one step in generation order, add the positions of ``steps``, class
        and (with ``cell_remainder_input``) the cell remainder features, then dropout."""
        x = value_embeddings
        if shift:  # step t sees the value generated at step t-1; step 0 sees zeros
            x = nn.functional.pad(x[:, :-1], (0, 0, 1, 0))
        x = x + self.positions(self.step_rows[steps], self.step_cols[steps])
        cond = self.condition(labels)
        if cond is not None:
            x = x + cond
        if self.cell_remainder is not None:
            if remainder is None:
                raise ValueError("this model reads the cell remainder (cell_remainder_input=True): "
                                 "pass remainder=model.cell_remainder(targets, low_res)")
            x = x + remainder  # already causal: built from values before each step only
        return self.input_dropout(x)

    def start_decoding(self, batch: int, low_res: Tensor | None = None) -> DecodingCache:
        """An empty cache for decoding ``batch`` images one step at a time with ``decode``.
        The encoder runs here, once: cross-attention keeps its keys and values."""
        context = self.encode(low_res)
        index = StepIndex(self.pattern.can_attend()).to(self.step_rows.device)
        layers = [layer.start_decoding(batch, index, context, self.local_cross) for layer in self.layers]
        remainder = None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)
        return DecodingCache(layers, remainder, index)

    def decode(
        self,
        value_embeddings: Tensor,
        labels: Tensor | None = None,
        context: Tensor | None = None,
        shift: bool = True,
        remainder: Tensor | None = None,
        cache: DecodingCache | None = None,
    ) -> Tensor:
        """(B, T, d) unshifted value embeddings -> (B, T, P) distribution parameters.

        Exposed separately so tests can differentiate with respect to the embedded
        inputs; ``shift=False`` exists only as the causality tests' negative control.
        A model with ``cell_remainder_input`` also needs ``remainder`` =
        ``self.cell_remainder(targets, low_res)``: it is built from raw values, not embeddings.

        With ``cache`` (``start_decoding``), one step, t = ``cache.step``: value_embeddings
        (B, 1, d) is the embedding of step t−1's value (zeros at t = 0), the input already
        shifted; remainder is (B, 1, d), from ``cell_remainder(value, None, cache.remainder)``;
        the context comes from the cache. -> (B, 1, P) for step t; the cache moves on to t+1.
        """
        steps = slice(None) if cache is None else slice(cache.step, cache.step + 1)
        x = self.decoder_inputs(value_embeddings, labels, shift and cache is None, remainder, steps)
        layer_caches = [None] * len(self.layers) if cache is None else cache.layers
        for layer, layer_cache in zip(self.layers, layer_caches):
            x = layer(x, context, self.local_cross, layer_cache)  # (B, T, d), T = 1 with a cache
        if cache is not None:
            cache.step += 1
        return self.head(self.final_norm(x))

    def forward(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """uint8 images (B, H, W, 3) -> (B, T, P) distribution parameters in generation order."""
        self.check_inputs(images, labels, low_res)
        targets = self.targets(images)
        remainder = None if self.cell_remainder is None else self.cell_remainder(targets, low_res)
        return self.decode(self.embed_values(targets), labels, self.encode(low_res), remainder=remainder)

    # ----- likelihoods ------------------------------------------------------
    def log_prob(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """(B, T) log-likelihood of every generation step, in nats."""
        params = self(images, labels, low_res)
        return self.head.log_prob(params, self.targets(images))

    def nll(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """(B,) negative log-likelihood of each whole image, in nats."""
        return -self.log_prob(images, labels, low_res).sum(dim=1)

    def bits_per_dim(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """(B,) bits per sub-pixel of each image (docs/model.md §5)."""
        return self.nll(images, labels, low_res) / (self.config.dims_per_image * math.log(2))

    # ----- input checks -----------------------------------------------------
    def check_inputs(self, images: Tensor, labels: Tensor | None, low_res: Tensor | None) -> None:
        """Clear one-line errors for inputs the model cannot take."""
        cfg = self.config
        check_image_tensor("images", images, cfg.image_size)
        if cfg.num_classes:
            if labels is None:
                raise ValueError(f"this model is class-conditional ({cfg.num_classes} classes): pass labels (B,)")
            if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
                kind = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
                raise ValueError(f"labels are {kind}; pass integer class ids (a long tensor of shape (B,))")
            if labels.shape != images.shape[:1]:
                raise ValueError(f"labels have shape {tuple(labels.shape)}; expected ({images.shape[0]},)")
            if labels.numel() and (labels.min() < 0 or labels.max() >= cfg.num_classes):
                raise ValueError(f"labels span {int(labels.min())}..{int(labels.max())}; expected 0..{cfg.num_classes - 1}")
        elif labels is not None:
            raise ValueError("this model is unconditional (num_classes=0): pass labels=None")
        if self.encoder is not None:
            if low_res is None:
                low = cfg.low_res_size
                raise ValueError(f"this super-resolution model needs low_res images of shape (B, {low}, {low}, 3)")
            check_image_tensor("low_res", low_res, cfg.low_res_size)
            if low_res.shape[0] != images.shape[0]:
                raise ValueError(f"low_res has {low_res.shape[0]} images for {images.shape[0]} targets")
        elif low_res is not None:
            raise ValueError("this model has no encoder (encoder_layers=0): pass low_res=None")


def check_image_tensor(name: str, images: Tensor, side: int) -> None:
    """uint8-like (B, side, side, 3) with values 0..255, or a ValueError naming ``name``."""
    expect = f"uint8 images of shape (B, {side}, {side}, 3) with values 0..255"
    if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != (side, side, CHANNELS):
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"{name} have shape {shape}; this model takes {expect}")
    if images.is_floating_point() or images.dtype == torch.bool:
        raise ValueError(f"{name} are {images.dtype}; this model takes {expect}")
    if images.dtype != torch.uint8 and images.numel():  # uint8 is in range by construction
        low, high = int(images.min()), int(images.max())
        if low < 0 or high >= LEVELS:
            raise ValueError(f"{name} values span {low}..{high}; expected 0..255")
