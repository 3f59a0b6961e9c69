"""The Image Transformer network (docs/model.md §1–§3, §5): a plain ``nn.Module``, the paper's
decoder. Super-resolution extends it (``superres.py``: an encoder, and a reading of it in every
layer); ``build_model`` builds either from a configuration.

The decoder embeds images in generation order, shifts them right by one step, runs the stack of
transformer layers (local self-attention and a feed-forward, each with add-and-norm) and returns
the head's distribution parameters.

One decoder pass (``run_decoder``) over a slice of steps serves everything: the teacher-forced
pass over every step (``forward``), and, through a ``DecodingCache`` (``start_decoding``, which
owns the step counter), ``decode_steps``: one step of the sampler (``decode_step``: the value
generated last in, the head's parameters for the next step out) or the first steps of a fresh
cache at once (``prefill``: a completion's given rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import CrossAttentionCache, SelfAttention, SelfAttentionCache, prepare
from .config import CHANNELS, ModelConfig
from .embedding import PixelEmbedding, PositionEncoding, SubPixelEmbedding
from .heads import CategoricalHead, DMOLHead
from .inputs import check_image_tensor, check_labels
from .order import images_to_sequence
from .patterns import CausalPattern, pattern_for
from .rotary import Rotary2D


@dataclass
class LayerCache:
    """One decoder layer's decoding state: its self-attention ring, and what reads a context
    (super-resolution's low-res input), if the layer reads one."""

    self_attn: SelfAttentionCache
    context: CrossAttentionCache | object | None = None


class TransformerLayer(nn.Module):
    """Self-attention + feed-forward, each with add-and-norm (docs/model.md §3)."""

    def __init__(self, config: ModelConfig, pattern: CausalPattern | None = None, rotary: Rotary2D | None = None,
                 **reading) -> None:
        """``pattern``: a decoder layer, causal under it, with ``config.attention.relative_positions``
        (``rotary``: the decoder's one ``Rotary2D``, which every layer shares); without, an
        encoder layer. ``reading``: what ``add_reading`` of an extension needs."""
        super().__init__()
        d = config.d_model
        self.pre_norm = config.norm == "pre"
        self.self_attn = SelfAttention(d, config.attention.n_heads, pattern, config.attention.kernel, rotary)
        self.self_norm = nn.LayerNorm(d)
        self.add_reading(config, **reading)
        self.ffn = nn.Sequential(nn.Linear(d, config.d_filter), nn.ReLU(), nn.Linear(config.d_filter, d))
        self.ffn_norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(config.dropout)

    def add_reading(self, config: ModelConfig) -> None:
        """The parts that read a context after self-attention: none here (super-resolution's
        layers read the encoder, superres.py)."""

    def read_context(self, x: Tensor, context: Tensor | None, cache: object | None, start: Tensor | int) -> Tensor:
        """(B, t, d) after self-attention -> (B, t, d) with the context read: unchanged here."""
        return x

    def add_and_norm(self, x: Tensor, branch, norm: nn.LayerNorm) -> Tensor:
        """x + branch(x) with dropout, normalised after (the paper's) or before (pre-norm)."""
        if self.pre_norm:
            return x + self.dropout(branch(norm(x)))
        return norm(x + self.dropout(branch(x)))

    def residual_writers(self) -> list[nn.Linear]:
        """The last map of every branch that adds into the residual stream: self-attention's output
        projection and the feed-forward's second linear. With all of them at zero a pre-norm layer
        is the identity."""
        return [self.self_attn.to_out, self.ffn[-1]]

    def start_decoding(self, batch: int, context: Tensor | None = None) -> LayerCache:
        """This layer's empty decoding cache."""
        return LayerCache(self.self_attn.start_decoding(batch))

    def forward(self, x: Tensor, context: Tensor | None = None, cache: LayerCache | None = None,
                start: Tensor | int = 0) -> Tensor:
        """(B, t, d), the steps from ``start`` on -> (B, t, d): every step, or with ``cache`` (and no
        ``context``: the cache holds what the layer reads of it) the next t steps, one decoding
        step or a prefill."""
        self_cache, context_cache = (None, None) if cache is None else (cache.self_attn, cache.context)
        x = self.add_and_norm(x, lambda h: self.self_attn(h, self_cache, start), self.self_norm)  # (B, t, d)
        x = self.read_context(x, context, context_cache, start)  # (B, t, d)
        return self.add_and_norm(x, self.ffn, self.ffn_norm)  # (B, t, d)


def zero_start(linears: Iterable[nn.Linear]) -> None:
    """Set each map's weight and bias to zero, in place: a branch that writes nothing until it learns to."""
    for linear in linears:
        nn.init.zeros_(linear.weight)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


@dataclass
class DecodingCache:
    """Everything ``ImageTransformer.decode_steps`` keeps between steps, updated in place.

    ``step`` (0-d long, on the model's device): the step decoded next, the decoder's one step
    counter (the layers' caches hold none: each call hands them its start); ``condition``: the
    class vector (B, 1, d) or None; ``inputs``: what the inputs besides values, positions and the
    class keep between steps (super-resolution's cell sums), or None; ``bounds``: the value bounds
    (B, t, 2c) of the steps decoded last, which the head's draws take (``exact_box_means``), or None."""

    step: Tensor
    condition: Tensor | None
    layers: list[LayerCache]
    inputs: object | None = None
    bounds: Tensor | None = None


class ImageTransformer(nn.Module):
    """Decoder-only autoregressive model over sub-pixels or pixels. Saving, loading and sharing
    it: ``imagetx.io`` (``save_pretrained``, ``from_pretrained``, ``push_to_hub``, ``load_model``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.superres and type(self) is ImageTransformer:
            raise ValueError("a config with a superres section is a super-resolution model: "
                             "SuperResolutionTransformer(config); build_model(config) builds either")
        self.config = config.validate()
        self.check_values = True  # False inside ``values_verified``: the checks read no value back
        d = config.d_model
        self.pattern = pattern_for(config)
        self.order = self.pattern.order
        rows, cols = self.order.grid_cell()
        self.register_buffer("step_rows", rows, persistent=False)
        self.register_buffer("step_cols", cols, persistent=False)
        self.register_buffer("step_channels", cols % CHANNELS, persistent=False)
        categorical = config.head == "categorical"
        self.value_embedding = SubPixelEmbedding(d) if categorical else PixelEmbedding(d)
        self.positions = PositionEncoding(*config.grid_shape, d, config.position_encoding)
        self.class_embedding = nn.Embedding(config.num_classes, d) if config.num_classes else None
        self.input_dropout = nn.Dropout(config.dropout)
        self.add_inputs(config)
        # No parameters, and T × e/2 angles: one for every layer.
        rotary = Rotary2D(config.head_size, self.order) if config.rotary else None
        self.layers = nn.ModuleList(self.new_layer(config, rotary) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(d) if config.norm == "pre" else nn.Identity()
        bounded = bool(config.superres and config.superres.exact_box_means)
        self.head = CategoricalHead(d, bounded) if categorical else DMOLHead(d, config.mixture_components, bounded)

    # ----- what an extension adds (superres.py) -------------------------------
    def add_inputs(self, config: ModelConfig) -> None:
        """Inputs besides the image, its class and the positions: none here."""

    def new_layer(self, config: ModelConfig, rotary: Rotary2D | None) -> TransformerLayer:
        return TransformerLayer(config, self.pattern, rotary)

    def encode(self, low_res: Tensor | None) -> Tensor | None:
        """The context every layer reads (an encoded low-resolution image): none here."""
        return None

    def side_inputs(self, values: Tensor, low_res: Tensor | None = None, state: object | None = None,
                    steps: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """What each step's input adds besides its value, position and class, (B, t, d), and the
        head's value bounds, (B, t, 2c): none here. ``values``: the targets (B, T[, 3]), or with a
        decoding ``state`` the values before ``steps``."""
        return None, None

    def value_bounds(self, targets: Tensor, low_res: Tensor | None = None) -> Tensor | None:
        """(B, T, 2c) the values each step may take, which the head's scores take: none here."""
        return None

    def start_side_inputs(self, low_res: Tensor | None) -> object | None:
        """The decoding state of ``side_inputs``: none here."""
        return None

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read a low-resolution input (trained at their own rate): none here."""
        return []

    def build_patterns(self, device: torch.device | str) -> None:
        """Build the decoder's attention pattern on ``device`` now, eagerly. Under torch.compile
        the pass that first builds one breaks its graph there (patterns.BuiltOnce), so the graphs
        a run traces would depend on what ran before its first compiled pass (a sanity validation
        builds them; a resumed run has none). Built first, every run traces the same graphs, with
        no break, and finds those an earlier run left in Inductor's cache."""
        for module in self.modules():
            if isinstance(module, SelfAttention):
                prepare(module.pattern, module.kernel, torch.device(device), module.head_size)

    # ----- inputs -----------------------------------------------------------
    def targets(self, images: Tensor) -> Tensor:
        """(B, H, W, 3) -> (B, T) sub-pixel values or (B, T, 3) pixels, in generation order."""
        return images_to_sequence(images.long(), self.order, self.config.head)

    def embed_values(self, targets: Tensor, channels: Tensor | None = None) -> Tensor:
        """Targets (B, T[, 3]) in generation order -> (B, T, d) value embeddings, not yet
        shifted; ``channels``: each target's channel (categorical), by default every step's."""
        if self.config.head == "categorical":
            return self.value_embedding(targets, self.step_channels if channels is None else channels)
        return self.value_embedding(targets)

    def condition(self, labels: Tensor | None) -> Tensor | None:
        """(B, 1, d) class vector added to every position, or None."""
        if self.class_embedding is None:
            return None
        return self.class_embedding(labels).unsqueeze(1)

    # ----- the decoder ------------------------------------------------------
    @staticmethod
    def shift_right(x: Tensor) -> Tensor:
        """(B, T, d): step t gets what step t−1 had; step 0 gets zeros."""
        return nn.functional.pad(x[:, :-1], (0, 0, 1, 0))

    def decoder_inputs(self, shifted: Tensor, steps: Tensor | slice, condition: Tensor | None,
                       side: Tensor | None = None) -> Tensor:
        """Shifted value embeddings (B, t, d) of ``steps`` + their positions + the class vector +
        the side inputs (``side_inputs``), then dropout."""
        x = shifted + self.positions(self.step_rows[steps], self.step_cols[steps])
        if condition is not None:
            x = x + condition
        if side is not None:
            x = x + side  # already causal: built from values before each step only
        return self.input_dropout(x)

    def run_decoder(self, x: Tensor, context: Tensor | None = None, cache: DecodingCache | None = None) -> Tensor:
        """The one decoder pass: inputs (B, t, d) (``decoder_inputs``) through every layer and the
        head -> (B, t, P). Every step teacher-forced at once, or with ``cache`` the t steps from
        ``cache.step`` on."""
        caches, start = ([None] * len(self.layers), 0) if cache is None else (cache.layers, cache.step)
        for layer, layer_cache in zip(self.layers, caches):
            x = layer(x, context, layer_cache, start)  # (B, t, d)
        return self.head(self.final_norm(x))  # (B, t, P)

    def decode(self, value_embeddings: Tensor, labels: Tensor | None = None, context: Tensor | None = None,
               side: Tensor | None = None) -> Tensor:
        """(B, T, d) unshifted value embeddings -> (B, T, P) distribution parameters, every
        step teacher-forced at once.

        Separate from ``forward`` so that tests can differentiate with respect to the embedded
        inputs. A model with side inputs also needs ``side`` = ``self.side_inputs(targets,
        low_res)[0]``: they are built from raw values, not embeddings.
        """
        x = self.decoder_inputs(self.shift_right(value_embeddings), slice(None), self.condition(labels), side)
        return self.run_decoder(x, context)

    def forward(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """uint8 images (B, H, W, 3) -> (B, T, P) distribution parameters in generation order."""
        self.check_inputs(images, labels, low_res)
        targets = self.targets(images)  # (B, T) sub-pixels or (B, T, 3) pixels
        side, _ = self.side_inputs(targets, low_res)  # (B, T, d) or None
        return self.decode(self.embed_values(targets), labels, self.encode(low_res), side)  # (B, T, P)

    # ----- decoding one step at a time -----------------------------------------
    def start_decoding(self, batch: int, labels: Tensor | None = None, low_res: Tensor | None = None) -> DecodingCache:
        """An empty cache for decoding ``batch`` images one step at a time with ``decode_step``.
        A context (an encoded low-res image) is encoded here, once, and each layer keeps what it
        reads of it."""
        self.check_conditioning(batch, labels, low_res)
        step = torch.zeros((), dtype=torch.long, device=self.step_rows.device)
        context = self.encode(low_res)
        layers = [layer.start_decoding(batch, context) for layer in self.layers]
        return DecodingCache(step, self.condition(labels), layers, self.start_side_inputs(low_res))

    def decode_steps(self, previous: Tensor, cache: DecodingCache) -> Tensor:
        """The next t steps from ``cache.step`` through ``run_decoder``: ``previous`` (B, t[, 3]),
        the value before each step -> (B, t, P), their value bounds left in ``cache.bounds``. One
        step (t = 1), or, on a fresh cache, the first t at once (``prefill``). The cache's counter
        moves on by t.

        A step's input is the value before it, embedded with that value's channel; step 0's is
        multiplied by 0, as ``shift_right`` gives step 0 zeros. No branch depends on the step's
        value, so every decoding step runs one graph (``sampler.compile_decoding``)."""
        count = previous.shape[1]
        steps = cache.step + torch.arange(count, device=cache.step.device)  # (t,)
        channels = self.step_channels[(steps - 1) % self.order.length]  # the channel of each step's input
        shifted = self.embed_values(previous, channels) * (steps > 0)[:, None]  # (B, t, d)
        side, cache.bounds = self.side_inputs(previous, None, cache.inputs, steps)
        params = self.run_decoder(self.decoder_inputs(shifted, steps, cache.condition, side), cache=cache)
        cache.step += count  # after the pass, whose layers read the counter as their start
        return params

    def decode_step(self, previous: Tensor, cache: DecodingCache) -> Tensor:
        """The value generated at step t−1 ((B,) sub-pixels or (B, 3) pixels) -> (B, P): the
        head's parameters for step t = ``cache.step``. Equal to ``forward``'s step t given the
        same earlier values (tests). At t = 0 ``previous`` counts for nothing: pass zeros
        (``sampler.first_input``)."""
        return self.decode_steps(previous[:, None], cache)[:, 0]

    def prefill(self, given: Tensor, cache: DecodingCache) -> Tensor:
        """The first P steps at once into a fresh cache (from ``start_decoding``): ``given``
        (B, P) sub-pixels or (B, P, 3) pixels, their values in generation order -> (B, P, params),
        equal to ``forward``'s first P steps; every cache is left as P ``decode_step`` calls
        would leave it, at step P (tests). As in ``forward``, the last value is not read: it is
        the ``previous`` of the next ``decode_step``.

        One teacher-forced pass of the layers over the P steps (each self-attention layer's
        queries a query block at a time over its ring and their own keys, masked by its pattern's
        rule), where P steps would each run every layer: for a completion, its given rows."""
        length = given.shape[1]
        if not 0 < length <= self.order.length:
            raise ValueError(f"prefill takes 1..{self.order.length} steps, not {length}")
        if int(cache.step):  # read once per prefill: the layers attend from step 0
            raise ValueError(f"prefill fills a fresh cache (from start_decoding), not one at step {int(cache.step)}")
        # Each step's input is the value before it: step 0's is zeros, counting for nothing.
        return self.decode_steps(torch.cat([torch.zeros_like(given[:, :1]), given[:, :-1]], dim=1), cache)

    # ----- likelihoods ------------------------------------------------------
    def log_prob(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """(B, T) log-likelihood of every generation step, in nats."""
        params = self(images, labels, low_res)  # (B, T, P); checks the inputs first
        targets = self.targets(images)
        return self.head.log_prob(params, targets, self.value_bounds(targets, low_res))

    def nll(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
            given_rows: int = 0) -> Tensor:
        """(B,) negative log-likelihood of each whole image, in nats; with ``given_rows`` = k, of
        the part below the first k rows given them (image completion, ``given_steps``)."""
        log_p = self.log_prob(images, labels, low_res)
        if given_rows:
            log_p = log_p[:, ~self.given_steps(given_rows)]
        return -log_p.sum(dim=1)

    def bits_per_dim(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
                     given_rows: int = 0) -> Tensor:
        """(B,) bits per scored sub-pixel of each image (docs/model.md §5): all of them, or
        those below the first ``given_rows`` rows."""
        cfg = self.config
        dims = cfg.dims_per_image * (cfg.image_size - given_rows) // cfg.image_size
        return self.nll(images, labels, low_res, given_rows) / (dims * math.log(2))

    def given_steps(self, rows: int) -> Tensor:
        """(T,) bool: the steps that lie in the first ``rows`` image rows, which image completion
        gives (teacher-forces when sampling, leaves unscored when scoring).

        In 2D block-raster order the given rows must be whole rows of query blocks, so that every
        given step comes before every other: then the steps scored are exactly p(rest | given)."""
        cfg = self.config
        if not 0 <= rows <= cfg.image_size:
            raise ValueError(f"given_rows={rows} is invalid: give 0..{cfg.image_size} rows")
        block_height = cfg.attention.query_block_shape[0]
        if cfg.attention.kind == "local_2d" and rows % block_height:
            raise ValueError(f"given_rows={rows}: with 2D blocks of height {block_height} the given rows must be a "
                             "whole number of block rows, to come first in generation order")
        return self.step_rows < rows  # grid rows are image rows

    # ----- input checks -----------------------------------------------------
    @contextmanager
    def values_verified(self, verified: bool = True) -> Iterator[None]:
        """Within (when ``verified``), ``check_inputs`` checks shapes and dtypes only: for data
        whose values were checked when it was read (``ImageDataModule``: uint8 images, labels in
        range), so that a training step never waits on the device for them. Outside, and for
        every other caller, values are checked too. Nests: each exit restores what it found."""
        previous, self.check_values = self.check_values, not verified
        try:
            yield
        finally:
            self.check_values = previous

    def check_inputs(self, images: Tensor, labels: Tensor | None, low_res: Tensor | None) -> None:
        """Clear one-line errors for inputs the model cannot take."""
        check_image_tensor("images", images, self.config.image_size, self.check_values)
        self.check_conditioning(images.shape[0], labels, low_res)

    def check_conditioning(self, count: int, labels: Tensor | None, low_res: Tensor | None) -> None:
        """Labels (and a low-resolution input: this model takes none) as this model needs them, for
        ``count`` images."""
        check_labels(labels, count, self.config.num_classes, values=self.check_values)
        if low_res is not None:
            raise ValueError("this model has no encoder (no superres section): pass low_res=None")
