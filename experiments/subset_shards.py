"""A CIFAR-10 shard folder with the first N training images and the same 5,000 val images
(the last 5,000 of the 50,000), for runs of many epochs in miniature:

    .venv/bin/python -m experiments.subset_shards ../shared/cifar10 runs/cifar10_2000 --train 2000

The output is one ``train-0.npz`` in the shared folder's format; with ``--data.val_size 5000``
its last 5,000 images are the val split every other run is scored on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

VAL_SIZE = 5000  # the project's val split: the last 5,000 training images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="folder of train-*.npz shards")
    parser.add_argument("out", type=Path, help="folder to write train-0.npz into")
    parser.add_argument("--train", type=int, required=True, help="training images to keep, from the first")
    args = parser.parse_args()
    shards = sorted(args.source.glob("train-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    if not shards:
        sys.exit(f"{args.source}: no train-*.npz shards")
    arrays = [np.load(p) for p in shards]
    images = np.concatenate([a["images"] for a in arrays])
    labels = np.concatenate([a["labels"] for a in arrays])
    if not 0 < args.train <= len(images) - VAL_SIZE:
        sys.exit(f"--train {args.train}: must be 1..{len(images) - VAL_SIZE}")
    keep = np.r_[0:args.train, len(images) - VAL_SIZE:len(images)]
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "train-0.npz", images=images[keep], labels=labels[keep])
    print(f"{args.out / 'train-0.npz'}: {args.train} training + {VAL_SIZE} val images")


if __name__ == "__main__":
    main()
