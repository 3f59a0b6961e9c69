"""The layers of the Image Transformer (docs/model.md §3, §6): one transformer layer (post- or
pre-LayerNorm, optionally reading the low-res input) and the super-resolution encoder, with a
layer's decoding cache. ``transformer.py`` stacks them into the network.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor, nn

from .attention import CrossAttention, CrossAttentionCache, SelfAttention, SelfAttentionCache
from .cell_add import CellAdd, CellAddCache
from .config import CHANNELS, ModelConfig
from .embedding import PositionEncoding, SubPixelEmbedding
from .order import GenerationOrder, images_to_sequence
from .patterns import CausalPattern
from .rotary import Rotary2D


@dataclass
class LayerCache:
    """One decoder layer's decoding state: its self-attention ring, and what reads the low-res
    input: cross-attention's keys and values, or the cell add's mapped cells."""

    self_attn: SelfAttentionCache
    low_res: CrossAttentionCache | CellAddCache | None = None


def zero_start(linears: Iterable[nn.Linear]) -> None:
    """Set each map's weight and bias to zero, in place: a branch that writes nothing until it learns to."""
    for linear in linears:
        nn.init.zeros_(linear.weight)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


class TransformerLayer(nn.Module):
    """Self-attention [+ a reading of the low-res input: cross-attention or the cell add] +
    feed-forward, each with add-and-norm (docs/model.md §3, §6)."""

    def __init__(self, config: ModelConfig, pattern: CausalPattern | None = None, rotary: Rotary2D | None = None,
                 reads_low_res: bool = False, low_res_pixel_of_step: Tensor | None = None) -> None:
        """``pattern``: a decoder layer, causal under it, with ``config.relative_positions``
        (``rotary``: the decoder's one ``Rotary2D``, which every layer shares); without, an
        encoder layer. ``reads_low_res``: a super-resolution decoder layer, reading the encoder
        as ``config.low_res_reading`` says; the cell add needs ``low_res_pixel_of_step`` (T,),
        the low-res pixel of each step."""
        super().__init__()
        d = config.d_model
        self.pre_norm = config.norm == "pre"
        self.self_attn = SelfAttention(d, config.n_heads, pattern, config.attention_kernel, rotary)
        self.self_norm = nn.LayerNorm(d)
        cross_attention = reads_low_res and config.low_res_reading == "cross_attention"
        self.cross_attn = CrossAttention(d, config.n_heads) if cross_attention else None
        self.cross_norm = nn.LayerNorm(d) if cross_attention else None
        cell_add = reads_low_res and config.low_res_reading == "cell_add"
        self.cell_add = CellAdd(d, low_res_pixel_of_step) if cell_add else None
        # Post-norm normalises after every add; pre-norm has nothing to normalise before the
        # cell add, which reads no hidden state.
        self.cell_norm = nn.LayerNorm(d) if cell_add and not self.pre_norm else None
        self.ffn = nn.Sequential(nn.Linear(d, config.d_filter), nn.ReLU(), nn.Linear(config.d_filter, d))
        self.ffn_norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.dropout)

    def add_and_norm(self, x: Tensor, branch, norm: nn.LayerNorm) -> Tensor:
        """x + branch(x) with dropout, normalised after (the paper's) or before (pre-norm)."""
        if self.pre_norm:
            return x + self.dropout(branch(norm(x)))
        return norm(x + self.dropout(branch(x)))

    def residual_writers(self) -> list[nn.Linear]:
        """The last map of every branch that adds into the residual stream: self-attention's output
        projection, the low-res reading's (cross-attention's output or the cell add's map) and the
        feed-forward's second linear. With all of them at zero a pre-norm layer is the identity."""
        reading = [self.cross_attn.to_out] if self.cross_attn is not None else []
        reading += [self.cell_add.proj] if self.cell_add is not None else []
        return [self.self_attn.to_out, *reading, self.ffn[-1]]

    def start_decoding(self, batch: int, context: Tensor | None = None) -> LayerCache:
        """This layer's empty decoding cache (the low-res reading's: over ``context``, once)."""
        reader = self.cross_attn if self.cross_attn is not None else self.cell_add
        low_res = None if reader is None else reader.start_decoding(context)
        return LayerCache(self.self_attn.start_decoding(batch), low_res)

    def forward(self, x: Tensor, context: Tensor | None = None, cache: LayerCache | None = None,
                start: Tensor | int = 0) -> Tensor:
        """(B, t, d), the steps from ``start`` on -> (B, t, d): every step, or with ``cache`` (and no
        ``context``: the cache holds it) the next t steps, one decoding step or a prefill."""
        self_cache, low_res_cache = (None, None) if cache is None else (cache.self_attn, cache.low_res)
        x = self.add_and_norm(x, lambda h: self.self_attn(h, self_cache, start), self.self_norm)
        if self.cross_attn is not None:
            x = self.add_and_norm(x, lambda h: self.cross_attn(h, context, low_res_cache), self.cross_norm)
        if self.cell_add is not None:
            x = x + self.dropout(self.cell_add(context, low_res_cache, start, x.shape[1]))
            if self.cell_norm is not None:
                x = self.cell_norm(x)
        return self.add_and_norm(x, self.ffn, self.ffn_norm)


class Encoder(nn.Module):
    """Unmasked self-attention over the low-resolution image's sub-pixels (docs/model.md §6).

    Each low-resolution sub-pixel is placed, for its position encoding, at the centre of the
    high-resolution cells it summarises, using the decoder's own position encoding, so that
    cross-attention can match the low-resolution input under each target cell by position. Its
    value table starts
    ordinal (``SubPixelEmbedding``), so intensities are readable from the first step.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        side = config.low_res_size
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
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.encoder_layers))
        self.final_norm = nn.LayerNorm(config.d_model) if config.norm == "pre" else nn.Identity()

    def forward(self, low_res: Tensor, positions: PositionEncoding) -> Tensor:
        """(B, h, w, 3) uint8 -> (B, 3·h·w, d), positions from the decoder's encoding."""
        values = images_to_sequence(low_res, self.order, "categorical")
        x = self.embedding(values, self.channels) + positions(self.rows, self.cols)
        x = self.dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)
