"""Super-resolution (docs/model.md §6): the decoder of ``transformer.py`` given a low-resolution
image to enlarge, as the paper's encoder–decoder: a model composed of ``ImageTransformer`` and

* an **encoder**: unmasked self-attention over the low-resolution image's sub-pixels;
* in every decoder layer, after self-attention, a **reading** of the encoder's output: the layer's
  cross-attention to all of it (the paper's; ``TransformerLayer(cross_attention=True)``), or the
  cell add (``low_res_reading: cell_add``; not in the paper), the layer's ``c``: a linear map of
  the encoder's outputs for the low-resolution pixel the step lies in, as good as
  cross-attention to that pixel alone and cheaper (no query or output projection per step: the
  map runs once per low-resolution pixel and is gathered for the steps);
* optionally the **cell sums** (``cell_remainder.py``; not in the paper): each step's input gets
  what the rest of its low-resolution cell must average to, and with ``exact_box_means`` the head
  draws only values that can still meet the input's box mean.

What each layer reads of the encoder's output is prepared once a pass (``read``: cross-attention's
keys and values, the cell add's mapped pixels), and once for a whole decoding (``start_decoding``,
kept as ``SuperResolutionCache.context``), where the cell sums run on from the values generated;
``forward`` hands them to the decoder's as arguments. With ``exact_box_means`` ``forward`` (and so
``decode_step`` and ``prefill``) returns the head's parameters and, beside them, each step's value
bounds, which the head's scores and draws take (heads.py, ``params_and_bounds``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .attention import FLEX_BLOCK_SIZE, CrossAttentionCache
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, LEVELS, ModelConfig
from .heads import CategoricalHead, SubPixelEmbedding, head_type
from .patterns import GenerationOrder
from .transformer import (AutoregressiveModel, DecodingCache, ImageTransformer, PositionEncoding, TransformerLayer,
                          check_image_tensor, layer_sizes, zero_start)


def downsample_area(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, size, size, 3): the box mean of each (H/size)² patch, rounded
    half up (T2T "resize by area"; docs/model.md §6). Exact integer arithmetic, no float rounding doubt."""
    batch, height, width, channels = images.shape
    if height % size or width % size:
        raise UserError(f"cannot box-downsample {height}x{width} to {size}x{size}: size must divide both")
    fh, fw = height // size, width // size
    patches = images.long().view(batch, size, fh, size, fw, channels).sum(dim=(2, 4))
    area = fh * fw
    return ((2 * patches + area) // (2 * area)).to(torch.uint8)  # floor(mean + ½)


@torch.no_grad()
def ordinal_start(table: Tensor) -> None:
    """A value table (3·256, d), in place: row v of each channel := lerp(row 0, row 255, v / 255), keeping
    the random ends, so that intensity is readable from the first step (docs/model.md §6)."""
    rows = table.view(CHANNELS, LEVELS, -1)
    fraction = torch.linspace(0.0, 1.0, LEVELS, dtype=rows.dtype)[None, :, None]
    rows.copy_(rows[:, :1] + (rows[:, -1:] - rows[:, :1]) * fraction)


class Encoder(nn.Module):
    """Unmasked self-attention over the low-resolution image's sub-pixels (docs/model.md §6).

    Each low-resolution sub-pixel is placed, for its position encoding, at the centre of the
    high-resolution cells it summarises, using the decoder's own position encoding, so that
    cross-attention can match the low-resolution input under each target cell by position. Its
    value table starts ordinal (``ordinal_start``), so intensities are readable from the
    first step.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        side = config.superres.low_res_size
        self.order = GenerationOrder(side, side * CHANNELS)
        rows, cols = self.order.grid_cell()
        pixel_cols, channels = cols // CHANNELS, cols % CHANNELS
        scale = config.image_size // side
        target_rows = rows * scale + scale // 2
        target_cols = pixel_cols * scale + scale // 2
        # the decoder's grid column of that pixel and channel: its sub-pixel, or (DMOL, one step a
        # pixel) the pixel itself
        per_pixel = head_type(config).steps_per_pixel
        target_cols = target_cols * per_pixel + channels % per_pixel
        self.register_buffer("channels", channels, persistent=False)
        self.register_buffer("rows", target_rows, persistent=False)
        self.register_buffer("cols", target_cols, persistent=False)
        self.embedding = SubPixelEmbedding(config.d_model)
        ordinal_start(self.embedding.table.weight)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(**layer_sizes(config)) for _ in range(config.superres.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, low_res: Tensor, positions: PositionEncoding) -> Tensor:
        """(B, h, w, 3) uint8 -> (B, 3·h·w, d), positions from the decoder's encoding."""
        values = self.order.grid_to_sequence(CategoricalHead.to_grid(low_res))  # sub-pixels, however the decoder steps
        x = self.embedding(values, self.channels) + positions(self.rows, self.cols)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


class CellAdd(nn.Module):
    """Encoder output (B, 3·h·w, d) -> (B, t, d): per step, a linear map of its low-res pixel's
    3 sub-pixel encodings, a decoder layer's ``c`` (the cell add)."""

    def __init__(self, d_model: int, low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel (raster index) each decoder step lies in."""
        super().__init__()
        self.proj = nn.Linear(CHANNELS * d_model, d_model)
        self.register_buffer("low_res_pixel_of_step", low_res_pixel_of_step, persistent=False)

    def prepare(self, context: Tensor) -> Tensor:
        """(B, 3·h·w, d) -> (B, h·w, d): every low-res pixel mapped, once a pass or a decoding. The
        encoder's sub-pixels are in raster order, a pixel's 3 channels adjacent (``Encoder.order``):
        one row of 3·d per low-res pixel."""
        return self.proj(rearrange(context, "b (p c) d -> b p (c d)", c=CHANNELS))

    def forward(self, mapped: Tensor, steps: Tensor) -> Tensor:
        """(B, h·w, d) ``prepare``d pixels -> (B, t, d): each of ``steps`` (t,) its low-res pixel's."""
        return mapped.index_select(1, self.low_res_pixel_of_step[steps])


@dataclass
class LowResContext:
    """What the decoder reads of a low-resolution input, prepared once a pass or a decoding: per
    decoder layer its cross-attention's keys and values, or its cell add's mapped pixels (B, h·w, d);
    and the cell sums' state while decoding (None: without them, or a pass's)."""

    layers: list[CrossAttentionCache] | list[Tensor]
    remainder: RemainderCache | None = None


@dataclass
class SuperResolutionCache:
    """What decoding keeps between steps: the decoder's cache (its step counter, class vector and
    kv-caches) and the low-resolution input's context, prepared once."""

    decoder: DecodingCache
    context: LowResContext

    @property
    def step(self) -> Tensor:
        """0-d long: the step decoded next (the decoder's counter)."""
        return self.decoder.step


class SuperResolutionTransformer(AutoregressiveModel):
    """The decoder given a low-resolution image (B, h, w, 3) as ``low_res``, read through an encoder
    (docs/model.md §6): composed of the decoder (``ImageTransformer``, its layers built with their
    conditioning sublayers), the encoder, the cell sums and the cell adds, whose outputs ``forward``
    hands to the decoder as arguments. ``kernel``, ``flex_block_size``, ``activation_checkpointing``: the
    decoder's."""

    def __init__(self, config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE,
                 activation_checkpointing: bool = False) -> None:
        if config.superres is None:
            raise UserError("a config without a superres section is a plain decoder: ImageTransformer(config)")
        super().__init__(config)
        # Built in this order (the order of a fresh model's random draws and of the optimiser's
        # parameters): the decoder (with its layers' cross-attention), the encoder, the cell sums,
        # then each layer's cell add.
        cross_attention = config.superres.low_res_reading == "cross_attention"
        self.decoder = ImageTransformer(config, kernel, flex_block_size, activation_checkpointing,
                                        cross_attention=cross_attention, conditioned=not cross_attention)
        self.encoder = Encoder(config)
        self.cell_remainder = None
        if config.superres.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, self.low_res_pixel_of_step(), self.decoder.step_channels)
        self.cell_adds = None
        if not cross_attention:
            self.cell_adds = nn.ModuleList(CellAdd(config.d_model, self.low_res_pixel_of_step())
                                           for _ in self.decoder.layers)
        if config.superres.low_res_zero_start:
            zero_start(self.low_res_writers())

    @property
    def head(self) -> nn.Module:
        """The decoder's output distribution."""
        return self.decoder.head

    def low_res_pixel_of_step(self) -> Tensor:
        """(T,): the low-resolution pixel each decoder step lies in, as a raster index (what the
        cell add and the cell remainder read)."""
        scale = self.config.image_size // self.config.superres.low_res_size
        pixel_cols = self.decoder.step_cols // self.head.steps_per_pixel
        return (self.step_rows // scale) * self.config.superres.low_res_size + pixel_cols // scale

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read the low-resolution input (trained at their own rate), in the order the
        optimiser's group lists their parameters: the encoder, the cell sums, then per decoder layer
        its cross-attention and norm, or its cell add (and, post-norm, the norm after it)."""
        layers = self.decoder.layers
        if self.cell_adds is None:
            readings = [part for layer in layers for part in (layer.cross_attn, layer.cross_norm)]
        else:
            readings = [part for cell_add, layer in zip(self.cell_adds, layers) for part in (cell_add, layer.c_norm)]
        return [part for part in (self.encoder, self.cell_remainder, *readings) if part is not None]

    def low_res_writers(self) -> list[nn.Linear]:
        """The last maps on the way from the low-res input into the decoder's residual stream,
        which ``low_res_zero_start`` starts at zero: each layer's cross-attention output or cell
        add, the cell remainder's projection."""
        if self.cell_adds is None:
            writers = [layer.cross_attn.proj for layer in self.decoder.layers]
        else:
            writers = [cell_add.proj for cell_add in self.cell_adds]
        return writers + ([self.cell_remainder.proj] if self.cell_remainder is not None else [])

    def read(self, low_res: Tensor) -> LowResContext:
        """What each decoder layer reads of ``low_res`` (B, h, w, 3), through the encoder: once a pass."""
        context = self.encoder(low_res, self.decoder.positions)  # (B, 3·h·w, d)
        if self.cell_adds is None:
            return LowResContext([layer.cross_attn.prepare(context) for layer in self.decoder.layers])
        return LowResContext([cell_add.prepare(context) for cell_add in self.cell_adds])

    def forward(self, previous: Tensor, cache: SuperResolutionCache | None = None,
                labels: Tensor | None = None, low_res: Tensor | None = None,
                transforms: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The decoder's ``forward`` given ``low_res`` (teacher-forced) or the cache's: (B, t[, 3]) ->
        (B, t, P), with ``exact_box_means`` ((B, t, P), (B, t, 2c) each step's value bounds)."""
        start, context = (0, self.read(low_res)) if cache is None else (cache.step, cache.context)
        decoder_cache = None if cache is None else cache.decoder
        steps = start + torch.arange(previous.shape[1], device=previous.device)  # (t,)
        extra = bounds = None
        if self.cell_remainder is not None:  # from low_res (teacher-forced) or, decoding, the sums so far
            state = self.cell_remainder.cell_state(previous, steps, low_res, context.remainder)
            extra = self.cell_remainder.embed(self.cell_remainder.features(*state))  # (B, t, d)
            bounds = self.cell_remainder.bounds(*state) if self.config.superres.exact_box_means else None
        if self.cell_adds is None:
            params = self.decoder(previous, decoder_cache, labels, transforms=transforms, extra=extra,
                                  context=context.layers)
        else:  # each layer's c made as the decoder reaches it
            c = (cell_add(mapped, steps) for cell_add, mapped in zip(self.cell_adds, context.layers))
            params = self.decoder(previous, decoder_cache, labels, transforms=transforms, extra=extra, c=c)
        return params if bounds is None else (params, bounds)

    def start_decoding(self, batch: int, labels: Tensor | None = None, *, transforms: Tensor | None = None,
                       low_res: Tensor | None = None, **inputs: Tensor | None) -> SuperResolutionCache:
        """An empty cache for decoding ``batch`` images of ``low_res``; the encoder runs here, once.
        ``inputs``: any other, which the decoder refuses."""
        decoder = self.decoder.start_decoding(batch, labels, transforms=transforms, **inputs)
        self.check_low_res(batch, low_res)
        remainder = None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)
        return SuperResolutionCache(decoder, replace(self.read(low_res), remainder=remainder))

    def conditioning(self, count: int, labels: Tensor | None, *, values: bool = True, transforms: Tensor | None = None,
                     low_res: Tensor | None = None, **inputs: Tensor | None) -> dict[str, Tensor | None]:
        """Labels, transform ids and the low-resolution input as this model needs them, for ``count``
        images (``values``: their values checked too), as ``forward``'s keyword arguments; labels,
        transforms and any other input (refused) as the decoder's ``conditioning`` takes them."""
        given = self.decoder.conditioning(count, labels, values=values, transforms=transforms, **inputs)
        self.check_low_res(count, low_res, values)
        return {**given, "low_res": low_res}

    def check_low_res(self, count: int, low_res: Tensor | None, values: bool = True) -> None:
        """``low_res`` (count, h, w, 3) uint8-like (``values``: 0..255, checked), or a UserError."""
        low = self.config.superres.low_res_size
        if low_res is None:
            raise UserError(f"this super-resolution model needs low_res images of shape (B, {low}, {low}, 3)")
        check_image_tensor("low_res", low_res, low, values)
        if low_res.shape[0] != count:
            raise UserError(f"low_res has {low_res.shape[0]} images for {count} targets")


def build_model(config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE,
                activation_checkpointing: bool = False) -> AutoregressiveModel:
    """The network ``config`` describes: the decoder, or with a ``superres`` section the
    super-resolution model. ``kernel`` ("auto", "flex", "sdpa") and ``flex_block_size`` (16, 32, 64,
    128): how its decoder's self-attention runs, the same numbers every way (attention.py);
    ``activation_checkpointing``: its decoder layers' activations recomputed in the backward pass."""
    kind = SuperResolutionTransformer if config.superres else ImageTransformer
    return kind(config, kernel, flex_block_size, activation_checkpointing)
