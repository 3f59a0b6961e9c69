"""Super-resolution (docs/model.md §6): the decoder of ``transformer.py`` given a low-resolution
image to enlarge, as the paper's encoder–decoder. It holds the decoder and runs its parts with
three things of its own:

* an **encoder**: unmasked self-attention over the low-resolution image's sub-pixels;
* in every decoder layer, after self-attention, a **reading** of the encoder's output:
  cross-attention to all of it (the paper's), or the cell add (``low_res_reading: cell_add``; not
  in the paper): a linear map of the encoder's outputs for the low-resolution pixel the step lies
  in, as good as cross-attention to that pixel alone and cheaper (no query or output projection
  per step: the map runs once per low-resolution pixel and is gathered for the steps);
* optionally the **cell sums** (``cell_remainder.py``; not in the paper): each step's input gets
  what the rest of its low-resolution cell must average to, and with ``exact_box_means`` the head
  draws only values that can still meet the input's box mean.

Decoding, the encoder runs once (``start_decoding``): cross-attention keeps its keys and values,
the cell add its mapped pixels, and the cell sums run on from the values generated. ``forward``
returns what it computes: the head's parameters and, with ``exact_box_means``, each step's value
bounds (else None).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .attention import FLEX_BLOCK_SIZE, CrossAttention, CrossAttentionCache
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, ModelConfig
from .embedding import PositionEncoding, SubPixelEmbedding
from .heads import CategoricalHead, DMOLHead
from .inputs import check_image_tensor, check_labels
from .order import GenerationOrder, images_to_sequence
from .transformer import (DecodingCache, ImageTransformer, TransformerLayer, image_nll, previous_values, scored_dims,
                          zero_start)


class Encoder(nn.Module):
    """Unmasked self-attention over the low-resolution image's sub-pixels (docs/model.md §6).

    Each low-resolution sub-pixel is placed, for its position encoding, at the centre of the
    high-resolution cells it summarises, using the decoder's own position encoding, so that
    cross-attention can match the low-resolution input under each target cell by position. Its
    value table starts ordinal (``SubPixelEmbedding``), so intensities are readable from the
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
        if config.head == "categorical":  # decoder columns are sub-pixels
            target_cols = target_cols * CHANNELS + channels
        self.register_buffer("channels", channels, persistent=False)
        self.register_buffer("rows", target_rows, persistent=False)
        self.register_buffer("cols", target_cols, persistent=False)
        self.embedding = SubPixelEmbedding(config.d_model, ordinal=True)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.superres.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, low_res: Tensor, positions: PositionEncoding) -> Tensor:
        """(B, h, w, 3) uint8 -> (B, 3·h·w, d), positions from the decoder's encoding."""
        values = images_to_sequence(low_res, self.order, "categorical")
        x = self.embedding(values, self.channels) + positions(self.rows, self.cols)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


@dataclass
class CellAddCache:
    """(B, h·w, d) every low-resolution pixel's mapped encoding."""

    mapped: Tensor


