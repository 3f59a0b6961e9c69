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

from imagetx.data.sources import DataError, Reader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="folder of train-*.npz shards")
    parser.add_argument("out", type=Path, help="folder to write train-0.npz into")
    parser.add_argument("--train", type=int, required=True, help="training images to keep, from the first")
    args = parser.parse_args()
    # The project's own reader: the shards in its order and checked, split at CIFAR-10's default val size.
    reader = Reader("cifar10", args.source, download=False)
    try:
        train, val = reader.split("train"), reader.split("val")
    except DataError as error:
        sys.exit(str(error))
    if not 0 < args.train <= len(train):
        sys.exit(f"--train {args.train}: must be 1..{len(train)}")
    images = np.concatenate([train.images[:args.train], val.images])
    labels = np.concatenate([train.labels[:args.train], val.labels]).astype(np.uint8)  # the shards' format
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "train-0.npz", images=images, labels=labels)
    print(f"{args.out / 'train-0.npz'}: {args.train} training + {len(val)} val images")


if __name__ == "__main__":
    main()
