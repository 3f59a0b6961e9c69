"""Model configuration: one dataclass that fully describes an Image Transformer.

docs/model.md §1 (representations and grids), §2 (inputs), §3 (layers), §4 (attention
kinds and block sizes), §5 (heads), §6 (super-resolution encoder), §8 (presets).
The configuration is stored in every checkpoint so that evaluation and sampling
rebuild the model from the file alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, NoReturn, get_args

# The choices of each field, once: the annotations below, and the tuples the checks read.
Head = Literal["categorical", "dmol"]
Attention = Literal["local_1d", "local_2d", "full"]
PositionEncodingKind = Literal["sinusoidal", "learned"]
Norm = Literal["post", "pre"]
AttentionKernel = Literal["auto", "flex", "sdpa"]
LowResReading = Literal["cross_attention", "cell_add"]
RelativePositions = Literal["none", "rotary"]
# Relative positions that lost to rotary ones (0.1 bits/dim at quick's size, three seeds) and were
# removed; the last commit that reads a model with one:
REMOVED_RELATIVE_POSITIONS = ("table", "distance", "rotary_distance")
LAST_COMMIT_WITH_THEM = "0bb0603"
# Local cross-attention (a radius of low-res cells around each step) lost to the cell add, which
# reads the step's own low-res pixel as well as radius 0 did in 17 % less time, and was removed;
# the last commit that reads a model with one. A saved model's null radius (every cell) is today's
# cross-attention.
REMOVED_CROSS_ATTENTION_RADIUS = "cross_attention_radius"
LAST_COMMIT_WITH_RADIUS = "1ba98d3"
HEADS, ATTENTIONS, POSITION_ENCODINGS, NORMS, ATTENTION_KERNELS, LOW_RES_READINGS, RELATIVE_POSITIONS = (
    get_args(choice) for choice in (Head, Attention, PositionEncodingKind, Norm, AttentionKernel, LowResReading,
                                    RelativePositions))
# FlexAttention's kernel blocks: powers of two (its tiles), from its CUDA kernel's smallest to its
# default, FLEX_BLOCK_SIZE (128 queries × 128 keys).
FLEX_BLOCK_SIZE = 128
FLEX_BLOCK_SIZES = (16, 32, 64, FLEX_BLOCK_SIZE)
CHANNELS = 3  # RGB
LEVELS = 256  # values of one sub-pixel
# Half the value range, 127.5: v / HALF_RANGE - 1 maps the integers 0..255 onto [-1, 1]
# (the DMOL head's and the pixel embedding's scale).
HALF_RANGE = (LEVELS - 1) / 2


@dataclass
class ModelConfig:
    image_size: int = 32  # side of the square target image, in pixels
    head: Head = "categorical"  # §5: one position per sub-pixel or per pixel
    n_layers: int = 12
    d_model: int = 512
    n_heads: int = 4
    d_filter: int = 2048  # hidden size of the feed-forward sublayer
    dropout: float = 0.3  # on input embeddings and residual branches (T2T: attention dropout is 0)
    attention: Attention = "local_1d"
    # 1D local attention (§4): query blocks of this many positions, in raster order ...
    query_block_length: int = 256
    # ... each also seeing this many whole previous blocks (T2T: exactly one).
    memory_blocks: int = 1
    # 2D local attention (§4): query block (rows, cols) in grid cells, and the flange
    # (rows above, cols either side) of memory around it. T2T default: (16,16), (16,32).
    # Any flange height is causal: in block-raster order every row above a block belongs
    # to an earlier row of blocks.
    query_block_shape: tuple[int, int] = (16, 16)
    memory_flange: tuple[int, int] = (16, 32)
    position_encoding: PositionEncodingKind = "sinusoidal"
    num_classes: int = 0  # 0 = unconditional; else one learned vector per class (§2)
    norm: Norm = "post"  # post-LayerNorm is the paper's block (§3)
    mixture_components: int = 10  # K of the DMOL head (§5); unused by the categorical head
    # Super-resolution (§6): 0 = plain decoder; >0 = encoder layers over a low-res image.
    encoder_layers: int = 0
    low_res_size: int = 8  # side of the encoder's input image, in pixels
    # True: each decoder step also gets the mean that the not-yet-generated values of
    # its low-res cell must have for the cell to box-average to the input (exact for
    # the box-mean inputs of §6; imagetx/model/cell_remainder.py). Not in the paper.
    cell_remainder_input: bool = False
    # True: each step's distribution is restricted to the values that can still give its cell
    # the input's rounded box mean, renormalised (per DMOL component and channel): samples
    # downsample to their input exactly, and no mass goes to images that would not.
    # Needs cell_remainder_input, whose sums give the bounds. Not in the paper.
    exact_box_means: bool = False
    # How each decoder layer reads the encoder (§6): "cross_attention" (the paper's), or
    # "cell_add": after self-attention, a linear map of the encoder's outputs for the low-res
    # pixel the step lies in (imagetx/model/superres.py; not in the paper), as good as cross-attention
    # to that pixel alone and cheaper: no query or output projection per step.
    low_res_reading: LowResReading = "cross_attention"
    # True: the maps that write the low-res input into the decoder (cross-attention's output
    # projection, the cell add, the cell remainder's) start at zero, so a new model's outputs do
    # not depend on its input until it learns to read it. Not in the paper.
    low_res_zero_start: bool = False
    # How decoder self-attention sees where each key lies relative to its query (§4; not in the
    # paper, whose inputs carry absolute positions only): "none", or "rotary", 2D rotary embeddings
    # of queries and keys (imagetx/model/rotary.py: nothing added to the scores).
    relative_positions: RelativePositions = "none"
    # §4: how attention runs: "flex" = FlexAttention, block-sparse (imagetx/model/attention.py); "sdpa" =
    # the gathered blocks through scaled_dot_product_attention; "auto" = flex on CUDA, sdpa
    # elsewhere (FlexAttention has no backward on the CPU). Same numbers either way.
    attention_kernel: AttentionKernel = "auto"
    # FlexAttention's kernel blocks for decoder self-attention: queries × keys, a power of two from
    # 16 (the smallest tile its CUDA kernel computes) to 128 (its default). Blocks a pattern allows
    # none of are skipped, so blocks the size of a one-row query block compute fewer masked pairs;
    # larger blocks keep the GPU's matrix units busier. Same numbers for every size.
    flex_block_size: int = FLEX_BLOCK_SIZE

    def __post_init__(self) -> None:
        # YAML and JSON hand us lists; the dataclass promises tuples.
        self.query_block_shape = tuple(self.query_block_shape)  # type: ignore[assignment]
        self.memory_flange = tuple(self.memory_flange)  # type: ignore[assignment]

    # ----- derived geometry -------------------------------------------------
    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the generation grid: sub-pixels for categorical, pixels for DMOL."""
        if self.head == "categorical":
            return self.image_size, self.image_size * CHANNELS
        return self.image_size, self.image_size

    @property
    def rotary(self) -> bool:
        """Whether decoder self-attention turns its queries and keys by their grid positions."""
        return self.relative_positions == "rotary"

    @property
    def head_size(self) -> int:
        """Channels of one attention head: d_model / n_heads."""
        return self.d_model // self.n_heads

    @property
    def dims_per_image(self) -> int:
        """Sub-pixels per image: the denominator of bits/dim (§5)."""
        return self.image_size * self.image_size * CHANNELS

    # ----- validation --------------------------------------------------------
    def validate(self) -> "ModelConfig":
        """Raise ValueError naming the field, its value and what would be valid."""
        self._check_choices()
        self._check_network()
        self._check_low_res_input()
        self._check_attention_blocks()
        return self

    def _check_choices(self) -> None:
        if self.relative_positions in REMOVED_RELATIVE_POSITIONS:
            _invalid("relative_positions", self.relative_positions,
                     "this kind was removed (rotary positions learn faster at no kernel cost); use 'rotary' or "
                     f"'none', or commit {LAST_COMMIT_WITH_THEM} of imagetx to read a model trained with it")
        for name, choices in (
            ("head", HEADS),
            ("attention", ATTENTIONS),
            ("position_encoding", POSITION_ENCODINGS),
            ("norm", NORMS),
            ("attention_kernel", ATTENTION_KERNELS),
            ("low_res_reading", LOW_RES_READINGS),
            ("relative_positions", RELATIVE_POSITIONS),
        ):
            if getattr(self, name) not in choices:
                _invalid(name, getattr(self, name), f"choose one of {', '.join(choices)}")

    def _check_network(self) -> None:
        """The decoder's sizes, heads, dropout, classes and mixture."""
        for name in ("image_size", "n_layers", "d_model", "n_heads", "d_filter"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                _invalid(name, value, "must be a positive integer")
        if self.d_model % self.n_heads:
            _invalid("n_heads", self.n_heads, f"must divide d_model={self.d_model} (e.g. {_divisors(self.d_model)})")
        if self.d_model % 2:
            _invalid("d_model", self.d_model, "must be even: half encodes the row, half the column")
        if self.rotary and self.head_size % 4:
            _invalid("relative_positions", self.relative_positions,
                     f"needs a head size (d_model / n_heads = {self.head_size}) divisible by 4, "
                     "in dimension pairs for rows and for columns: change n_heads or d_model")
        if not 0.0 <= self.dropout < 1.0:
            _invalid("dropout", self.dropout, "must be in [0, 1)")
        if self.num_classes < 0:
            _invalid("num_classes", self.num_classes, "must be 0 (unconditional) or the number of classes")
        if self.head == "dmol" and self.mixture_components < 1:
            _invalid("mixture_components", self.mixture_components, "must be at least 1")

    def _check_low_res_input(self) -> None:
        """The encoder and how the decoder reads the low-resolution input."""
        if self.encoder_layers < 0:
            _invalid("encoder_layers", self.encoder_layers, "must be 0 (no encoder) or a positive count")
        if self.encoder_layers and (self.low_res_size < 1 or self.image_size % self.low_res_size):
            _invalid("low_res_size", self.low_res_size, f"must divide image_size={self.image_size}")
        if self.cell_remainder_input and not self.encoder_layers:
            _invalid("cell_remainder_input", self.cell_remainder_input,
                     "needs a low-resolution input: set encoder_layers > 0")
        if self.exact_box_means and not self.cell_remainder_input:
            _invalid("exact_box_means", self.exact_box_means,
                     "reads the cell sums of the cell remainder input: set cell_remainder_input: true")
        if self.low_res_reading == "cell_add" and not self.encoder_layers:
            _invalid("low_res_reading", self.low_res_reading, "needs a low-resolution input: set encoder_layers > 0")

    def _check_attention_blocks(self) -> None:
        """The blocks of local self-attention against the generation grid."""
        rows, cols = self.grid_shape
        size = self.flex_block_size
        if not isinstance(size, int) or size not in FLEX_BLOCK_SIZES:
            _invalid("flex_block_size", size, f"choose one of {', '.join(map(str, FLEX_BLOCK_SIZES))}")
        if self.attention == "local_1d":
            if self.query_block_length < 1:
                _invalid("query_block_length", self.query_block_length, "must be a positive integer")
            if self.memory_blocks < 0:
                _invalid("memory_blocks", self.memory_blocks, "must be 0 or more previous blocks")
        if self.attention == "local_2d":
            qh, qw = self.query_block_shape
            fh, fw = self.memory_flange
            if qh < 1 or rows % qh:
                _invalid("query_block_shape", self.query_block_shape,
                         f"block height must divide the grid's {rows} rows (grid {rows}x{cols}, {self.head} head)")
            if qw < 1 or cols % qw:
                _invalid("query_block_shape", self.query_block_shape,
                         f"block width must divide the grid's {cols} columns (grid {rows}x{cols}, {self.head} head)")
            if fh < 0 or fw < 0:
                _invalid("memory_flange", self.memory_flange, "flange sizes must be 0 or more")

    # ----- (de)serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["query_block_shape"] = list(self.query_block_shape)
        out["memory_flange"] = list(self.memory_flange)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        values = dict(values)
        if values.pop(REMOVED_CROSS_ATTENTION_RADIUS, None) is not None:
            raise ValueError(f"ModelConfig.{REMOVED_CROSS_ATTENTION_RADIUS} was removed (the cell add reads the step's "
                             "own low-res pixel as well, faster): use low_res_reading 'cell_add' or a null radius, "
                             f"or commit {LAST_COMMIT_WITH_RADIUS} of imagetx to read a model trained with one")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**values)


def _invalid(field: str, value: Any, valid: str) -> NoReturn:
    raise ValueError(f"ModelConfig.{field}={value!r} is invalid: {valid}")


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]
