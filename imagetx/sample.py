"""``python -m imagetx.sample``: image grids from a checkpoint (SPEC §6, §7).

    python -m imagetx.sample --ckpt CKPT --task generate [--count 16] [--label 3]
    python -m imagetx.sample --ckpt CKPT --task complete [--rows 16] [--images a.png b.jpg]
    python -m imagetx.sample --ckpt CKPT --task superres [--temperatures 0.8 0.9 1.0]

Grids (PNG, one row per input):
* generate: the samples;
* complete: given prefix (rest grey) | samples | original;
* superres: nearest-upsampled 8×8 input | one sample per temperature | original.
Inputs come from a data split (``--data.root``, ``--split``) or from image files
(any size: centre-cropped and resized, which is printed). A JSON summary (files,
seconds, images/s) is written beside the grids and printed as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from .checkpoint import CheckpointError, check_device, check_writable, load_model
from .data import SPLITS, DataError, default_root, downsample_area, load_cifar10
from .heads import check_temperature
from .images import load_image_file, save_grid, upsample_nearest
from .model import ImageTransformer
from .sampler import sample

IMAGES_PER_ROW = 8
GREY = 128  # fills the part of a completion's input that the model is not shown


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--task", default="generate", choices=("generate", "complete", "superres"))
    parser.add_argument("--count", type=int, default=8, help="images to generate, or inputs to complete/upsample")
    parser.add_argument("--samples", type=int, default=3, help="samples per input (complete)")
    parser.add_argument("--label", type=int, default=None, help="class for every image (class-conditional models)")
    parser.add_argument("--rows", type=int, default=16, help="rows given for completion")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.8, 0.9, 1.0], help="for superres")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="samples", help="output directory")
    parser.add_argument("--images", nargs="+", default=None, help="your own image files as inputs")
    parser.add_argument("--data.root", dest="root", default=None)
    parser.add_argument("--split", default="val", choices=SPLITS)
    parser.add_argument("--val_size", type=int, default=5000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


def check_request(args: argparse.Namespace, model: ImageTransformer) -> None:
    cfg = model.config
    if args.count < 1 or args.samples < 1:
        raise ValueError(f"--count {args.count} / --samples {args.samples}: both must be at least 1")
    for temperature in [args.temperature, *args.temperatures]:
        check_temperature(temperature)
    if args.task == "complete" and not 0 <= args.rows <= cfg.image_size:
        raise ValueError(f"--rows {args.rows} is outside 0..{cfg.image_size}")
    if args.label is not None and not cfg.num_classes:
        raise ValueError("--label given, but this model is unconditional: drop --label")
    if args.label is not None and not 0 <= args.label < cfg.num_classes:
        raise ValueError(f"--label {args.label} is outside 0..{cfg.num_classes - 1}")
    if args.task == "superres" and not cfg.encoder_layers:
        raise ValueError("--task superres needs a super-resolution checkpoint (encoder_layers > 0)")
    if args.task != "superres" and cfg.encoder_layers:
        raise ValueError("this is a super-resolution checkpoint: use --task superres")


def load_inputs(args: argparse.Namespace, size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, size, size, 3) uint8 inputs and their labels (None for user files)."""
    if args.images:
        loaded = [load_image_file(path, size) for path in args.images]
        for _, note in loaded:
            print(f"input {note}", file=sys.stderr)
        return torch.stack([image for image, _ in loaded]), None
    images, labels = load_cifar10(args.root or default_root(), args.split, args.val_size)
    return images[: args.count], labels[: args.count]


def labels_for(model: ImageTransformer, count: int, label: int | None, given: torch.Tensor | None):
    classes = model.config.num_classes
    if not classes:
        return None
    if label is not None:
        return torch.full((count,), label, dtype=torch.long)
    if given is not None:
        return given.long()
    return torch.arange(count) % classes


def run(args: argparse.Namespace) -> dict:
    check_device(args.device)
    model = load_model(args.ckpt, map_location=args.device)
    check_request(args, model)
    out = check_writable(args.out, "--out")
    cfg, device = model.config, args.device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    started, produced, grids = time.perf_counter(), 0, []

    if args.task == "generate":
        labels = labels_for(model, args.count, args.label, None)
        images = sample(model, args.count, _to(labels, device), temperature=args.temperature,
                        generator=generator, progress=True)
        produced = args.count
        grids.append(save_grid(list(images.split(IMAGES_PER_ROW)), out / "generate.png"))
    else:
        inputs, given_labels = load_inputs(args, cfg.image_size)
        count = len(inputs)
        labels = labels_for(model, count, args.label, given_labels)
        columns = []
        if args.task == "complete":
            shown = inputs.clone()
            shown[:, args.rows :] = GREY
            columns.append(shown)
            for _ in range(args.samples):
                columns.append(sample(model, count, _to(labels, device), temperature=args.temperature,
                                      prefix=inputs.to(device), given_rows=args.rows,
                                      generator=generator, progress=True).cpu())
        else:
            low_res = downsample_area(inputs, cfg.low_res_size)
            columns.append(upsample_nearest(low_res, cfg.image_size))
            for temperature in args.temperatures:
                columns.append(sample(model, count, _to(labels, device), low_res.to(device), temperature,
                                      generator=generator, progress=True).cpu())
        produced = count * (len(columns) - 1)
        columns.append(inputs)
        rows = [torch.stack([column[i] for column in columns]) for i in range(count)]
        grids.append(save_grid(rows, out / f"{args.task}.png"))

    seconds = time.perf_counter() - started
    summary = {"task": args.task, "files": [str(p) for p in grids], "images": produced,
               "seconds": round(seconds, 2), "images_per_sec": round(produced / seconds, 3),
               "temperature": args.temperature if args.task != "superres" else args.temperatures,
               "seed": args.seed, "ckpt": str(args.ckpt)}
    (out / f"{args.task}.json").write_text(json.dumps(summary, indent=2))
    log_to_wandb(grids, args.task)
    return summary


def _to(tensor: torch.Tensor | None, device: str) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def log_to_wandb(paths: list[Path], task: str) -> None:
    """Log grids to the active W&B run, if there is one; never fail the command over it."""
    try:
        import wandb

        if wandb.run is not None:
            wandb.log({f"samples/{task}": [wandb.Image(str(p)) for p in paths]})
    except Exception as error:  # logging is a convenience, the files are already written
        print(f"W&B logging skipped: {error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        summary = run(args)
    except (CheckpointError, DataError, ValueError, OSError) as error:
        if os.environ.get("IMAGETX_DEBUG"):
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
