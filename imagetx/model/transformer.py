"""The Image Transformer network (docs/model.md §1–§3, §5, §6): a plain ``nn.Module``.

The decoder embeds images in generation order, shifts them right by one step, runs the local
attention stack (``layers.py``: the transformer layer and the super-resolution encoder) and
returns the head's distribution parameters.

One decoder pass (``run_decoder``) over a slice of steps serves everything: the teacher-forced
pass over every step (``forward``), and, through a ``DecodingCache`` (``start_decoding``, which
owns the step counter), ``decode_steps``: one step of the sampler (``decode_step``: the value
generated last in, the head's parameters for the next step out) or the first steps of a fresh
cache at once (``prefill``: a completion's given rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import SelfAttention, prepare
from .cell_remainder import CellRemainder, RemainderCache
from .config import CHANNELS, ModelConfig
from .embedding import PixelEmbedding, PositionEncoding, SubPixelEmbedding
from .heads import CategoricalHead, DMOLHead
from .inputs import check_image_tensor, check_labels
from .layers import Encoder, LayerCache, TransformerLayer, zero_start
from .order import images_to_sequence
from .patterns import pattern_for
from .rotary import Rotary2D


@dataclass
class DecodingCache:
    """Everything ``ImageTransformer.decode_steps`` keeps between steps, updated in place.

    ``step`` (0-d long, on the model's device): the step decoded next, the decoder's one step
    counter (the layers' caches hold none: each call hands them its steps); ``condition``: the
    class vector (B, 1, d) or None."""

    step: Tensor
    condition: Tensor | None
    layers: list[LayerCache]
    remainder: RemainderCache | None


class ImageTransformer(nn.Module):
    """Decoder-only (or encoder–decoder) autoregressive model over sub-pixels or pixels.
    Saving, loading and sharing it: ``imagetx.io`` (``save_pretrained``, ``from_pretrained``,
    ``push_to_hub``, ``load_model``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
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
        self.encoder = Encoder(config) if config.encoder_layers else None
        pixel_of_step = None if self.encoder is None else self.low_res_pixel_of_step()
        self.cell_remainder = None
        if config.cell_remainder_input:
            self.cell_remainder = CellRemainder(config, pixel_of_step, self.step_channels)
        # No parameters, and T × e/2 angles: one for every layer.
        rotary = Rotary2D(d // config.n_heads, self.order) if config.rotary else None
        self.layers = nn.ModuleList(
            TransformerLayer(config, self.pattern, rotary, reads_low_res=self.encoder is not None,
                             low_res_pixel_of_step=pixel_of_step)
            for _ in range(config.n_layers)
        )
        self.final_norm = nn.LayerNorm(d) if config.norm == "pre" else nn.Identity()
        bounded = config.exact_box_means
        self.head = CategoricalHead(d, bounded) if categorical else DMOLHead(d, config.mixture_components, bounded)
        if config.low_res_zero_start:
            zero_start(self.low_res_writers())

    def step_cells(self) -> tuple[Tensor, Tensor]:
        """(rows, cols), each (T,): the low-resolution pixel each decoder step lies in."""
        scale = self.config.image_size // self.config.low_res_size
        pixel_cols = self.step_cols // CHANNELS if self.config.head == "categorical" else self.step_cols
        return self.step_rows // scale, pixel_cols // scale

    def low_res_pixel_of_step(self) -> Tensor:
        """(T,): the low-resolution pixel each decoder step lies in, as a raster index (what the
        cell add and the cell remainder read)."""
        rows, cols = self.step_cells()
        return rows * self.config.low_res_size + cols

    def low_res_modules(self) -> list[nn.Module]:
        """The parts that read the low-resolution input: the encoder, every layer's
        cross-attention (and its norm) or cell add (and its norm), the cell remainder input.
        Empty without an encoder."""
        readers = [part for layer in self.layers
                   for part in (layer.cross_attn, layer.cross_norm, layer.cell_add, layer.cell_norm)
                   if part is not None]
        return [part for part in (self.encoder, *readers, self.cell_remainder) if part is not None]

    def low_res_writers(self) -> list[nn.Linear]:
        """The last maps on the way from the low-res input into the decoder's residual stream,
        which ``low_res_zero_start`` starts at zero: cross-attention's output projections, the
        cell adds' maps, the cell remainder's projection."""
        writers = [layer.cross_attn.to_out for layer in self.layers if layer.cross_attn is not None]
        writers += [layer.cell_add.proj for layer in self.layers if layer.cell_add is not None]
        return writers + ([self.cell_remainder.proj] if self.cell_remainder is not None else [])

    def build_patterns(self, device: torch.device | str) -> None:
        """Build the decoder's attention pattern on ``device`` now, eagerly. Under torch.compile
        the first pass that builds one breaks its graph there (patterns.BuiltOnce): a run whose
        first compiled pass found none built (a resumed run, which has no sanity validation)
        traced other graphs than a run whose sanity validation had built them, and missed the
        graphs an earlier run left in Inductor's cache. Built first, every run traces the same
        graphs, with no break."""
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

    def encode(self, low_res: Tensor | None) -> Tensor | None:
        return None if self.encoder is None else self.encoder(low_res, self.positions)

    # ----- the decoder ------------------------------------------------------
    @staticmethod
    def shift_right(x: Tensor) -> Tensor:
        """(B, T, d): step t gets what step t−1 had; step 0 gets zeros."""
        return nn.functional.pad(x[:, :-1], (0, 0, 1, 0))

    def decoder_inputs(self, shifted: Tensor, steps: Tensor | slice, condition: Tensor | None,
                       remainder: Tensor | None) -> Tensor:
        """Shifted value embeddings (B, t, d) of ``steps`` + their positions + the class vector +
        (with ``cell_remainder_input``) the cell remainder features, then dropout."""
        x = shifted + self.positions(self.step_rows[steps], self.step_cols[steps])
        if condition is not None:
            x = x + condition
        if self.cell_remainder is not None:
            if remainder is None:
                raise ValueError("this model reads the cell remainder (cell_remainder_input=True): "
                                 "pass remainder=model.cell_remainder(targets, low_res)")
            x = x + self.cell_remainder.embed(remainder)  # already causal: built from values before each step only
        return self.input_dropout(x)

    def run_decoder(self, x: Tensor, context: Tensor | None = None, cache: DecodingCache | None = None,
                    bounds: Tensor | None = None) -> Tensor:
        """The one decoder pass: inputs (B, t, d) (``decoder_inputs``) through every layer and the
        head -> (B, t, P). Every step teacher-forced at once, or with ``cache`` the t steps from
        ``cache.step`` on. ``bounds``: for ``exact_box_means``, the steps' value bounds, which the
        head's parameters carry (``cell_inputs``)."""
        caches, start = ([None] * len(self.layers), 0) if cache is None else (cache.layers, cache.step)
        for layer, layer_cache in zip(self.layers, caches):
            x = layer(x, context, layer_cache, start)  # (B, t, d)
        return self.head(self.final_norm(x), bounds)  # (B, t, P)

    def decode(self, value_embeddings: Tensor, labels: Tensor | None = None, context: Tensor | None = None,
               remainder: Tensor | None = None, bounds: Tensor | None = None) -> Tensor:
        """(B, T, d) unshifted value embeddings -> (B, T, P) distribution parameters, every
        step teacher-forced at once.

        Separate from ``forward`` so that tests can differentiate with respect to the embedded
        inputs. A model with ``cell_remainder_input`` also needs ``remainder`` (and with
        ``exact_box_means`` ``bounds``) = ``self.cell_inputs(targets, low_res)``: they are built
        from raw values, not embeddings.
        """
        x = self.decoder_inputs(self.shift_right(value_embeddings), slice(None), self.condition(labels), remainder)
        return self.run_decoder(x, context, bounds=bounds)

    def cell_inputs(self, targets: Tensor, low_res: Tensor | None, cache: RemainderCache | None = None,
                    steps: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
        """What the cell sums give the decoder (``CellRemainder.cell_state``'s arguments): the
        remainder features (``cell_remainder_input``) and the value bounds (``exact_box_means``),
        each (B, t, ·) or None."""
        if self.cell_remainder is None:
            return None, None
        state = self.cell_remainder.cell_state(targets, low_res, cache, steps)
        bounds = self.cell_remainder.bounds(*state) if self.config.exact_box_means else None
        return self.cell_remainder.features(*state), bounds

    def forward(self, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None) -> Tensor:
        """uint8 images (B, H, W, 3) -> (B, T, P) distribution parameters in generation order."""
        self.check_inputs(images, labels, low_res)
        targets = self.targets(images)
        remainder, bounds = self.cell_inputs(targets, low_res)
        return self.decode(self.embed_values(targets), labels, self.encode(low_res), remainder, bounds)

    # ----- decoding one step at a time -----------------------------------------
    def start_decoding(self, batch: int, labels: Tensor | None = None, low_res: Tensor | None = None) -> DecodingCache:
        """An empty cache for decoding ``batch`` images one step at a time with ``decode_step``.
        The encoder runs here, once: cross-attention keeps its keys and values, the cell add
        its mapped cells."""
        self.check_conditioning(batch, labels, low_res)
        step = torch.zeros((), dtype=torch.long, device=self.step_rows.device)
        context = self.encode(low_res)
        layers = [layer.start_decoding(batch, context) for layer in self.layers]
        remainder = None if self.cell_remainder is None else self.cell_remainder.start_decoding(low_res)
        return DecodingCache(step, self.condition(labels), layers, remainder)

    def decode_steps(self, previous: Tensor, cache: DecodingCache) -> Tensor:
        """The next t steps from ``cache.step`` through ``run_decoder``: ``previous`` (B, t[, 3]),
        the value before each step -> (B, t, P). One step (t = 1), or, on a fresh cache, the first
        t at once (``prefill``). The cache's counter moves on by t.

        A step's input is the value before it, embedded with that value's channel; step 0's is
        multiplied by 0, as ``shift_right`` gives step 0 zeros. No branch depends on the step's
        value, so every decoding step runs one graph (``sampler.compile_decoding``)."""
        count = previous.shape[1]
        steps = cache.step + torch.arange(count, device=cache.step.device)  # (t,)
        channels = self.step_channels[(steps - 1) % self.order.length]  # the channel of each step's input
        shifted = self.embed_values(previous, channels) * (steps > 0)[:, None]
        remainder, bounds = self.cell_inputs(previous, None, cache.remainder, steps)
        params = self.run_decoder(self.decoder_inputs(shifted, steps, cache.condition, remainder), cache=cache,
                                  bounds=bounds)
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
        queries over their own keys, masked by its pattern's rule), where P steps would each run
        every layer: for a completion, its given rows."""
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
        params = self(images, labels, low_res)
        return self.head.log_prob(params, self.targets(images))

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
        if cfg.attention == "local_2d" and rows % cfg.query_block_shape[0]:
            raise ValueError(f"given_rows={rows}: with 2D blocks of height {cfg.query_block_shape[0]} the given rows "
                             "must be a whole number of block rows, to come first in generation order")
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
        """Labels and a low-resolution input as this model needs them, for ``count`` images."""
        cfg = self.config
        check_labels(labels, count, cfg.num_classes, values=self.check_values)
        if self.encoder is not None:
            if low_res is None:
                low = cfg.low_res_size
                raise ValueError(f"this super-resolution model needs low_res images of shape (B, {low}, {low}, 3)")
            check_image_tensor("low_res", low_res, cfg.low_res_size, self.check_values)
            if low_res.shape[0] != count:
                raise ValueError(f"low_res has {low_res.shape[0]} images for {count} targets")
        elif low_res is not None:
            raise ValueError("this model has no encoder (encoder_layers=0): pass low_res=None")
