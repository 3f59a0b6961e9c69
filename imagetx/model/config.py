"""Model configuration: the paper's hyper-parameters, the network's sizes and heads (docs/model.md
§1–§3, §5), with two sections: ``attention``, the self-attention's heads and mask (§4), and ``superres``,
when set, an encoder over a low-resolution input that conditions the decoder (§6). What the model
computes, not how it runs (the attention kernel and its tiles are ``build_model``'s options). Every
checkpoint stores it (``to_dict``: the attention kind's own geometry only), so that evaluation and
sampling rebuild the model from the file alone; ``imagetx.io.older`` reads older files' configurations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, NoReturn, get_args

from ..errors import UserError

# The choices of each field, once: the annotations below, and the tuples the checks read.
Head = Literal["categorical", "dmol"]
Attention = Literal["local_1d", "local_2d", "full"]
PositionEncodingKind = Literal["sinusoidal", "learned"]
Norm = Literal["post", "pre"]
LowResReading = Literal["cross_attention", "cell_add"]
RelativePositions = Literal["none", "rotary"]
HEADS, ATTENTIONS, POSITION_ENCODINGS, NORMS, LOW_RES_READINGS, RELATIVE_POSITIONS = (
    get_args(choice) for choice in (Head, Attention, PositionEncodingKind, Norm, LowResReading, RelativePositions))
# Each kind's own geometry, the only fields of it ``to_dict`` stores.
GEOMETRY = {"local_1d": ("query_block_length", "memory_blocks"), "local_2d": ("query_block_shape", "memory_flange"),
            "full": ()}
ATTENTION_DEFAULTS = {"query_block_length": 256, "memory_blocks": 1, "query_block_shape": (16, 16),
                      "memory_flange": (16, 32)}  # 2D: T2T's defaults
CHANNELS = 3  # RGB
LEVELS = 256  # values of one sub-pixel
# Half the value range, 127.5: v / HALF_RANGE - 1 maps the integers 0..255 onto [-1, 1]
# (the DMOL head's and the pixel embedding's scale).
HALF_RANGE = (LEVELS - 1) / 2


@dataclass
class AttentionConfig:
    """§4: decoder self-attention — its heads, which earlier positions each step sees, and where they lie."""
    n_heads: int = 4  # heads of every attention layer
    # Channels of each head (width n_heads × head_size, projected from and back to d_model); None: d_model / n_heads.
    head_size: int | None = None
    kind: Attention = "local_1d"  # which earlier positions a step sees: local 1D or 2D blocks, or all
    # 1D local attention: query blocks of this many positions, in raster order ...
    query_block_length: int = ATTENTION_DEFAULTS["query_block_length"]
    # ... each also seeing this many whole previous blocks (T2T: exactly one).
    memory_blocks: int = ATTENTION_DEFAULTS["memory_blocks"]
    # 2D local attention: query block (rows, cols) in grid cells, and the flange of memory around it (rows
    # above, cols either side); any flange height is causal: every row above a block is in an earlier block row.
    query_block_shape: tuple[int, int] = ATTENTION_DEFAULTS["query_block_shape"]
    memory_flange: tuple[int, int] = ATTENTION_DEFAULTS["memory_flange"]
    # Where each key lies relative to its query (not in the paper, whose inputs carry absolute positions
    # only): "none", or "rotary", 2D RoPE of queries and keys (attention.py: nothing added to the scores).
    relative_positions: RelativePositions = "none"

    def __post_init__(self) -> None:
        # YAML and JSON hand us lists; the dataclass promises tuples.
        self.query_block_shape = tuple(self.query_block_shape)  # type: ignore[assignment]
        self.memory_flange = tuple(self.memory_flange)  # type: ignore[assignment]
        # Another kind's geometry does nothing and is not stored (``to_dict``): refused, rather than kept
        # and lost, so that a config is what it says and equals its stored form read back.
        for kind, names in GEOMETRY.items():
            for name in names if kind != self.kind else ():
                if getattr(self, name) != ATTENTION_DEFAULTS[name]:
                    raise UserError(f"ModelConfig.attention.{name}={getattr(self, name)!r} is {kind} geometry, "
                                    f"which kind {self.kind!r} does not read: leave it out (or at its default "
                                    f"{ATTENTION_DEFAULTS[name]!r}), or set attention.kind to {kind!r}")


@dataclass
class SuperResolutionConfig:
    """§6: an encoder over a low-resolution image that every decoder layer reads."""
    encoder_layers: int = 1  # unmasked self-attention layers over the low-res input
    low_res_size: int = 8  # side of the encoder's input image, in pixels
    # How the encoder conditions each decoder layer: "cross_attention" (the paper's), or "cell_add" (not
    # in the paper): after self-attention, a linear map of the encoder's output for the step's low-res
    # pixel (superres.py), as good as cross-attention to that pixel alone, without its projections.
    low_res_reading: LowResReading = "cross_attention"
    # Not in the paper, the three below. True: each decoder step also gets the mean that the values of its
    # low-res cell not yet generated must have for the cell to box-average to the input (cell_remainder.py).
    cell_remainder_input: bool = False
    # True: each step's distribution is restricted to the values that can still give its cell the input's
    # rounded box mean, renormalised (per DMOL component and channel): samples downsample to their input
    # exactly, and no mass goes to images that would not. Needs cell_remainder_input's sums.
    exact_box_means: bool = False
    # True: the maps that add the low-res conditioning to the decoder (cross-attention's output projection,
    # the cell add, the cell remainder's) start at zero: a new model's outputs do not depend on its input.
    low_res_zero_start: bool = False


@dataclass
class ModelConfig:
    """The paper's hyper-parameters: the image, its inputs, the head, the layers, and two sections."""
    image_size: int = 32  # side of the square target image, in pixels
    num_classes: int = 0  # 0 = unconditional; else one learned vector per class (§2)
    # 0 = off; else distribution augmentation (Jun et al. 2020): one learned vector per transform id added
    # to every step's input as a class's (48: imagetx/data/transforms.py's ids); scored with id 0
    num_transforms: int = 0
    position_encoding: PositionEncodingKind = "sinusoidal"  # §2: absolute positions added to the inputs
    head: Head = "categorical"  # §5: a softmax per sub-pixel, or a mixture of logistics per pixel
    mixture_components: int = 10  # K of the DMOL head (§5); unused by the categorical head
    n_layers: int = 12  # decoder layers (§3)
    d_model: int = 512  # width of every position's vector; half encodes the row, half the column (§2)
    d_filter: int = 2048  # hidden size of the feed-forward sublayer
    dropout: float = 0.3  # on input embeddings and residual branches (T2T: attention dropout is 0)
    norm: Norm = "post"  # §3: post-LayerNorm is the paper's block; pre- trains stably from step 0
    attention: AttentionConfig = field(default_factory=AttentionConfig)  # §4
    superres: SuperResolutionConfig | None = None  # §6: None = a plain decoder, no low-res input

    def __post_init__(self) -> None:
        # YAML and JSON hand us mappings; the dataclass promises its sections.
        if isinstance(self.attention, dict):
            self.attention = _from_fields(AttentionConfig, self.attention, "ModelConfig.attention")
        if isinstance(self.superres, dict):
            self.superres = _from_fields(SuperResolutionConfig, self.superres, "ModelConfig.superres")

    # ----- derived geometry -------------------------------------------------
    @property
    def grid_shape(self) -> tuple[int, int]:
        """(rows, cols) of the generation grid: sub-pixels for categorical, pixels for DMOL."""
        return self.image_size, self.image_size * (CHANNELS if self.head == "categorical" else 1)

    @property
    def rotary(self) -> bool:
        """Whether decoder self-attention rotates its queries and keys by their grid positions (2D RoPE)."""
        return self.attention.relative_positions == "rotary"

    @property
    def head_size(self) -> int:
        """Channels of one attention head: ``attention.head_size``, or d_model / n_heads."""
        return self.attention.head_size or self.d_model // self.attention.n_heads

    @property
    def dims_per_image(self) -> int:
        """Sub-pixels per image: the denominator of bits/dim (§5)."""
        return self.image_size * self.image_size * CHANNELS

    # ----- validation --------------------------------------------------------
    def validate(self) -> "ModelConfig":
        """Itself, or a UserError (a ValueError) naming the field, its value and what would be valid."""
        self._check_choices()
        self._check_network()
        self._check_attention_blocks()
        self._check_low_res_input()
        return self

    def _check_choices(self) -> None:
        attention = self.attention
        choices = [("head", self.head, HEADS), ("position_encoding", self.position_encoding, POSITION_ENCODINGS),
                   ("norm", self.norm, NORMS), ("attention.kind", attention.kind, ATTENTIONS),
                   ("attention.relative_positions", attention.relative_positions, RELATIVE_POSITIONS)]
        if self.superres is not None:
            choices.append(("superres.low_res_reading", self.superres.low_res_reading, LOW_RES_READINGS))
        for name, value, valid in choices:
            if value not in valid:
                _invalid(name, value, f"choose one of {', '.join(valid)}")

    def _check_network(self) -> None:
        """The decoder's sizes, heads, dropout, classes and mixture."""
        sizes = [("image_size", self.image_size), ("n_layers", self.n_layers), ("d_model", self.d_model),
                 ("attention.n_heads", self.attention.n_heads), ("d_filter", self.d_filter)]
        for name, value in sizes:
            if not isinstance(value, int) or value < 1:
                _invalid(name, value, "must be a positive integer")
        head_size = self.attention.head_size
        if head_size is not None and (not isinstance(head_size, int) or head_size < 1):
            _invalid("attention.head_size", head_size, "must be a positive integer (or null: d_model / n_heads)")
        if head_size is None and self.d_model % self.attention.n_heads:
            divisors = [k for k in range(1, min(self.d_model, 64) + 1) if self.d_model % k == 0]
            _invalid("attention.n_heads", self.attention.n_heads,
                     f"must divide d_model={self.d_model} (e.g. {divisors}), or give attention.head_size")
        if self.d_model % 2:
            _invalid("d_model", self.d_model, "must be even: half encodes the row, half the column")
        if self.rotary and self.head_size % 4:
            _invalid("attention.relative_positions", self.attention.relative_positions,
                     f"needs a head size ({self.head_size}) divisible by 4, in dimension pairs for rows "
                     "and for columns: change attention.head_size, attention.n_heads or d_model")
        if not 0.0 <= self.dropout < 1.0:
            _invalid("dropout", self.dropout, "must be in [0, 1)")
        if self.num_classes < 0:
            _invalid("num_classes", self.num_classes, "must be 0 (unconditional) or the number of classes")
        if self.num_transforms < 0:
            _invalid("num_transforms", self.num_transforms, "must be 0 (off) or the number of transform ids (48)")
        if self.head == "dmol" and self.mixture_components < 1:
            _invalid("mixture_components", self.mixture_components, "must be at least 1")

    def _check_attention_blocks(self) -> None:
        """The blocks of local self-attention against the generation grid."""
        attention = self.attention
        rows, cols = self.grid_shape
        if attention.kind == "local_1d":
            if attention.query_block_length < 1:
                _invalid("attention.query_block_length", attention.query_block_length, "must be a positive integer")
            if attention.memory_blocks < 0:
                _invalid("attention.memory_blocks", attention.memory_blocks, "must be 0 or more previous blocks")
        if attention.kind == "local_2d":
            qh, qw = attention.query_block_shape
            fh, fw = attention.memory_flange
            grid = f"(grid {rows}x{cols}, {self.head} head)"
            for side, size, cells, unit in (("height", qh, rows, "rows"), ("width", qw, cols, "columns")):
                if size < 1 or cells % size:
                    _invalid("attention.query_block_shape", attention.query_block_shape,
                             f"block {side} must divide the grid's {cells} {unit} {grid}")
            if fh < 0 or fw < 0:
                _invalid("attention.memory_flange", attention.memory_flange, "flange sizes must be 0 or more")

    def _check_low_res_input(self) -> None:
        """The encoder over the low-resolution input, and how it conditions the decoder."""
        superres = self.superres
        if superres is None:
            return
        if not isinstance(superres.encoder_layers, int) or superres.encoder_layers < 1:
            _invalid("superres.encoder_layers", superres.encoder_layers,
                     "must be a positive count (superres: null for a plain decoder)")
        if superres.low_res_size < 1 or self.image_size % superres.low_res_size:
            _invalid("superres.low_res_size", superres.low_res_size, f"must divide image_size={self.image_size}")
        if superres.exact_box_means and not superres.cell_remainder_input:
            _invalid("superres.exact_box_means", superres.exact_box_means,
                     "reads the cell sums of the cell remainder input: set cell_remainder_input: true")

    # ----- (de)serialisation -------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML values: the sections as mappings, pairs as lists; of the attention
        section's geometry only the kind's own (``GEOMETRY``)."""
        out = asdict(self)
        attention = out["attention"]
        if attention["head_size"] is None:  # d_model / n_heads: stored as every model before the field was
            del attention["head_size"]
        for kind, names in GEOMETRY.items():
            for name in names:
                if kind != self.attention.kind:
                    del attention[name]
                elif isinstance(attention[name], tuple):
                    attention[name] = list(attention[name])
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ModelConfig":
        """A config from ``to_dict``'s form (a section's fields left out take their defaults)."""
        return _from_fields(cls, dict(values), "ModelConfig")


def _from_fields(kind: type, values: dict[str, Any], name: str) -> Any:
    """``kind(**values)``, a field it lacks refused naming ``name`` (the config or its section) and its fields."""
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"unknown {name} field(s) {unknown}; valid fields: {sorted(known)}")
    return kind(**values)


def _invalid(field_name: str, value: Any, valid: str) -> NoReturn:
    raise UserError(f"ModelConfig.{field_name}={value!r} is invalid: {valid}")
