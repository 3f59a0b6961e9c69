"""Training data streamed by LitData, for runs whose machines share no filesystem (several nodes,
object storage): an optional extra, ``pip install 'imagetx[litdata]'``.

Written once from any source imagetx reads, into LitData's chunked format (``litdata.optimize``),
one folder a split; then every process streams its share (``litdata.StreamingDataset``, which
splits the data among processes by itself):

    python -m imagetx.data.streaming --data.source cifar10 --data.root ../shared/cifar10 --out DIR
    python -m imagetx.train --config configs/quick.yaml --data.source litdata --data.root DIR

``DIR`` may be a local folder or one LitData reads remotely (``s3://bucket/cifar10``; write it
locally, then upload it). An epoch holds every training image once, shuffled from the run's seed
and the epoch (LitData's shuffle), flipped as ``--data.random_flip`` says from (seed, epoch,
image); the loader's place (``litdata.StreamingDataLoader``'s state) goes into every checkpoint
through Lightning, so a run resumed mid-epoch goes on exactly. Each item: ``index`` (the image's
place in its split), ``image`` uint8 (S, S, 3), ``label`` (−1 where unlabelled) and ``classes``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterator

import numpy as np
import torch

from .seeding import mix_seed

SPLITS = ("train", "val", "test")
ITEMS_PER_INPUT = 1000  # images an optimize task writes: enough to keep a worker busy, few tasks
CHUNK_BYTES = "64MB"  # LitData's chunk size: whole chunks are fetched from object storage


def require_litdata():
    try:
        import litdata
    except ImportError:
        raise ImportError("--data.source litdata needs LitData: pip install 'imagetx[litdata]'") from None
    return litdata


def split_items(source: str, root: str, val_size: int | None, split: str, indices: range) -> Iterator[dict]:
    """The items of images ``indices`` of ``split`` (a task of ``litdata.optimize``, run in its workers)."""
    from .sources import Reader

    pool = Reader(source, root, val_size).split(split)
    for index in indices:
        yield {"index": index, "image": np.ascontiguousarray(pool.images[index]),
               "label": int(pool.labels[index]) if pool.labels is not None else -1, "classes": pool.num_classes}


def optimize(source: str, root: str, out: str, val_size: int | None = None, num_workers: int = 1) -> dict[str, int]:
    """Write the splits of ``source`` at ``root`` under ``out``/SPLIT in LitData's format; returns
    each split's image count (a split the source lacks, a test split say, is left out)."""
    litdata = require_litdata()
    from .sources import DataError, Reader

    counts = {}
    reader = Reader(source, root, val_size)
    for split in SPLITS:
        try:
            count = len(reader.split(split))
        except DataError:
            if split == "train":
                raise
            continue  # no such split here
        inputs = [range(start, min(start + ITEMS_PER_INPUT, count)) for start in range(0, count, ITEMS_PER_INPUT)]
        litdata.optimize(fn=functools.partial(split_items, source, root, val_size, split), inputs=inputs,
                         output_dir=f"{out.rstrip('/')}/{split}", chunk_bytes=CHUNK_BYTES, num_workers=num_workers,
                         mode="overwrite")
        counts[split] = count
    return counts


try:
    from litdata import StreamingDataset
except ImportError:  # the optional extra is not installed: said where it is needed (require_litdata)
    StreamingDataset = object


class StreamedImages(StreamingDataset):
    """A split in LitData's format as imagetx's items ({"images", "labels"}), each image flipped as
    (seed, epoch, index) says where ``random_flip``."""

    def __init__(self, url: str, shuffle: bool, seed: int, random_flip: bool = False) -> None:
        require_litdata()
        super().__init__(url, shuffle=shuffle, seed=seed, drop_last=False)
        self.flip_seed, self.random_flip = seed, random_flip

    def __getitem__(self, key) -> dict[str, torch.Tensor]:
        item = super().__getitem__(key)
        image = torch.as_tensor(item["image"])
        if self.random_flip and flipped(self.flip_seed, self.current_epoch, int(item["index"])):
            image = image.flip(1)
        out = {"images": image}
        if item["classes"]:
            out["labels"] = torch.tensor(item["label"], dtype=torch.long)
        return out


def flipped(seed: int, epoch: int, index: int) -> bool:
    """Whether image ``index`` is flipped in ``epoch``: a function of the three alone, so a resumed
    run flips as the uninterrupted one."""
    return bool(np.random.default_rng([mix_seed(seed, epoch), index]).random() < 0.5)


def first_item(url: str) -> dict:
    """The first item of a split, as written (its image's shape and the classes of the data)."""
    return require_litdata().StreamingDataset(url, shuffle=False)[0]


def loader(dataset: StreamedImages, batch_size: int, num_workers: int):
    """LitData's loader, whose place in the epoch Lightning keeps in every checkpoint."""
    return require_litdata().StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imagetx.data.streaming",
                                     description="Write a data source's splits in LitData's format, for "
                                                 "--data.source litdata.")
    parser.add_argument("--data.source", dest="source", default="cifar10", choices=["cifar10", "imagenet", "folder"])
    parser.add_argument("--data.root", dest="root", required=True, help="the source's data folder")
    parser.add_argument("--data.val_size", dest="val_size", type=int, default=None,
                        help="training images held out for validation, as training takes it")
    parser.add_argument("--out", required=True, help="the folder written (one sub-folder a split)")
    parser.add_argument("--workers", type=int, default=1, help="LitData's worker processes")
    options = parser.parse_args(args)
    from .sources import DataError

    try:
        counts = optimize(options.source, options.root, options.out, options.val_size, options.workers)
    except (DataError, ImportError) as error:
        raise SystemExit(f"error: {error}") from None
    print(f"wrote {', '.join(f'{count:,} {split}' for split, count in counts.items())} images to {options.out}: "
          f"train with --data.source litdata --data.root {options.out}")


if __name__ == "__main__":
    main()
