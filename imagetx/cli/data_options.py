"""The ``--data.*`` options that evaluate and sample share with training, read from
``ImageDataModule``'s signature: names, types, defaults and help in one place."""

from __future__ import annotations

from jsonargparse import ArgumentParser, Namespace

from ..data.datamodule import ImageDataModule
from ..data.sources import Reader

# The rest are training's own, or the model's (for evaluate and sample, the checkpoint's
# model decides them).
TRAINING_ONLY_DATA = {"batch_size", "eval_batch_size", "num_workers", "random_flip", "download", "val_size"}


def add_data_arguments(parser: ArgumentParser) -> None:
    """The ``--data.*`` options that evaluate and sample share with training (``--val_size``
    is their own: the same meaning as ``--data.val_size`` in training)."""
    parser.add_class_arguments(ImageDataModule, "data", skip=TRAINING_ONLY_DATA | set(ImageDataModule.FROM_MODEL))
    parser.add_argument("--val_size", type=int | None, default=None,
                        help="images held out of training for val, as in training (default: the source's)")


def data_reader(args: Namespace, image_size: int) -> Reader:
    """The data that ``add_data_arguments`` names, for a model of ``image_size`` (a folder is
    converted to that size; whether other data fits is ``sources.check_fits``'s to say)."""
    data = args.data
    return Reader(data.source, data.root, args.val_size, image_size, crop=data.crop, resize=data.resize,
                  cache=data.cache, rebuild=data.rebuild)