class CellAdd(nn.Module):
    """Encoder output (B, 3·h·w, d) -> (B, t, d): per step, a linear map of its low-res pixel's
    3 sub-pixel encodings."""

    def __init__(self, d_model: int, low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel (raster index) each decoder step lies in."""
        super().__init__()
        self.proj = nn.Linear(CHANNELS * d_model, d_model)
        self.register_buffer("low_res_pixel_of_step", low_res_pixel_of_step, persistent=False)

    def map_cells(self, context: Tensor) -> Tensor:
        """(B, 3·h·w, d) -> (B, h·w, d). The encoder's sub-pixels are in raster order, a
        pixel's 3 channels adjacent (``Encoder.order``): one row of 3·d per low-res pixel."""
        return self.proj(rearrange(context, "b (p c) d -> b p (c d)", c=CHANNELS))

    def start_decoding(self, context: Tensor) -> CellAddCache:
        return CellAddCache(self.map_cells(context))

    def forward(self, context: Tensor | None = None, cache: CellAddCache | None = None, start: Tensor | int = 0,
                count: int | None = None) -> Tensor:
        """(B, t, d): each of ``count`` steps from ``start`` (by default every step) its low-res
        pixel's mapped encoding, from ``context`` or, decoding, from ``cache``."""
        mapped = self.map_cells(context) if cache is None else cache.mapped
        count = self.low_res_pixel_of_step.numel() if count is None else count
        steps = start + torch.arange(count, device=mapped.device)
        return mapped.index_select(1, self.low_res_pixel_of_step[steps])


class LowResReading(nn.Module):
    """What one decoder layer reads of the encoder, after its self-attention, as
    ``config.superres.low_res_reading`` says: cross-attention (with add-and-norm) or the cell add."""

    def __init__(self, config: ModelConfig, low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel of each step, which the cell add reads."""
        super().__init__()
        d = config.d_model
        cross_attention = config.superres.low_res_reading == "cross_attention"
        self.cross_attn = CrossAttention(d, config.attention.n_heads) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d) if cross_attention else None
        self.cell_add = None if cross_attention else CellAdd(d, low_res_pixel_of_step)
        # Post-norm normalises after every add; pre-norm has nothing to normalise before the
        # cell add, which reads no hidden state.
        self.cell_norm = nn.LayerNorm(d) if self.cell_add is not None and config.norm == "post" else None

    def start_decoding(self, context: Tensor) -> CrossAttentionCache | CellAddCache:
        """What decoding reads of the encoder's output ``context``, computed once."""
        return (self.cross_attn if self.cross_attn is not None else self.cell_add).start_decoding(context)

    def forward(self, x: Tensor, layer: TransformerLayer, context: Tensor | None,
                cache: CrossAttentionCache | CellAddCache | None, start: Tensor | int) -> Tensor:
        """(B, t, d) after ``layer``'s self-attention -> (B, t, d) with the encoder read, added as
        ``layer`` adds its branches; from ``context``, or decoding from ``cache``."""
        if self.cross_attn is not None:
            h = self.cross_norm(x) if layer.pre_norm else x
            return layer.add(x, self.cross_attn(h, context, cache), self.cross_norm)
        return layer.add(x, self.cell_add(context, cache, start, x.shape[1]), self.cell_norm)

    def writer(self) -> nn.Linear:
        """The reading's last map into the residual stream: cross-attention's output projection or
        the cell add's map."""
        return self.cross_attn.to_out if self.cross_attn is not None else self.cell_add.proj


@dataclass
class SuperResolutionCache:
    """Decoding state: the decoder's (its step counter, its rings), what each layer reads of the
    encoder, and the cell sums (or None)."""

    decoder: DecodingCache
    readings: list[CrossAttentionCache | CellAddCache]
    remainder: RemainderCache | None


class SuperResolutionTransformer(nn.Module):
    """The decoder given a low-resolution image (B, h, w, 3) as ``low_res``, read through an encoder
    (docs/model.md §6). ``kernel``, ``flex_block_size``: the decoder's (``ImageTransformer``)."""

    def __init__(self, config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE) -> None:
        super().__init__()
        self.config = config.validate()
        if config.superres is None:
            raise UserError("a config without a superres section is a plain decoder: ImageTransformer(config)")
        # Registered in this order, the parts that read the low-res input come after the decoder's,
        # in the order the optimiser's groups have always listed them (encoder, cell sums, readings).
        self.decoder = ImageTransformer(dataclasses.replace(config, superres=None), kernel, flex_block_size)
        self.encoder = Encoder(config)
        self.cell_remainder = None
        if config.superres.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, self.low_res_pixel_of_step(), self.decoder.step_channels)
        self.readings = nn.ModuleList(LowResReading(config, self.low_res_pixel_of_step())
                                      for _ in range(config.n_layers))
        if config.superres.low_res_zero_start:
            zero_start(self.low_res_writers())

    @property
    def order(self) -> GenerationOrder:
        return self.decoder.order

    @property
    def head(self) -> CategoricalHead | DMOLHead:
        return self.decoder.head

    def low_res_pixel_of_step(self) -> Tensor:
        """(T,): the low-resolution pixel each decoder step lies in, as a raster index (what the
        cell add and the cell remainder read)."""
        decoder, scale = self.decoder, self.config.image_size // self.config.superres.low_res_size
        pixel_cols = decoder.step_cols // CHANNELS if self.config.head == "categorical" else decoder.step_cols
        return (decoder.step_rows // scale) * self.config.superres.low_res_size + pixel_cols // scale

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read the low-resolution input (trained at their own rate)."""
        return [part for part in (self.encoder, self.cell_remainder, self.readings) if part is not None]

    def low_res_writers(self) -> list[nn.Linear]:
        """The last maps on the way from the low-res input into the decoder's residual stream,
        which ``low_res_zero_start`` starts at zero: each reading's, the cell remainder's projection."""
        writers = [reading.writer() for reading in self.readings]
        return writers + ([self.cell_remainder.proj] if self.cell_remainder is not None else [])

    def cell_sums(self, previous: Tensor, low_res: Tensor | None, cache: RemainderCache | None,
                  steps: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """(B, t, d) what the cell sums add to each step's input (``cell_remainder_input``) and
        (B, t, 2c) its value bounds (``exact_box_means``), each None without them."""
        if self.cell_remainder is None:
            return None, None
        state = self.cell_remainder.cell_state(previous, steps, low_res, cache)
        bounds = self.cell_remainder.bounds(*state) if self.config.superres.exact_box_means else None
        return self.cell_remainder.embed(self.cell_remainder.features(*state)), bounds

    def forward(self, previous: Tensor, cache: SuperResolutionCache | None = None, labels: Tensor | None = None,
                low_res: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """(B, t[, 3]) the value before each step -> ((B, t, P) the head's parameters, (B, t, 2c)
        the steps' value bounds or None): every step teacher-forced given ``low_res`` (and
        ``labels``), or with ``cache`` the t steps from its counter on."""
        decoder = self.decoder
        if cache is None:
            start, condition = 0, None if labels is None else decoder.class_embedding(labels)[:, None]
            context, readings, remainder = self.encoder(low_res, decoder.positions), [None] * len(self.readings), None
        else:
            start, condition = cache.decoder.step, cache.decoder.condition
            context, readings, remainder = None, cache.readings, cache.remainder
        steps = start + torch.arange(previous.shape[1], device=previous.device)  # (t,)
        side, bounds = self.cell_sums(previous, low_res, remainder, steps)
        x = decoder.inputs(previous, steps, condition, side)  # (B, t, d)
        rings = [None] * len(decoder.layers) if cache is None else cache.decoder.layers
        for layer, reading, ring, read in zip(decoder.layers, self.readings, rings, readings):
            x = layer.attention_block(x, ring, start)  # (B, t, d)
            x = reading(x, layer, context, read, start)  # (B, t, d)
            x = layer.feed_forward_block(x)  # (B, t, d)
        if cache is not None:
            cache.decoder.step += previous.shape[1]
        return decoder.head(decoder.final_norm(x)), bounds  # (B, t, P), (B, t, 2c) or None

    # ----- decoding, one step at a time ---------------------------------------
    def start_decoding(self, batch: int, labels: Tensor | None = None,
                       low_res: Tensor | None = None) -> SuperResolutionCache:
        """An empty cache for decoding ``batch`` images of ``low_res``; the encoder runs here, once."""
        self.check_conditioning(batch, labels, low_res)
        context = self.encoder(low_res, self.decoder.positions)
        remainder = None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)
        return SuperResolutionCache(self.decoder.start_decoding(batch, labels),
                                    [reading.start_decoding(context) for reading in self.readings], remainder)

    def decode_step(self, previous: Tensor, cache: SuperResolutionCache) -> tuple[Tensor, Tensor | None]:
        """``ImageTransformer.decode_step``'s, with the step's value bounds: (B, P), (B, 1, 2c) or None."""
        params, bounds = self(previous[:, None], cache)
        return params[:, 0], bounds

    def prefill(self, given: Tensor, cache: SuperResolutionCache) -> tuple[Tensor, Tensor | None]:
        """``ImageTransformer.prefill``'s, with the steps' value bounds."""
        length = given.shape[1]
        if not 0 < length <= self.order.length:
            raise UserError(f"prefill takes 1..{self.order.length} steps, not {length}")
        if int(cache.decoder.step):
            raise UserError(f"prefill fills a fresh cache (from start_decoding), not one at step "
                            f"{int(cache.decoder.step)}")
        return self(previous_values(given), cache)

    # ----- likelihoods ----------------------------------------------------------
    def targets(self, images: Tensor) -> Tensor:
        return self.decoder.targets(images)

    def given_steps(self, rows: int) -> Tensor:
        return self.decoder.given_steps(rows)

    def log_prob(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
                 check: bool = True) -> Tensor:
        """``ImageTransformer.log_prob`` given ``low_res``."""
        check_image_tensor("images", images, self.config.image_size, check)
        self.check_conditioning(images.shape[0], labels, low_res, check)
        targets = self.targets(images)
        params, bounds = self(previous_values(targets), labels=labels, low_res=low_res)
        return self.head.log_prob(params, targets, bounds)

    def nll(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
            given_rows: int = 0, check: bool = True) -> Tensor:
        """``ImageTransformer.nll`` given ``low_res``."""
        log_p = self.log_prob(images, labels, low_res, check)
        return image_nll(log_p, self.given_steps(given_rows) if given_rows else None)

    def bits_per_dim(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
                     given_rows: int = 0, check: bool = True) -> Tensor:
        """``ImageTransformer.bits_per_dim`` given ``low_res``."""
        nats = self.nll(images, labels, low_res, given_rows, check)
        return nats / (scored_dims(self.config, given_rows) * math.log(2))

    def check_conditioning(self, count: int, labels: Tensor | None, low_res: Tensor | None,
                           values: bool = True) -> None:
        """Labels and the low-resolution input as this model needs them, for ``count`` images
        (``values``: their values checked too)."""
        check_labels(labels, count, self.config.num_classes, values=values)
        low = self.config.superres.low_res_size
        if low_res is None:
            raise UserError(f"this super-resolution model needs low_res images of shape (B, {low}, {low}, 3)")
        check_image_tensor("low_res", low_res, low, values)
        if low_res.shape[0] != count:
            raise UserError(f"low_res has {low_res.shape[0]} images for {count} targets")


def build_model(config: ModelConfig, kernel: str = "auto",
                flex_block_size: int = FLEX_BLOCK_SIZE) -> ImageTransformer | SuperResolutionTransformer:
    """The network ``config`` describes: the decoder, or with a ``superres`` section the
    super-resolution model. ``kernel`` ("auto", "flex", "sdpa") and ``flex_block_size`` (16, 32, 64,
    128): how its decoder's self-attention runs, the same numbers every way (attention.py)."""
    return (SuperResolutionTransformer if config.superres else ImageTransformer)(config, kernel, flex_block_size)
