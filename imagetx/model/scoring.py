"""Bits/dim of images (docs/model.md §5): one batch as training's validation scores it, and a
whole set of images as ``python -m imagetx.evaluate`` scores it. Super-resolution inputs are
made here from each 32×32 target (``downsample_area``), so that they always match the model."""

from __future__ import annotations

import sys

import torch
from tqdm.auto import tqdm

from .config import ModelConfig
from .superres import downsample_area
from .transformer import AutoregressiveModel, previous_values
from .modes import eval_mode
from .sampler import LOG_PROGRESS_SECONDS


def conditioning(config: ModelConfig, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """What the model of ``config`` takes beside a batch's images (a dict of ``images`` and,
    where the model takes them, ``labels`` and ``transforms``), as keyword arguments: ``labels`` (or
    None), ``transforms`` (None, the identity's, for a batch without: evaluation's), and for a
    super-resolution model ``low_res``, made from the images themselves."""
    given = {"labels": batch["labels"] if config.num_classes else None,
             "transforms": batch.get("transforms") if config.num_transforms else None}
    if config.superres:
        given["low_res"] = downsample_area(batch["images"], config.superres.low_res_size)
    return given


def full_pass(model: AutoregressiveModel, images: torch.Tensor,
              labels: torch.Tensor | None = None, low_res: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, P) the head's parameters at every step of uint8 ``images`` (B, H, W, 3), teacher-forced
    (inputs unchecked: ``log_prob`` checks them); with ``exact_box_means`` and (B, T, 2c) each step's
    value bounds (heads.params_and_bounds)."""
    given = {"labels": labels} if low_res is None else {"labels": labels, "low_res": low_res}  # a plain decoder takes none
    return model(previous_values(model.targets(images)), **given)


def batch_bits_per_dim(model: AutoregressiveModel, batch: dict[str, torch.Tensor],
                       given_rows: int = 0, check: bool = True) -> torch.Tensor:
    """(B,) bits/dim of every image of a batch (``conditioning`` reads what else it holds): of the
    whole image, or of the part below its first ``given_rows`` rows given them. ``check`` False:
    the batch's values were checked as it was read (``AutoregressiveModel.log_prob``)."""
    return model.bits_per_dim(batch["images"], **conditioning(model.config, batch), given_rows=given_rows, check=check)


@torch.no_grad()
def evaluate(model: AutoregressiveModel, images: torch.Tensor, labels: torch.Tensor | None,
             batch_size: int = 32, rows: int = 0, progress: bool = True) -> dict[str, float]:
    """Bits/dim over all ``images`` (N, H, W, 3); with ``rows`` > 0, of the part below them.
    ``labels``: for a class-conditional model (None for unlabelled images). Scored in eval
    mode (no dropout), whatever mode the model is in; it is left in its own mode.

    Every image has as many scored dimensions, so the mean of the images' bits/dim is their
    total negative log-likelihood / (images · dimensions · ln 2)."""
    device = next(model.parameters()).device
    total_bits_per_dim = 0.0
    batches = range(0, len(images), batch_size)
    # as sampling's bar: where stderr is not a terminal each redraw is a line of a log, so sparingly
    interval = {} if sys.stderr.isatty() else {"mininterval": LOG_PROGRESS_SECONDS}
    with eval_mode(model):
        for start in tqdm(batches, desc="evaluating", unit="batch", disable=not progress, **interval):
            batch = {"images": images[start : start + batch_size].to(device)}
            if labels is not None:
                batch["labels"] = labels[start : start + batch_size].to(device)
            total_bits_per_dim += float(batch_bits_per_dim(model, batch, rows).double().sum())
    return {"bpd": total_bits_per_dim / len(images), "images": len(images)}
