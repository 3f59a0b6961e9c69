"""Super-resolution (docs/model.md §6): the decoder of ``transformer.py`` given a low-resolution
image to enlarge, as the paper's encoder–decoder. It extends the decoder in three places:

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
the cell add its mapped pixels, and the cell sums run on from the values generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .attention import CrossAttention
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, ModelConfig
from .embedding import PositionEncoding, SubPixelEmbedding
from .inputs import check_image_tensor
from .order import GenerationOrder, images_to_sequence
from .patterns import CausalPattern
from .rotary import Rotary2D
from .transformer import ImageTransformer, LayerCache, TransformerLayer, zero_start


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


class SuperResolutionLayer(TransformerLayer):
    """A decoder layer that reads the encoder after self-attention, as ``config.superres.low_res_reading``
    says: cross-attention (with add-and-norm) or the cell add."""

    def __init__(self, config: ModelConfig, pattern: CausalPattern, rotary: Rotary2D | None,
                 low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel of each step, which the cell add reads."""
        super().__init__(config, pattern, rotary, low_res_pixel_of_step=low_res_pixel_of_step)

    def add_reading(self, config: ModelConfig, low_res_pixel_of_step: Tensor) -> None:
        d = config.d_model
        cross_attention = config.superres.low_res_reading == "cross_attention"
        self.cross_attn = CrossAttention(d, config.attention.n_heads) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d) if cross_attention else None
        self.cell_add = None if cross_attention else CellAdd(d, low_res_pixel_of_step)
        # Post-norm normalises after every add; pre-norm has nothing to normalise before the
        # cell add, which reads no hidden state.
        self.cell_norm = nn.LayerNorm(d) if self.cell_add is not None and config.norm == "post" else None

    def read_context(self, x: Tensor, context: Tensor | None, cache: object | None, start: Tensor | int) -> Tensor:
        if self.cross_attn is not None:
            return self.add_and_norm(x, lambda h: self.cross_attn(h, context, cache), self.cross_norm)
        x = x + self.dropout(self.cell_add(context, cache, start, x.shape[1]))
        return x if self.cell_norm is None else self.cell_norm(x)

    def reader(self) -> CrossAttention | CellAdd:
        return self.cross_attn if self.cross_attn is not None else self.cell_add

    def reading_writer(self) -> nn.Linear:
        """The reading's last map into the residual stream: cross-attention's output projection or
        the cell add's map."""
        return self.cross_attn.to_out if self.cross_attn is not None else self.cell_add.proj

    def residual_writers(self) -> list[nn.Linear]:
        """Self-attention's output projection, the reading's and the feed-forward's second linear."""
        return [self.self_attn.to_out, self.reading_writer(), self.ffn[-1]]

    def start_decoding(self, batch: int, context: Tensor | None = None) -> LayerCache:
        """This layer's empty decoding cache, and what it reads of ``context``, computed once."""
        return LayerCache(self.self_attn.start_decoding(batch), self.reader().start_decoding(context))


class SuperResolutionTransformer(ImageTransformer):
    """The decoder given a low-resolution image (B, h, w, 3) as ``low_res``, read through an encoder
    (docs/model.md §6)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)  # the decoder, calling add_inputs and new_layer below where it builds its parts
        if config.superres.low_res_zero_start:
            zero_start(self.low_res_writers())

    def add_inputs(self, config: ModelConfig) -> None:
        self.encoder = Encoder(config)
        self.cell_remainder = None
        if config.superres.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, self.low_res_pixel_of_step(), self.step_channels)

    def new_layer(self, config: ModelConfig, rotary: Rotary2D | None) -> SuperResolutionLayer:
        return SuperResolutionLayer(config, self.pattern, rotary, self.low_res_pixel_of_step())

    def step_cells(self) -> tuple[Tensor, Tensor]:
        """(rows, cols), each (T,): the low-resolution pixel each decoder step lies in."""
        scale = self.config.image_size // self.config.superres.low_res_size
        pixel_cols = self.step_cols // CHANNELS if self.config.head == "categorical" else self.step_cols
        return self.step_rows // scale, pixel_cols // scale

    def low_res_pixel_of_step(self) -> Tensor:
        """(T,): the low-resolution pixel each decoder step lies in, as a raster index (what the
        cell add and the cell remainder read)."""
        rows, cols = self.step_cells()
        return rows * self.config.superres.low_res_size + cols

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read the low-resolution input: the encoder, every layer's cross-attention
        (and its norm) or cell add (and its norm), the cell remainder input."""
        readers = [part for layer in self.layers
                   for part in (layer.cross_attn, layer.cross_norm, layer.cell_add, layer.cell_norm)
                   if part is not None]
        return [part for part in (self.encoder, *readers, self.cell_remainder) if part is not None]

    def low_res_writers(self) -> list[nn.Linear]:
        """The last maps on the way from the low-res input into the decoder's residual stream,
        which ``low_res_zero_start`` starts at zero: cross-attention's output projections, the
        cell adds' maps, the cell remainder's projection."""
        writers = [layer.reading_writer() for layer in self.layers]
        return writers + ([self.cell_remainder.proj] if self.cell_remainder is not None else [])

    def encode(self, low_res: Tensor | None) -> Tensor:
        return self.encoder(low_res, self.positions)

    def side_inputs(self, values: Tensor, low_res: Tensor | None = None, state: RemainderCache | None = None,
                    steps: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """The cell sums' (``CellRemainder.cell_state``'s arguments): the remainder features, embedded
        (``cell_remainder_input``), and the value bounds (``exact_box_means``), each (B, t, ·) or None."""
        if self.cell_remainder is None:
            return None, None
        cell_state = self.cell_remainder.cell_state(values, low_res, state, steps)
        bounds = self.cell_remainder.bounds(*cell_state) if self.config.superres.exact_box_means else None
        return self.cell_remainder.embed(self.cell_remainder.features(*cell_state)), bounds

    def value_bounds(self, targets: Tensor, low_res: Tensor | None = None) -> Tensor | None:
        """(B, T, 2c) the values each step may take (``exact_box_means``), or None."""
        if not self.config.superres.exact_box_means:
            return None
        return self.cell_remainder.bounds(*self.cell_remainder.cell_state(targets, low_res))

    def start_side_inputs(self, low_res: Tensor | None) -> RemainderCache | None:
        return None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)

    def decoder_inputs(self, shifted: Tensor, steps: Tensor | slice, condition: Tensor | None,
                       side: Tensor | None = None) -> Tensor:
        if self.cell_remainder is not None and side is None:
            raise ValueError("this model reads the cell remainder (cell_remainder_input=True): "
                             "pass side=model.side_inputs(targets, low_res)[0]")
        return super().decoder_inputs(shifted, steps, condition, side)

    def check_conditioning(self, count: int, labels: Tensor | None, low_res: Tensor | None) -> None:
        """Labels and the low-resolution input as this model needs them, for ``count`` images."""
        super().check_conditioning(count, labels, None)  # the labels, as the decoder checks them
        low = self.config.superres.low_res_size
        if low_res is None:
            raise ValueError(f"this super-resolution model needs low_res images of shape (B, {low}, {low}, 3)")
        check_image_tensor("low_res", low_res, low, self.check_values)
        if low_res.shape[0] != count:
            raise ValueError(f"low_res has {low_res.shape[0]} images for {count} targets")


def build_model(config: ModelConfig) -> ImageTransformer:
    """The network ``config`` describes: the decoder, or with a ``superres`` section the super-resolution model."""
    return (SuperResolutionTransformer if config.superres else ImageTransformer)(config)
