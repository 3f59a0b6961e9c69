"""Super-resolution (docs/model.md §6): the decoder of ``transformer.py`` given a low-resolution
image to enlarge, as the paper's encoder–decoder: ``ImageTransformer`` with three things more:

* an **encoder**: unmasked self-attention over the low-resolution image's sub-pixels;
* in every decoder layer, after self-attention, a **reading** of the encoder's output (the layer's
  conditioning sublayer, ``TransformerLayer.reading``):
  cross-attention to all of it (the paper's), or the cell add (``low_res_reading: cell_add``; not
  in the paper): a linear map of the encoder's outputs for the low-resolution pixel the step lies
  in, as good as cross-attention to that pixel alone and cheaper (no query or output projection
  per step: the map runs once per low-resolution pixel and is gathered for the steps);
* optionally the **cell sums** (``cell_remainder.py``; not in the paper): each step's input gets
  what the rest of its low-resolution cell must average to, and with ``exact_box_means`` the head
  draws only values that can still meet the input's box mean.

What each reading reads of the encoder's output is prepared once a pass (``LowResReading.prepare``:
cross-attention's keys and values, the cell add's mapped pixels), and once for a whole decoding
(``start_decoding``), where the cell sums run on from the values generated. With
``exact_box_means`` the head's parameters end with each step's value bounds (heads.py: a bounded
head), so ``forward`` returns one tensor, as the decoder's does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .attention import FLEX_BLOCK_SIZE, CrossAttention, CrossAttentionCache
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, ModelConfig
from .embedding import PositionEncoding, SubPixelEmbedding
from .heads import CategoricalHead, head_type
from .patterns import GenerationOrder
from .transformer import DecodingCache, ImageTransformer, TransformerLayer, check_image_tensor, check_labels, zero_start


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
        # the decoder's grid column of that pixel and channel: its sub-pixel, or (DMOL, one step a
        # pixel) the pixel itself
        per_pixel = head_type(config).steps_per_pixel
        target_cols = target_cols * per_pixel + channels % per_pixel
        self.register_buffer("channels", channels, persistent=False)
        self.register_buffer("rows", target_rows, persistent=False)
        self.register_buffer("cols", target_cols, persistent=False)
        self.embedding = SubPixelEmbedding(config.d_model, ordinal=True)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.superres.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, low_res: Tensor, positions: PositionEncoding) -> Tensor:
        """(B, h, w, 3) uint8 -> (B, 3·h·w, d), positions from the decoder's encoding."""
        values = self.order.grid_to_sequence(CategoricalHead.to_grid(low_res))  # sub-pixels, however the decoder steps
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

    def prepare(self, context: Tensor) -> CellAddCache:
        """What every step reads of the encoder's output ``context``: each low-res pixel mapped, once."""
        return CellAddCache(self.map_cells(context))

    def forward(self, cells: CellAddCache, start: Tensor | int, count: int) -> Tensor:
        """(B, t, d): each of ``count`` steps from ``start`` its low-res pixel's mapped encoding."""
        steps = start + torch.arange(count, device=cells.mapped.device)
        return cells.mapped.index_select(1, self.low_res_pixel_of_step[steps])


