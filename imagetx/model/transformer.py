"""The Image Transformer's decoder (docs/model.md §1–§3, §5, §7): a plain ``nn.Module``.

Images are sequences of values in generation order (sub-pixels, or pixels for the DMOL head). Step
t's input is the value of step t − 1 (step 0's: nothing) embedded, plus step t's position and the
image's class; layers of masked self-attention and feed-forward, then the head, map it to step t's
distribution:

    targets = model.targets(images)                        # (B, T) or (B, T, 3)
    params = model(previous_values(targets), labels=...)   # (B, T, P): every step at once
    cache = model.start_decoding(B, labels)                # or over a kv-cache:
    params = model(previous, cache)                        # (B, t, P): the next t steps

One ``forward`` serves training, scoring, a prefill and decoding. Conditioning is composed, as in
DiT's ``block(x, c)``: a model built around this decoder passes a per-step input, each layer's ``c``
and cross-attention ``context`` to ``forward`` as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import UserError
from .attention import (FLEX_BLOCK_SIZE, CrossAttention, CrossAttentionCache, KVCache, Rotary2D, SelfAttention,
                        check_kernel, may_use_flex)
from .config import CHANNELS, LEVELS, ModelConfig
from .heads import head_type, params_and_bounds
from .patterns import PatternIndex, pattern_for


# ----- what the model takes, checked: one UserError each ------------------------------------------
# Shapes and dtypes are metadata, free to check. Values (labels in range, non-uint8 images in 0..255)
# are read back from the device, which waits for it: ``values=False`` skips them, for data checked as read.
def check_image_tensor(name: str, images: Tensor, side: int, values: bool = True) -> None:
    """uint8-like (B, side, side, 3) with values 0..255 (``values``: checked), or a UserError naming ``name``."""
    expect = f"uint8 images of shape (B, {side}, {side}, 3) with values 0..255"
    if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != (side, side, CHANNELS):
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise UserError(f"{name} have shape {shape}; this model takes {expect}")
    if images.is_floating_point() or images.dtype == torch.bool:
        raise UserError(f"{name} are {images.dtype}; this model takes {expect}")
    if values and images.dtype != torch.uint8 and images.numel():  # uint8 is in range by construction
        low, high = int(images.min()), int(images.max())
        if low < 0 or high >= LEVELS:
            raise UserError(f"{name} values span {low}..{high}; expected 0..255")


def check_labels(labels: Tensor | None, count: int, num_classes: int, name: str = "labels",
                 values: bool = True) -> None:
    """None for an unconditional model (``num_classes`` 0), else (count,) integer class ids in range
    (``values``: checked); or a UserError naming ``name``, the argument or option they came from."""
    if not num_classes:
        if labels is not None:
            raise UserError(f"{name} given, but this model is unconditional (num_classes=0): give no labels")
        return
    if labels is None:
        raise UserError(f"this model is class-conditional ({num_classes} classes): "
                        f"give {name}, a class id in 0..{num_classes - 1} per image")
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        kind = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise UserError(f"{name} are {kind}; give integer class ids (a long tensor of shape ({count},))")
    if labels.shape != (count,):
        raise UserError(f"{name} have shape {tuple(labels.shape)}; expected ({count},), one per image")
    if values and labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        low, high = int(labels.min()), int(labels.max())
        given = f"{name} {low} is" if count == 1 else f"{name} span {low}..{high}"
        raise UserError(f"{given} outside 0..{num_classes - 1}")


def check_transforms(transforms: Tensor | None, count: int, num_transforms: int, values: bool = True) -> None:
    """None (the identity), or (count,) transform ids of distribution augmentation, checked as labels are."""
    if transforms is None:
        return
    if not num_transforms:
        raise UserError("transforms given, but this model takes none (num_transforms=0): give no transforms")
    check_labels(transforms, count, num_transforms, "transforms", values)


# ----- row and column position encodings (docs/model.md §2) -------------------------------------
# T2T's timing signal: wavelengths from 2π positions (neighbours told apart) to 2π·10,000 (no two rows
# or columns of any grid here alike); every shipped model was trained with it.
SINUSOID_BASE = 10_000.0
# GPT-2's start for learned position tables: small beside the value embeddings' unit-size entries, so
# that positions start as a nudge to each step's input.
LEARNED_POSITION_STD = 0.02


def sinusoid(positions: Tensor, dim: int) -> Tensor:
    """(T,) integer positions -> (T, dim) sin/cos features with geometric frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(SINUSOID_BASE) * torch.arange(half, dtype=torch.float32) / max(half, 1))
    angles = positions.float()[:, None] * freqs[None, :]
    out = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return nn.functional.pad(out, (0, dim - out.shape[-1]))  # odd dim: one zero column


