"""Cached incremental sampling (docs/model.md §7): one generation step at a time through all layers.

The model decodes a step with the same forward as the full pass, given a cache
(``ImageTransformer.start_decoding`` / ``decode(..., cache=)``): each self-attention
layer keeps a ring buffer of keys and values just long enough for the oldest key any
later query can still see (for 1D local attention with one memory block: 2·lq
positions, not the whole image), with the slots each step reads taken from the
pattern's own ``can_attend``; cross-attention keys/values over the encoder output are
computed once. ``CachedDecoder`` only drives it: tests check it equals the full pass.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .heads import check_temperature
from .model import ImageTransformer
from .order import sequence_to_images


class CachedDecoder:
    """Incremental decoder over a model in eval mode; ``step(t, previous)`` -> (B, P) parameters.

    Steps must come in order, t = 0, 1, 2, ...: the cache holds what steps before t left.
    """

    def __init__(self, model: ImageTransformer, batch: int, labels: Tensor | None = None,
                 low_res: Tensor | None = None) -> None:
        self.model, self.labels = model, labels
        self.cache = model.start_decoding(batch, low_res)
        self.index = self.cache.index  # the self-attention layers' ring buffer geometry
        weight = next(model.parameters())
        self.start = torch.zeros(batch, 1, model.config.d_model, device=weight.device, dtype=weight.dtype)
        self.previous_value: Tensor | None = None  # raw, for the cell remainder's running sums

    def step(self, t: int, previous: Tensor | None) -> Tensor:
        """Parameters for step t, given the embedding (B, 1, d) of step t−1's value (None at t = 0)."""
        if t != self.cache.step:
            raise ValueError(f"step {t} out of order: the cache is ready for step {self.cache.step}")
        model, remainder = self.model, None
        if model.cell_remainder is not None:
            remainder = model.cell_remainder(self.previous_value, None, self.cache.remainder)
        x = self.start if previous is None else previous
        return model.decode(x, self.labels, remainder=remainder, cache=self.cache)[:, 0]

    def embed_step(self, t: int, value: Tensor) -> Tensor:
        """Embedding (B, 1, d) of the value (B,) or (B, 3) generated at step t."""
        self.previous_value = value[:, None]
        return self.model.embed_values(self.previous_value, slice(t, t + 1))


def check_sampling_request(model: ImageTransformer, count: int, labels: Tensor | None,
                           temperature: float) -> None:
    if count < 1:
        raise ValueError(f"number of images {count} is invalid: ask for at least 1")
    check_temperature(temperature)
    classes = model.config.num_classes
    if classes and labels is None:
        raise ValueError(f"this model is class-conditional: give a label in 0..{classes - 1} per image")
    if not classes and labels is not None:
        raise ValueError("this model is unconditional (num_classes=0): give no class label")
    if labels is not None and (labels.shape != (count,) or labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"labels {labels.tolist()} are invalid: give {count} labels in 0..{classes - 1}")


@torch.no_grad()
def sample(
    model: ImageTransformer,
    count: int,
    labels: Tensor | None = None,
    low_res: Tensor | None = None,
    temperature: float = 1.0,
    prefix: Tensor | None = None,
    given_rows: int = 0,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> Tensor:
    """Generate ``count`` images (count, H, W, 3) uint8 with the cache.

    With ``prefix`` images and ``given_rows`` = k, every cell in the first k image
    rows is teacher-forced to the prefix's value (image completion, docs/model.md §6); the
    rest is sampled. In 2D block-raster order, given cells that come after sampled
    ones are still forced when their step comes.
    """
    check_sampling_request(model, count, labels, temperature)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if not 0 <= given_rows <= model.config.image_size:
        raise ValueError(f"given_rows={given_rows} is invalid: use 0..{model.config.image_size}")
    if given_rows and (prefix is None or prefix.shape[0] != count):
        raise ValueError(f"completion needs prefix images of shape ({count}, H, W, 3) for given_rows={given_rows}")
    given = model.step_rows < given_rows  # (T,) which steps are given; grid rows are image rows
    forced = model.targets(prefix.to(device)) if prefix is not None and given_rows else None
    decoder = CachedDecoder(model, count, labels, low_res)
    previous, values = None, []
    for t in tqdm(range(model.order.length), desc="sampling", unit="step", disable=not progress, leave=False):
        params = decoder.step(t, previous)
        if forced is not None and bool(given[t]):
            value = forced[:, t]
        else:
            value = model.head.sample(params[:, None], temperature, generator)[:, 0]
        values.append(value)
        previous = decoder.embed_step(t, value)
    model.train(was_training)
    sequence = torch.stack(values, dim=1)
    return sequence_to_images(sequence, model.order, model.config.head).to(torch.uint8)


@torch.no_grad()
def sample_uncached(model: ImageTransformer, count: int, labels: Tensor | None = None,
                    low_res: Tensor | None = None, temperature: float = 1.0, steps: int | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The original's method, for comparison: rerun the whole network at every step.

    ``steps`` stops early (the benchmark times a few steps and extrapolates).
    """
    check_sampling_request(model, count, labels, temperature)
    model.eval()
    device = next(model.parameters()).device
    cfg = model.config
    images = torch.zeros(count, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8, device=device)
    sequence = model.targets(images)
    for t in range(model.order.length if steps is None else steps):
        params = model(sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8), labels, low_res)
        sequence[:, t] = model.head.sample(params[:, t : t + 1], temperature, generator)[:, 0]
    return sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8)
