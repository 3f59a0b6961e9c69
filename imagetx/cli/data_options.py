"""What evaluate and sample share about their data: the ``--data.*`` options training takes
(``DataOptions``, data/options.py, and ``--data.val_size``), ``--split``, and the ``Reader`` of the
data those name (``data_reader``), without importing the training stack (Lightning, torchdata:
tests/test_layers.py)."""

from __future__ import annotations

from typing import Literal

from jsonargparse import ArgumentParser, Namespace

from ..data.options import DataOptions
from ..data.sources import SPLITS, Reader
from ..errors import UserError


def add_data_arguments(parser: ArgumentParser) -> None:
    """The ``--data.*`` options that evaluate and sample share with training, ``--data.val_size``
    among them (DataOptions lacks it: the DataModule takes it itself); ``--val_size``, its older
    spelling here, is kept so that earlier commands still run."""
    parser.add_class_arguments(DataOptions, "data")
    parser.add_argument("--data.val_size", type=int | None, default=None,
                        help="images held out of training for val: give the training run's value (default: the source's)")
    parser.add_argument("--val_size", type=int | None, default=None, help="the same as --data.val_size")


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
    val_size, val_size_from = data.val_size, "--data.val_size"
    if args.val_size is not None:
        if val_size is not None and val_size != args.val_size:
            raise UserError(f"--data.val_size {val_size} and --val_size {args.val_size} disagree: "
                            "give one of them (--data.val_size, as training takes it)")
        val_size, val_size_from = args.val_size, "--val_size"
    return Reader(data.source, data.root, val_size, image_size, crop=data.crop, resize=data.resize,
                  cache=data.cache, rebuild=data.rebuild, val_size_from=val_size_from)
