"""Cached incremental sampling (docs/model.md §7): one generation step at a time through all layers.

The model decodes a step with the same layers as the full pass, given a cache
(``ImageTransformer.start_decoding`` / ``decode_step``): each self-attention layer keeps a
ring buffer of keys and values just long enough for the oldest key any later query can still
see (for 1D local attention with one memory block: 2·lq positions, not the whole image), the
slots each step reads taken from its pattern's blocks; cross-attention keys and values over
the encoder output are computed once. ``sample`` is the loop around it; tests check that
teacher-forced decoding equals the full pass.
"""

from __future__ import annotations

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .heads import check_temperature
from .model import ImageTransformer
from .modes import eval_mode
from .order import sequence_to_images


def check_count(count: int) -> None:
    if count < 1:
        raise ValueError(f"number of images {count} is invalid: ask for at least 1")


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
    """Generate ``count`` images (count, H, W, 3) uint8 with the cache, in eval mode (the
    model's own mode is restored after).

    With ``prefix`` images and ``given_rows`` = k, every step in the first k image rows
    (``model.given_steps``) is teacher-forced to the prefix's value (image completion,
    docs/model.md §6); the rest is sampled.
    """
    check_count(count)
    check_temperature(temperature)
    given = model.given_steps(given_rows).tolist()  # on the host, once: no device sync per step
    if given_rows and (prefix is None or prefix.shape[0] != count):
        raise ValueError(f"completion needs prefix images of shape ({count}, H, W, 3) for given_rows={given_rows}")
    forced = model.targets(prefix.to(model.step_rows.device)) if given_rows else None
    values, value = [], None
    with eval_mode(model):
        cache = model.start_decoding(count, labels, low_res)
        for t in tqdm(range(model.order.length), desc="sampling", unit="step", disable=not progress, leave=False):
            params = model.decode_step(value, cache)
            if given[t]:
                value = forced[:, t]
            else:
                value = model.head.sample(params[:, None], temperature, generator)[:, 0]
            values.append(value)
    sequence = torch.stack(values, dim=1)
    return sequence_to_images(sequence, model.order, model.config.head).to(torch.uint8)


@torch.no_grad()
def sample_uncached(model: ImageTransformer, count: int, labels: Tensor | None = None,
                    low_res: Tensor | None = None, temperature: float = 1.0, steps: int | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
    """The original's method, for comparison: rerun the whole network at every step (in eval
    mode; the model's own mode is restored after). ``steps`` stops early (the benchmark times
    a few steps and extrapolates)."""
    check_count(count)
    check_temperature(temperature)
    cfg = model.config
    images = torch.zeros(count, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8, device=model.step_rows.device)
    sequence = model.targets(images)
    with eval_mode(model):
        for t in range(model.order.length if steps is None else steps):
            params = model(sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8), labels, low_res)
            sequence[:, t] = model.head.sample(params[:, t : t + 1], temperature, generator)[:, 0]
    return sequence_to_images(sequence, model.order, cfg.head).to(torch.uint8)