class LowResReading(nn.Module):
    """What one decoder layer reads of the encoder, after its self-attention (its conditioning
    sublayer), as ``config.superres.low_res_reading`` says: cross-attention (with add-and-norm) or
    the cell add."""

    def __init__(self, config: ModelConfig, low_res_pixel_of_step: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel of each step, which the cell add reads."""
        super().__init__()
        d = config.d_model
        cross_attention = config.superres.low_res_reading == "cross_attention"
        self.cross_attn = CrossAttention(d, config.attention.n_heads, config.head_size) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d) if cross_attention else None
        self.cell_add = None if cross_attention else CellAdd(d, low_res_pixel_of_step)
        # Post-norm normalises after every add; pre-norm has nothing to normalise before the
        # cell add, which reads no hidden state.
        self.cell_norm = nn.LayerNorm(d) if self.cell_add is not None and config.norm == "post" else None

    def prepare(self, context: Tensor) -> CrossAttentionCache | CellAddCache:
        """What the steps read of the encoder's output ``context``, computed once: a pass's, or a
        whole decoding's."""
        if self.cross_attn is not None:
            return self.cross_attn.prepare(context)
        return self.cell_add.prepare(context)

    def forward(self, x: Tensor, layer: TransformerLayer, prepared: CrossAttentionCache | CellAddCache,
                start: Tensor | int) -> Tensor:
        """(B, t, d) after ``layer``'s self-attention, the steps from ``start`` on -> (B, t, d) with
        the encoder read from what ``prepare`` made, added as ``layer`` adds its branches."""
        if self.cross_attn is not None:
            branch = self.cross_attn(layer.branch_input(x, self.cross_norm), prepared)
            return layer.add(x, branch, self.cross_norm)
        return layer.add(x, self.cell_add(prepared, start, x.shape[1]), self.cell_norm)

    def writer(self) -> nn.Linear:
        """The reading's last map into the residual stream: cross-attention's output projection or
        the cell add's map."""
        return self.cross_attn.proj if self.cross_attn is not None else self.cell_add.proj


class SuperResolutionTransformer(ImageTransformer):
    """The decoder given a low-resolution image (B, h, w, 3) as ``low_res``, read through an encoder
    (docs/model.md §6): ``ImageTransformer`` with the encoder, the cell sums, and each layer's
    reading of the encoder. ``kernel``, ``flex_block_size``: the decoder's."""

    def __init__(self, config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE,
                 activation_checkpointing: bool = False) -> None:
        if config.superres is None:
            raise UserError("a config without a superres section is a plain decoder: ImageTransformer(config)")
        # Built in this order (the order of a fresh model's random draws): the decoder, the
        # encoder, the cell sums, then each decoder layer's reading, its conditioning sublayer.
        super().__init__(config, kernel, flex_block_size, activation_checkpointing)
        self.encoder = Encoder(config)
        self.cell_remainder = None
        if config.superres.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, self.low_res_pixel_of_step(), self.step_channels)
        for layer in self.layers:
            layer.reading = LowResReading(config, self.low_res_pixel_of_step())
        if config.superres.low_res_zero_start:
            zero_start(self.low_res_writers())

    @property
    def readings(self) -> list[LowResReading]:
        """Each decoder layer's reading of the encoder, in layer order."""
        return [layer.reading for layer in self.layers]

    def low_res_pixel_of_step(self) -> Tensor:
        """(T,): the low-resolution pixel each decoder step lies in, as a raster index (what the
        cell add and the cell remainder read)."""
        scale = self.config.image_size // self.config.superres.low_res_size
        pixel_cols = self.step_cols // self.head.steps_per_pixel
        return (self.step_rows // scale) * self.config.superres.low_res_size + pixel_cols // scale

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read the low-resolution input (trained at their own rate), in the order the
        optimiser's group lists their parameters: the encoder, the cell sums, the readings."""
        return [part for part in (self.encoder, self.cell_remainder, *self.readings) if part is not None]

    def low_res_writers(self) -> list[nn.Linear]:
        """The last maps on the way from the low-res input into the decoder's residual stream,
        which ``low_res_zero_start`` starts at zero: each reading's, the cell remainder's projection."""
        writers = [reading.writer() for reading in self.readings]
        return writers + ([self.cell_remainder.proj] if self.cell_remainder is not None else [])

    def read_low_res(self, low_res: Tensor) -> list[CrossAttentionCache | CellAddCache]:
        """What each layer reads of ``low_res`` (B, h, w, 3), through the encoder: once a pass."""
        context = self.encoder(low_res, self.positions)  # (B, 3·h·w, d)
        return [reading.prepare(context) for reading in self.readings]

    def low_res_inputs(self, previous: Tensor, steps: Tensor, low_res: Tensor | None,
                       remainder: RemainderCache | None) -> tuple[Tensor | None, Tensor | None]:
        """(B, t, d) what the cell sums add to each step's input (``cell_remainder_input``) and
        (B, t, 2c) its value bounds (``exact_box_means``), each None without them: from ``low_res``
        (teacher-forced) or, decoding, the sums so far (``remainder``)."""
        if self.cell_remainder is None:
            return None, None
        state = self.cell_remainder.cell_state(previous, steps, low_res, remainder)
        bounds = self.cell_remainder.bounds(*state) if self.config.superres.exact_box_means else None
        return self.cell_remainder.embed(self.cell_remainder.features(*state)), bounds

    def start_decoding(self, batch: int, labels: Tensor | None = None, low_res: Tensor | None = None) -> DecodingCache:
        """An empty cache for decoding ``batch`` images of ``low_res``; the encoder runs here, once."""
        cache = super().start_decoding(batch, labels, low_res)
        cache.readings = self.read_low_res(low_res)
        cache.remainder = None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)
        return cache

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


def build_model(config: ModelConfig, kernel: str = "auto", flex_block_size: int = FLEX_BLOCK_SIZE,
                activation_checkpointing: bool = False) -> ImageTransformer:
    """The network ``config`` describes: the decoder, or with a ``superres`` section the
    super-resolution model. ``kernel`` ("auto", "flex", "sdpa") and ``flex_block_size`` (16, 32, 64,
    128): how its decoder's self-attention runs, the same numbers every way (attention.py);
    ``activation_checkpointing``: its decoder layers' activations recomputed in the backward pass."""
    kind = SuperResolutionTransformer if config.superres else ImageTransformer
    return kind(config, kernel, flex_block_size, activation_checkpointing)
