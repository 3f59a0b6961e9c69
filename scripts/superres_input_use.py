"""How much a super-resolution model uses its 8×8 input (SPEC §6): bits/dim of each
image given its own low-resolution version, and given the next image's instead.

    .venv/bin/python scripts/superres_input_use.py runs/quick_superres/checkpoints/last.ckpt \
        --data.root ../shared/cifar10 [--split val] [--count 200] [--json out.json]

A model that ignores its input scores both the same; the gap is what the input is
worth to it. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from imagetx import load_model
from imagetx.checkpoint import CheckpointError
from imagetx.data import DataError, default_root, downsample_area, load_cifar10


def bits_per_dim(model, images: torch.Tensor, labels: torch.Tensor | None, low_res: torch.Tensor,
                 batch: int) -> float:
    """Mean bits/dim of ``images`` given ``low_res`` (and ``labels`` for a class-conditional model)."""
    with torch.no_grad():
        return torch.cat([model.bits_per_dim(images[i : i + batch], None if labels is None else labels[i : i + batch],
                                             low_res[i : i + batch])
                          for i in range(0, len(images), batch)]).mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt")
    parser.add_argument("--data.root", dest="root", default=None)
    parser.add_argument("--split", default="val")
    parser.add_argument("--val_size", type=int, default=5000, help="images held out of training for val")
    parser.add_argument("--count", type=int, default=200, help="first N images of the split (at least 2)")
    parser.add_argument("--batch_size", type=int, default=50)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    try:
        model = load_model(args.ckpt)
    except CheckpointError as err:
        sys.exit(f"error: {err}")
    if model.encoder is None:
        sys.exit(f"error: {args.ckpt} has no encoder (encoder_layers=0); pass a super-resolution checkpoint")
    if args.count < 2 or args.batch_size < 1:
        sys.exit("error: --count must be at least 2 (each image borrows another's input) and --batch_size at least 1")
    try:
        images, labels = load_cifar10(args.root or default_root(), args.split, args.val_size, download=False)
    except DataError as err:
        sys.exit(f"error: {err}")
    images = images[: args.count]
    labels = labels[: args.count] if model.config.num_classes else None
    low_res = downsample_area(images, model.config.low_res_size)
    own = bits_per_dim(model, images, labels, low_res, args.batch_size)
    other = bits_per_dim(model, images, labels, low_res.roll(1, dims=0), args.batch_size)
    result = {"bpd_own_input": own, "bpd_other_image_input": other, "gap": other - own,
              "images": len(images), "split": args.split, "ckpt": args.ckpt}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