class PositionEncoding(nn.Module):
    """Row and column encodings for a rows×cols grid, concatenated to d, looked up in tables: learned,
    or sinusoids kept as a buffer, so that one decoding step's position is an index, not a recomputation."""

    def __init__(self, rows: int, cols: int, d_model: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.row_dim, self.col_dim = d_model // 2, d_model - d_model // 2
        if kind == "learned":
            self.rows = nn.Embedding(rows, self.row_dim)
            self.cols = nn.Embedding(cols, self.col_dim)
            nn.init.normal_(self.rows.weight, std=LEARNED_POSITION_STD)
            nn.init.normal_(self.cols.weight, std=LEARNED_POSITION_STD)
        else:
            self.register_buffer("row_table", sinusoid(torch.arange(rows), self.row_dim), persistent=False)
            self.register_buffer("col_table", sinusoid(torch.arange(cols), self.col_dim), persistent=False)

    def forward(self, rows: Tensor, cols: Tensor) -> Tensor:
        """(T,) grid rows and columns -> (T, d)."""
        if self.kind == "learned":
            return torch.cat([self.rows(rows), self.cols(cols)], dim=-1)
        return torch.cat([self.row_table[rows], self.col_table[cols]], dim=-1)


class TransformerLayer(nn.Module):
    """Self-attention, the optional conditioning sublayers, then a feed-forward, each a residual branch
    with dropout (docs/model.md §3, §6). Causal under a mask pattern's ``index`` (with ``rotary``; both
    shared by every layer); without one it sees every position. Conditioning, as built: ``conditioned``,
    a per-step ``c`` (B, t, d) added after self-attention (DiT's ``c``); ``cross_attention``, attention
    to a ``context`` (the paper's encoder–decoder)."""

    def __init__(self, d_model: int, n_heads: int, d_filter: int, dropout: float, pre_norm: bool = True,
                 index: PatternIndex | None = None, rotary: Rotary2D | None = None, kernel: str = "auto",
                 head_size: int | None = None, cross_attention: bool = False, conditioned: bool = False) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.self_attn = SelfAttention(d_model, n_heads, index, kernel, rotary, head_size)
        self.self_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_filter), nn.ReLU(), nn.Linear(d_filter, d_model))
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        # Registered last, so that layers without them keep their parameters' order. Post-norm
        # normalises after every add, ``c``'s too; pre-norm adds ``c`` as it is.
        self.c_norm = nn.LayerNorm(d_model) if conditioned and not pre_norm else None
        self.cross_attn = CrossAttention(d_model, n_heads, head_size) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d_model) if cross_attention else None

    def forward(self, x: Tensor, cache: KVCache | None = None, start: Tensor | int = 0,
                c: Tensor | None = None, context: CrossAttentionCache | None = None) -> Tensor:
        """(B, t, d), the steps from ``start`` on -> (B, t, d): every step (no cache), or the next t over
        the kv-cache ``cache``; ``c`` (B, t, d) their conditioning, ``context`` cross-attention's keys and values."""
        if not self.pre_norm:
            return self.post_norm_forward(x, cache, start, c, context)
        drop = self.dropout
        x = x + drop(self.self_attn(self.self_norm(x), cache, start))
        if c is not None:
            x = x + drop(c)
        if self.cross_attn is not None:
            x = x + drop(self.cross_attn(self.cross_norm(x), context))
        return x + drop(self.ffn(self.ffn_norm(x)))

    def post_norm_forward(self, x: Tensor, cache: KVCache | None, start: Tensor | int,
                          c: Tensor | None, context: CrossAttentionCache | None) -> Tensor:
        """The paper's ``forward`` (``norm: post``): each branch takes the residual stream, every sum normalised."""
        drop = self.dropout
        x = self.self_norm(x + drop(self.self_attn(x, cache, start)))
        if c is not None:
            x = self.c_norm(x + drop(c))
        if self.cross_attn is not None:
            x = self.cross_norm(x + drop(self.cross_attn(x, context)))
        return self.ffn_norm(x + drop(self.ffn(x)))

    def residual_writers(self) -> list[nn.Linear]:
        """The output maps of self-attention and of the feed-forward, which add into the residual stream:
        with both at zero a pre-norm layer without conditioning is the identity."""
        return [self.self_attn.proj, self.ffn[-1]]


