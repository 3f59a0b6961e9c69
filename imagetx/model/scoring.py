"""Bits/dim of images (docs/model.md §5): one batch as training's validation scores it, and a
whole set of images as ``python -m imagetx.evaluate`` scores it. Super-resolution inputs are
made here from each 32×32 target (``downsample_area``), so that they always match the model."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .config import ModelConfig
from .inputs import downsample_area
from .modes import eval_mode
from .transformer import ImageTransformer


def model_inputs(config: ModelConfig, batch: dict[str, torch.Tensor]):
    """(images, labels or None, low_res or None) for a batch: a dict of ``images`` and, where
    the model takes them, ``labels``. The low-resolution input is made from the image itself."""
    images = batch["images"]
    labels = batch["labels"] if config.num_classes else None
    low_res = downsample_area(images, config.superres.low_res_size) if config.superres else None
    return images, labels, low_res


def batch_bits_per_dim(model: ImageTransformer, batch: dict[str, torch.Tensor], given_rows: int = 0) -> torch.Tensor:
    """(B,) bits/dim of every image of a batch (as ``model_inputs`` reads it): of the whole
    image, or of the part below its first ``given_rows`` rows given them."""
    return model.bits_per_dim(*model_inputs(model.config, batch), given_rows=given_rows)


@torch.no_grad()
def evaluate(model: ImageTransformer, images: torch.Tensor, labels: torch.Tensor | None, batch_size: int = 32,
             rows: int = 0, progress: bool = True) -> dict[str, float]:
    """Bits/dim over all ``images`` (N, H, W, 3); with ``rows`` > 0, of the part below them.
    ``labels``: for a class-conditional model (None for unlabelled images). Scored in eval
    mode (no dropout), whatever mode the model is in; it is left in its own mode.

    Every image has as many scored dimensions, so the mean of the images' bits/dim is their
    total negative log-likelihood / (images · dimensions · ln 2)."""
    device = next(model.parameters()).device
    total_bits_per_dim = 0.0
    batches = range(0, len(images), batch_size)
    with eval_mode(model):
        for start in tqdm(batches, desc="evaluating", unit="batch", disable=not progress):
            batch = {"images": images[start : start + batch_size].to(device)}
            if labels is not None:
                batch["labels"] = labels[start : start + batch_size].to(device)
            total_bits_per_dim += float(batch_bits_per_dim(model, batch, rows).double().sum())
    return {"bpd": total_bits_per_dim / len(images), "images": len(images)}
