"""What every data source shares: the error it raises, the pool of images it reads,
and the check that a model fits the data.

A source reads *pools*: its training images (``train``) and, where it has one, its
official held-out set (CIFAR-10's ``test``, ImageNet's ``val``). ``imagetx.data.sources.Reader``
cuts the splits (train / val / test) out of them.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError
from ...io.atomic import atomic_write


class DataError(UserError, RuntimeError):
    """Data that cannot be found or read; the message says where and what to do. A ``UserError``
    (the commands show it as one line) and, as it always was, a ``RuntimeError``."""


def as_given(path: Path) -> str:
    """``path`` for a message, as the user gave it (a symlink by its own name, not its target's),
    with the absolute path it means from here when it is relative."""
    return str(path) if path.is_absolute() else f"{path} ({os.path.abspath(path)})"


# Makes the array a reader fills with a pool's images: ``allocate(shape)`` -> uint8 array of that
# shape. ``np.empty`` by default; mapped.py's writes the file that every process then maps, so
# that the images are never all in a reader's own memory.
Allocate = Callable[[tuple[int, ...]], np.ndarray]


def in_memory(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, np.uint8)


@dataclass
class Pool:
    """Images of one pool of a source, or a split cut from one."""

    images: np.ndarray  # uint8 (N, S, S, 3), RGB
    labels: np.ndarray | None  # int64 (N,) in 0..num_classes-1; None: unlabelled
    num_classes: int  # classes the source defines (0: unlabelled)
    where: str  # the options that name the data, for messages: "--data.source imagenet --data.root DIR"

    @property
    def image_size(self) -> int:
        return int(self.images.shape[1])

    def __len__(self) -> int:
        return len(self.images)

    def part(self, start: int | None, stop: int | None) -> "Pool":
        """Images [start:stop]: views, nothing copied."""
        labels = None if self.labels is None else self.labels[start:stop]
        return Pool(self.images[start:stop], labels, self.num_classes, self.where)


def check_fits(data: Pool, image_size: int | None, num_classes: int | None, checkpoint: bool = False) -> None:
    """Raise a DataError when a model of ``image_size`` and ``num_classes`` (0: unconditional)
    cannot read ``data``: another image size, a class-conditional model on unlabelled data,
    another number of classes, or values out of its range (images not uint8, labels outside
    0..num_classes−1). None: that part is not checked.

    ``checkpoint``: the model comes from a checkpoint (evaluate, sample), so the fix is
    other data rather than another model setting."""
    if data.images.dtype != np.uint8:  # every reader gives uint8; a damaged folder conversion might not
        raise DataError(f"{data.where} holds {data.images.dtype} images, not uint8: the data is damaged "
                        "(a folder: convert it again with --data.rebuild true)")
    size = data.image_size
    if image_size is not None and size != image_size:
        the_model = "the checkpoint's model" if checkpoint else "the model"
        fix = (f"use {image_size}x{image_size} data (e.g. the {image_size}x{image_size} variant of the dataset)"
               if checkpoint else f"set --model.config.image_size {size} or use {image_size}x{image_size} data "
                                  f"(e.g. the {image_size}x{image_size} variant of the dataset)")
        raise DataError(f"{data.where} holds {size}x{size} images but {the_model} is {image_size}x{image_size}: {fix}")
    if not num_classes:
        return  # an unconditional model reads any images
    if data.labels is None:
        fix = ("give labelled data (a folder with one sub-folder per class)" if checkpoint
               else "set --model.config.num_classes 0 for an unconditional model, or put the images in one "
                    "sub-folder per class")
        raise DataError(f"the model is class-conditional (num_classes={num_classes}) but {data.where} has no labels: "
                        f"{fix}")
    if data.num_classes != num_classes:
        fix = ("give data with as many classes" if checkpoint
               else f"set --model.config.num_classes {data.num_classes} (or 0 for an unconditional model)")
        raise DataError(f"{data.where} has {data.num_classes} classes but the model has num_classes={num_classes}: "
                        f"{fix}")
    # Once, here, for every source (a folder's labels come back from its converted shards):
    # training steps then never read labels back from the device (ImageDataModule.values_checked_for).
    labels = data.labels
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{data.where} has labels {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}: "
                        "the data is damaged (a folder: convert it again with --data.rebuild true)")


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` that gives the same bytes for the same arrays (a fixed zip timestamp),
    written atomically (``atomic.atomic_write``)."""

    def write(handle) -> None:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED) as archive:
            for name, array in arrays.items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                with archive.open(info, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)

    atomic_write(path, write)