def layer_sizes(config: ModelConfig) -> dict:
    """The numbers every ``TransformerLayer`` of ``config``'s model is built from, by keyword."""
    return dict(d_model=config.d_model, n_heads=config.attention.n_heads, d_filter=config.d_filter,
                dropout=config.dropout, pre_norm=config.norm == "pre", head_size=config.head_size)


def zero_start(linears: list[nn.Linear]) -> None:
    """Set each map's weight and bias to zero, in place: a branch that adds nothing until it learns to."""
    for linear in linears:
        nn.init.zeros_(linear.weight)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


def previous_values(targets: Tensor) -> Tensor:
    """(B, T[, 3]) targets -> (B, T[, 3]) each step's input, the step before's target (step 0: zeros, unread)."""
    return torch.cat([torch.zeros_like(targets[:, :1]), targets[:, :-1]], dim=1)


@dataclass
class DecodingCache:
    """What the decoder keeps between decoding steps, written in place: ``step`` (0-d long, on the model's
    device), the step decoded next, the one step counter; the class vector (B, 1, d) or None; each
    self-attention layer's kv-cache."""

    step: Tensor
    condition: Tensor | None
    layers: list[KVCache]


class AutoregressiveModel(nn.Module):
    """What a model over an image's steps offers, written once against its ``forward`` ((B, t[, 3]) the
    value before each step -> (B, t, P) the head's parameters, or those and (B, t, 2c) value bounds:
    ``heads.params_and_bounds``), ``conditioning`` and ``start_decoding``: a decoding step, a prefill,
    likelihoods. The decoder is one (``ImageTransformer``); a model composing it with conditioning of
    its own another."""

    head: nn.Module  # the output distribution (heads.py)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config.validate()
        self.pattern = pattern_for(config)  # the decoder's self-attention mask, and with it the generation order
        self.order = self.pattern.order
        self.register_buffer("step_rows", self.order.grid_cell()[0], persistent=False)  # (T,) each step's grid row

    def decode_step(self, previous: Tensor, cache) -> Tensor | tuple[Tensor, Tensor]:
        """(B,) or (B, 3) the value of step t − 1 -> (B, P) step t's parameters, the full pass's (at t = 0
        ``previous`` counts for nothing); with bounds, ((B, P), (B, 2c)). ``cache``: what this model's
        ``start_decoding`` returned, written in place. No branch reads a value: every step runs one graph."""
        params, bounds = params_and_bounds(self(previous[:, None], cache))
        return params[:, 0] if bounds is None else (params[:, 0], bounds[:, 0])

    def prefill(self, given: Tensor, cache) -> Tensor | tuple[Tensor, Tensor]:
        """(B, P[, 3]) a completion's first P values, at once into a fresh cache -> (B, P, params) (and
        bounds), the full pass's first P steps; every cache left as P ``decode_step`` calls leave it. The
        last value is not read: it is the next ``decode_step``'s ``previous``."""
        length = given.shape[1]
        if not 0 < length <= self.order.length:
            raise UserError(f"prefill takes 1..{self.order.length} steps, not {length}")
        if int(cache.step):  # read once per prefill: the layers attend from step 0
            raise UserError(f"prefill fills a fresh cache (from start_decoding), not one at step {int(cache.step)}")
        return self(previous_values(given), cache)

    # ----- likelihoods ----------------------------------------------------------
    def targets(self, images: Tensor) -> Tensor:
        """(B, H, W, 3) -> (B, T) sub-pixel values or (B, T, 3) pixels, in generation order."""
        return self.order.grid_to_sequence(self.head.to_grid(images.long()))

    def images(self, sequence: Tensor) -> Tensor:
        """``targets``' inverse: (B, T[, 3]) values in generation order -> (B, H, W, 3)."""
        return self.head.to_images(self.order.sequence_to_grid(sequence))

    def log_prob(self, images: Tensor, labels: Tensor | None = None, *, check: bool = True,
                 **inputs: Tensor | None) -> Tensor:
        """uint8 images (B, H, W, 3) -> (B, T) log-likelihood of every step, in nats; ``inputs``: the
        model's other conditioning, by name (``conditioning``). ``check`` False reads no value back from
        the device (shapes and dtypes only), for data whose values were checked as read."""
        check_image_tensor("images", images, self.config.image_size, check)
        given = self.conditioning(images.shape[0], labels, values=check, **inputs)
        targets = self.targets(images)
        params, bounds = params_and_bounds(self(previous_values(targets), **given))
        return self.head.log_prob(params, targets, bounds)

    def nll(self, images: Tensor, labels: Tensor | None = None, *, given_rows: int = 0, check: bool = True,
            **inputs: Tensor | None) -> Tensor:
        """(B,) negative log-likelihood of each whole image, in nats; with ``given_rows`` = k, of the
        part below the first k rows given them (image completion, ``given_steps``)."""
        log_p = self.log_prob(images, labels, check=check, **inputs)
        return -(log_p[:, ~self.given_steps(given_rows)] if given_rows else log_p).sum(dim=1)

    def bits_per_dim(self, images: Tensor, labels: Tensor | None = None, *, given_rows: int = 0, check: bool = True,
                     **inputs: Tensor | None) -> Tensor:
        """(B,) bits per scored sub-pixel of each image (docs/model.md §5): all of them, or those
        below the first ``given_rows`` rows; ``transforms``, among ``inputs``: the images' transform
        ids (None: the identity)."""
        nats = self.nll(images, labels, given_rows=given_rows, check=check, **inputs)
        cfg = self.config
        return nats / (cfg.dims_per_image * (cfg.image_size - given_rows) // cfg.image_size * math.log(2))

    def given_steps(self, rows: int) -> Tensor:
        """(T,) bool: the steps in the first ``rows`` image rows, which a completion gives. In block-raster
        order they must be whole rows of query blocks, so that every given step comes before every other
        and the steps scored are exactly p(rest | given)."""
        cfg = self.config
        if not 0 <= rows <= cfg.image_size:
            raise UserError(f"given_rows={rows} is invalid: give 0..{cfg.image_size} rows")
        block_height = cfg.attention.query_block_shape[0]
        if cfg.attention.kind == "local_2d" and rows % block_height:
            raise UserError(f"given_rows={rows}: with 2D blocks of height {block_height} the given rows must be a "
                            "whole number of block rows, to come first in generation order")
        return self.step_rows < rows  # grid rows are image rows


class ImageTransformer(AutoregressiveModel):
    """The decoder-only autoregressive model over sub-pixels or pixels. ``kernel``, ``flex_block_size``:
    how self-attention runs (attention.py), the same numbers every way; ``activation_checkpointing``:
    each layer's activations recomputed in the backward pass (memory for compute, the same numbers);
    ``cross_attention``, ``conditioned``: the layers' conditioning sublayers (``TransformerLayer``)."""

    def __init__(self, config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE,
                 activation_checkpointing: bool = False, cross_attention: bool = False,
                 conditioned: bool = False) -> None:
        check_kernel(kernel, flex_block_size)
        super().__init__(config)
        self.activation_checkpointing, self.flex_block_size = activation_checkpointing, flex_block_size
        d = config.d_model
        _, cols = self.order.grid_cell()
        self.register_buffer("step_cols", cols, persistent=False)
        self.register_buffer("step_channels", cols % CHANNELS, persistent=False)
        head = head_type(config)  # what a step is, its grid and its input embedding; built last, below
        self.value_embedding = head.input_embedding(d)
        self.positions = PositionEncoding(*config.grid_shape, d, config.position_encoding)
        self.class_embedding = nn.Embedding(config.num_classes, d) if config.num_classes else None
        self.transform_embedding = nn.Embedding(config.num_transforms, d) if config.num_transforms else None
        self.input_dropout = nn.Dropout(config.dropout)
        # Shared by every layer (no parameters); FlexAttention's block mask kept only where it may run.
        index = PatternIndex(self.pattern, flex_block_size if may_use_flex(kernel, config.head_size) else None)
        rotary = Rotary2D(config.head_size, self.order) if config.rotary else None
        self.layers = nn.ModuleList(TransformerLayer(**layer_sizes(config), index=index, rotary=rotary, kernel=kernel,
                                                     cross_attention=cross_attention, conditioned=conditioned)
                                    for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(d) if config.norm == "pre" else nn.Identity()
        self.head = head.from_config(config)

    def inputs(self, previous: Tensor, steps: Tensor, condition: Tensor | None, extra: Tensor | None = None) -> Tensor:
        """(B, t[, 3]) the value before each of ``steps`` (t,) -> (B, t, d): embedded with its channel
        (step 0's times 0: it has none), plus the step's position, the class vector (B, 1, d) and
        ``extra`` (B, t, d), a per-step input built from earlier values only; then dropout."""
        embedded = self.value_embedding(previous, self.step_channels[(steps - 1) % self.order.length])
        x = embedded * (steps > 0)[:, None] + self.positions(self.step_rows[steps], self.step_cols[steps])
        if condition is not None:
            x = x + condition
        if extra is not None:
            x = x + extra
        return self.input_dropout(x)

    def forward(self, previous: Tensor, cache: DecodingCache | None = None, labels: Tensor | None = None, *,
                transforms: Tensor | None = None, extra: Tensor | None = None, c: Iterable[Tensor] | None = None,
                context: Iterable[CrossAttentionCache] | None = None) -> Tensor:
        """(B, t[, 3]) the value before each step -> (B, t, P) the head's parameters: every step
        teacher-forced (no cache; ``labels`` and ``transforms`` (B,) ids), or the t steps from the
        kv-cache's counter on (its class and transform its own). Conditioning from a composing model:
        ``extra`` (B, t, d) added to the inputs; per layer, ``c`` (B, t, d) and ``context``."""
        start, condition = (0, self.condition(labels, transforms)) if cache is None else (cache.step, cache.condition)
        steps = start + torch.arange(previous.shape[1], device=previous.device)  # (t,)
        x = self.inputs(previous, steps, condition, extra)  # (B, t, d)
        nothing = [None] * len(self.layers)
        kv_caches = nothing if cache is None else cache.layers
        recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for layer, kv_cache, layer_c, layer_context in zip(self.layers, kv_caches, c or nothing, context or nothing):
            if recompute:  # the layer run again in the backward pass, its random state (dropout) kept
                x = checkpoint(layer, x, kv_cache, start, layer_c, layer_context, use_reentrant=False)
            else:
                x = layer(x, kv_cache, start, layer_c, layer_context)  # (B, t, d): the layer's own call, which hooks and wrappers see
        if cache is not None:
            cache.step += previous.shape[1]  # after the pass, whose layers read the counter as their start
        return self.head(self.final_norm(x))  # (B, t, P)

    def condition(self, labels: Tensor | None, transforms: Tensor | None = None) -> Tensor | None:
        """(B,) labels and transform ids -> (B, 1, d), their vectors summed as DiT sums its ``c``, or None;
        with ``num_transforms`` but no ids, the identity's (id 0), (1, 1, d) for every image."""
        vectors = [] if labels is None else [self.class_embedding(labels)[:, None]]
        if self.transform_embedding is not None:
            table = self.transform_embedding.weight
            vectors.append(table[:1][None] if transforms is None else self.transform_embedding(transforms)[:, None])
        return sum(vectors[1:], vectors[0]) if vectors else None

    def start_decoding(self, batch: int, labels: Tensor | None = None, *, transforms: Tensor | None = None,
                       **inputs: Tensor | None) -> DecodingCache:
        """An empty cache for decoding ``batch`` images with ``forward``, at step 0; ``inputs``: ``conditioning``'s."""
        self.conditioning(batch, labels, transforms=transforms, **inputs)
        step = torch.zeros((), dtype=torch.long, device=self.step_rows.device)
        kv_caches = [layer.self_attn.start_decoding(batch) for layer in self.layers]
        return DecodingCache(step, self.condition(labels, transforms), kv_caches)

    def conditioning(self, count: int, labels: Tensor | None, *, values: bool = True,
                     transforms: Tensor | None = None, **inputs: Tensor | None) -> dict[str, Tensor | None]:
        """Labels and transform ids for ``count`` images, checked (``values``: their values too), as
        ``forward``'s keyword arguments; ``inputs``, a composing model's conditioning: here, any given is refused."""
        check_labels(labels, count, self.config.num_classes, values=values)
        check_transforms(transforms, count, self.config.num_transforms, values)
        refused = [name for name, value in inputs.items() if value is not None]
        if refused:
            raise UserError(f"this model takes no {refused[0]} input: pass {refused[0]}=None")
        return {"labels": labels, "transforms": transforms}
