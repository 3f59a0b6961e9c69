"""The ``--data.*`` options that evaluate and sample share with training: ``DataOptions``, a plain
dataclass (names, types, defaults and help in one place), so that neither command imports the
training stack (Lightning, torchdata)."""

from __future__ import annotations

from typing import Literal

from jsonargparse import ArgumentParser, Namespace

from ..data.options import DataOptions
from ..data.sources import SPLITS, Reader


def add_data_arguments(parser: ArgumentParser) -> None:
    """The ``--data.*`` options that evaluate and sample share with training (``--val_size``
    is their own: the same meaning as ``--data.val_size`` in training)."""
    parser.add_class_arguments(DataOptions, "data")
    parser.add_argument("--val_size", type=int | None, default=None,
                        help="images held out of training for val, as in training (default: the source's)")


def add_split_argument(parser: ArgumentParser) -> None:
    """``--split``, the same for evaluate and sample: val by default, the split that every source
    training runs on has (a folder and the shared CIFAR-10 shards have no test split) and the one
    training reports."""
    parser.add_argument("--split", type=Literal[SPLITS], default="val",
                        help="val: the images training validates on; test: the official held-out images "
                             "(ImageNet: its validation set; a folder has none); train")


def data_reader(args: Namespace, image_size: int) -> Reader:
    """The data that ``add_data_arguments`` names, for a model of ``image_size`` (a folder is
    converted to that size; whether other data fits is ``sources.check_fits``'s to say)."""
    data = args.data
    return Reader(data.source, data.root, args.val_size, image_size, crop=data.crop, resize=data.resize,
                  cache=data.cache, rebuild=data.rebuild, val_size_from="--val_size")
