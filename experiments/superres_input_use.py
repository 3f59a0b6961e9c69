"""How much a super-resolution model uses its 8×8 input (docs/model.md §6): bits/dim of
each image given its own low-resolution version, and given the next image's instead.

    .venv/bin/python -m experiments.superres_input_use runs/quick_superres/checkpoints/last.ckpt \
        --data.root ../shared/cifar10 [--split val] [--count 200] [--json out.json] \
        [--baseline runs/quick/checkpoints/last.ckpt] [--box_means_at 0.8 1.0 [--samples 32]]

A model that ignores its input scores both the same; the gap is what the input is
worth to it. A model with ``exact_box_means`` gives another image's input no mass at all (its
cells' means differ): both figures, and the gap, are then those of its weights without the bounds,
beside its own score with them (``bpd_own_input_bounded``). With ``--baseline`` (a model without encoder), also where in the image the
super-resolution model does better or worse than it: bits per sub-pixel by column and
row inside the low-resolution cells, and on the first image column. With ``--box_means_at``,
also how closely its samples keep the input: the mean distance, in intensity levels, between
the box means of samples of the first ``--samples`` images (at each temperature given, seed 0)
and those images' 8×8 inputs. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from imagetx import load_model
from imagetx.cli.common import check_device
from imagetx.model.config import CHANNELS
from imagetx.model.heads import check_temperature
from imagetx.io.errors import CheckpointError
from imagetx.io.load import with_exact_box_means
from imagetx.model.superres import downsample_area
from imagetx.model.sampler import sample
from imagetx.data.sources import DataError, load

from experiments.json_result import emit


def log_probs(model, images: torch.Tensor, labels: torch.Tensor | None, low_res: torch.Tensor | None,
              batch: int) -> torch.Tensor:
    """(N, T) log-likelihood of every generation step of ``images``, in nats, scored in batches."""
    pick = lambda t, i: None if t is None else t[i : i + batch]  # noqa: E731
    with torch.no_grad():
        return torch.cat([model.log_prob(images[i : i + batch], pick(labels, i), low_res=pick(low_res, i))
                          for i in range(0, len(images), batch)])


def bits_per_dim(model, steps: torch.Tensor) -> float:
    """Mean bits/dim of the images whose per-step log-likelihoods are ``steps`` (docs/model.md §5)."""
    return (-steps.sum(dim=1) / (model.config.dims_per_image * math.log(2))).mean().item()


def bits_per_pixel_map(model, steps: torch.Tensor) -> torch.Tensor:
    """(H, W) mean bits per sub-pixel at each pixel position, from per-step log-likelihoods."""
    grid = model.order.sequence_to_grid(steps)  # (N, rows, cols) in image layout
    if model.config.head == "categorical":  # columns are sub-pixels: sum each pixel's three
        grid = grid.unflatten(2, (-1, CHANNELS)).sum(dim=3)
    return -grid.mean(dim=0) / (CHANNELS * math.log(2))


def gain_by_position(model, own_steps: torch.Tensor, baseline, baseline_steps: torch.Tensor) -> dict:
    """Baseline minus super-resolution bits per sub-pixel (positive: the input helps there)."""
    gain = bits_per_pixel_map(baseline, baseline_steps) - bits_per_pixel_map(model, own_steps)
    cell = model.config.image_size // model.config.superres.low_res_size
    return {"gain_by_cell_column": [round(gain[:, j::cell].mean().item(), 4) for j in range(cell)],
            "gain_by_cell_row": [round(gain[i::cell].mean().item(), 4) for i in range(cell)],
            "gain_first_image_column": round(gain[:, 0].mean().item(), 4),
            "gain_overall": round(gain.mean().item(), 4)}


def box_mean_distance(model, low_res: torch.Tensor, labels: torch.Tensor | None, temperature: float) -> float:
    """Mean |box mean of a sample - its input| over every low-res sub-pixel, in intensity levels
    (0-255): 0 for samples that average back to their inputs exactly. One sample per input, seed 0."""
    drawn = sample(model, len(low_res), labels, low_res, temperature, generator=torch.Generator(low_res.device).manual_seed(0))
    return (downsample_area(drawn, model.config.superres.low_res_size).float() - low_res.float()).abs().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt")
    parser.add_argument("--data.root", dest="root", default=None)
    parser.add_argument("--split", default="val")
    parser.add_argument("--val_size", type=int, default=5000, help="images held out of training for val")
    parser.add_argument("--count", type=int, default=200, help="first N images of the split (at least 2)")
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--baseline", default=None, help="a checkpoint without encoder to compare position by position")
    parser.add_argument("--box_means_at", type=float, nargs="*", default=[], metavar="T",
                        help="also sample the first --samples images at these temperatures and measure how far "
                             "the samples' box means are from their inputs")
    parser.add_argument("--samples", type=int, default=None, help="images sampled for --box_means_at "
                        "(default: 32, or --count if that is fewer)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    try:
        check_device(args.device)
    except ValueError as err:
        sys.exit(f"error: {err}")
    try:
        model = load_model(args.ckpt, map_location=args.device)
        baseline = load_model(args.baseline, map_location=args.device) if args.baseline else None
    except CheckpointError as err:
        sys.exit(f"error: {err}")
    if baseline is not None and (baseline.config.superres or baseline.config.image_size != model.config.image_size):
        sys.exit(f"error: --baseline {args.baseline} must be a {model.config.image_size}x{model.config.image_size} "
                 "model without encoder (no superres section)")
    if not model.config.superres:
        sys.exit(f"error: {args.ckpt} has no encoder (no superres section); pass a super-resolution checkpoint")
    if args.count < 2 or args.batch_size < 1:
        sys.exit("error: --count must be at least 2 (each image borrows another's input) and --batch_size at least 1")
    args.samples = min(32, args.count) if args.samples is None else args.samples
    if args.box_means_at and not 1 <= args.samples <= args.count:
        sys.exit(f"error: --samples {args.samples} must be from 1 to --count ({args.count}): the images sampled are scored ones")
    try:
        for temperature in args.box_means_at:
            check_temperature(temperature)
    except ValueError as err:
        sys.exit(f"error: --box_means_at: {err}")
    try:
        images, labels = load("cifar10", args.root, args.split, args.val_size, download=False)
    except DataError as err:
        sys.exit(f"error: {err}")
    images = images[: args.count].to(args.device)
    all_labels = labels[: args.count].to(args.device)
    labels = all_labels if model.config.num_classes else None
    low_res = downsample_area(images, model.config.superres.low_res_size)
    scorer = with_exact_box_means(model, False) if model.config.superres.exact_box_means else model
    own_steps = log_probs(scorer, images, labels, low_res, args.batch_size)
    own = bits_per_dim(scorer, own_steps)
    other = bits_per_dim(scorer, log_probs(scorer, images, labels, low_res.roll(1, dims=0), args.batch_size))
    result = {"bpd_own_input": own, "bpd_other_image_input": other, "gap": other - own,
              "images": len(images), "split": args.split, "ckpt": args.ckpt}
    if scorer is not model:
        result["bpd_own_input_bounded"] = bits_per_dim(model, log_probs(model, images, labels, low_res, args.batch_size))
    if baseline is not None:
        baseline_labels = all_labels if baseline.config.num_classes else None
        baseline_steps = log_probs(baseline, images, baseline_labels, None, args.batch_size)
        result.update(gain_by_position(model, own_steps, baseline, baseline_steps), baseline=args.baseline)
    for temperature in args.box_means_at:
        sampled = slice(0, args.samples)
        result[f"box_mean_distance_at_{temperature}"] = box_mean_distance(
            model, low_res[sampled], None if labels is None else labels[sampled], temperature)
    emit(result, args.json)


if __name__ == "__main__":
    main()
