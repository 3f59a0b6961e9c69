"""Where images come from (``--data.source``): CIFAR-10, downsampled ImageNet, or a folder
of images. Each gives uint8 images (N, S, S, 3), RGB, and labels where it has them.

    from imagetx.data.sources import load
    images, labels = load("imagenet", "data/imagenet32", "train")   # labels: None when unlabelled

Splits: ``train``, less the last ``val_size`` images; ``val``, those (ImageNet with
``val_size`` 0, its default: the official validation set; other sources have no val
with 0); ``test``, the official held-out images (CIFAR-10's test set, ImageNet's
validation set; a folder has none).
``val_size`` None takes the source's default: CIFAR-10 5,000, ImageNet 0, a folder a
tenth of its images (at most 5,000). docs/data.md says where to get each dataset.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from ..options import FOLDER_ONLY, DataOptions
from . import cifar10, folder, imagenet
from ...errors import shown
from .common import DataError, Pool, as_given, check_fits, in_memory
from .mapped import mapped_pool

SOURCES = {"cifar10": cifar10, "imagenet": imagenet, "folder": folder}
SPLITS = ("train", "val", "test")

__all__ = ["DataError", "Pool", "Reader", "SOURCES", "SPLITS", "check_fits", "default_root", "load"]


def default_root() -> Path:
    return Path(os.environ.get("IMAGETX_DATA", "./data"))


def mapped_cache(root: Path) -> Path:
    """Where the memory-mapped pools of the data at ``root`` go: ``<root>/.imagetx-cache/mapped``, or,
    where ``root`` cannot be written (a shared, read-only data set), a folder of the user's cache
    named after ``root``'s path."""
    if os.access(root, os.W_OK):
        return root / folder.CACHE_NAME / "mapped"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return user / "imagetx" / "mapped" / hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]


class Reader:
    """One source at one root, with its options: reads each pool once, cuts splits from it.

    ``image_size``: the side a folder is converted to (default 32); the other sources hold
    images of their own side (whether a model fits them is ``check_fits``'s to say). The
    ``folder`` options (``crop``, ``resize``, ``cache``, ``rebuild``) are refused with
    another source. ``val_size_from``: where ``val_size`` was set (the option, or a file), so that
    a value the data cannot hold is refused naming what to change."""

    def __init__(self, source: str = DataOptions.source, root: str | os.PathLike | None = None,
                 val_size: int | None = None, image_size: int | None = None, download: bool = True,
                 crop: str = DataOptions.crop, resize: str = DataOptions.resize, cache: str | None = DataOptions.cache,
                 rebuild: bool = DataOptions.rebuild, val_size_from: str | None = None) -> None:
        if source not in SOURCES:
            raise DataError(f"--data.source {source!r} is unknown: choose one of {', '.join(SOURCES)}")
        options = {"crop": crop, "resize": resize, "cache": cache, "rebuild": rebuild}
        if source != "folder":
            given = [f"--data.{key}" for key in FOLDER_ONLY if options[key] != getattr(DataOptions, key)]
            if given:
                raise DataError(f"{', '.join(given)} applies to --data.source folder only, not {source}: drop it")
        self.source, self.module = source, SOURCES[source]
        self.root = Path(root).expanduser() if root else default_root()
        self.val_size, self.image_size, self.download, self.options = val_size, image_size, download, options
        self.val_size_from = val_size_from
        self.pools: dict[str, Pool] = {}
        self.converted: Path | None = None  # a folder's conversion, once made or checked

    def prepare(self) -> None:
        """Whatever must happen once before reading: converting a folder (or rebuilding it)."""
        if self.source == "folder" and self.converted is None:
            self.converted = folder.convert(self.root, self.image_size or 32, **self.options)

    def pool(self, part: str) -> Pool:
        """The pool ``part``, from its memory-mapped copy (mapped.py), shared by every process."""
        if part not in self.pools:
            if self.source == "cifar10":
                self.refuse_a_missing_root()
                files, cache = cifar10.pool_files(self.root, part), mapped_cache(self.root)
                read = lambda allocate: cifar10.read(self.root, part, self.download, allocate)  # noqa: E731
            elif self.source == "imagenet":
                files, cache = imagenet.pool_files(self.root, part), mapped_cache(self.root)
                read = lambda allocate: imagenet.read(self.root, part, allocate)  # noqa: E731
            else:
                self.prepare()
                files = [self.converted / "manifest.json", *folder.converted_shards(self.converted)]
                read = lambda allocate: folder.read_converted(self.root, self.converted, allocate)  # noqa: E731
                cache = self.converted
            # no files: the reader finds none (and says so) or downloads them, and the next start maps them
            self.pools[part] = mapped_pool(cache, f"{self.source}-{part}", files, read) if files else \
                read(in_memory)
        return self.pools[part]

    def refuse_a_missing_root(self) -> None:
        """A ``--data.root`` that does not exist is a mistyped path more often than a wish to download
        CIFAR-10 there: on a machine with a network it received the download. Only the default root
        (``./data``, ``IMAGETX_DATA``) or a folder that exists takes one."""
        if not self.root.exists() and self.root != default_root():
            raise DataError(f"--data.root {shown(as_given(self.root))} does not exist: check the path, or set "
                            "IMAGETX_DATA=DIR (CIFAR-10 is downloaded only into a folder that exists, or into the "
                            f"default {default_root()}: to download it there, make the folder first)")

    def split(self, split: str) -> Pool:
        """One split, as views into its pool."""
        if split not in SPLITS:
            raise DataError(f"split {split!r} is unknown; choose one of {', '.join(SPLITS)}")
        held_out = self.module.HELD_OUT
        if split == "test":
            if held_out is None:
                raise DataError(f"--data.source {self.source} has no test split (no official held-out images): "
                                "use the split val (the last val_size images) or train")
            return self.pool(held_out)
        train = self.pool("train")
        default = self.module.default_val_size(len(train))
        val_size = default if self.val_size is None else self.val_size
        given = f"val_size {val_size}" + (f" (from {self.val_size_from})" if self.val_size_from else "")
        if val_size == 0:  # nothing held out of train
            if split == "train":
                return train
            if held_out == "val":  # ImageNet: validate on the official validation set
                return self.pool(held_out)
            raise DataError(f"{given} leaves --data.source {self.source} no val split: give val_size between 1 "
                            f"and {len(train) - 1} (the last training images)")
        if self.val_size is None and not 0 < val_size < len(train):
            raise DataError(f"{train.where} holds {len(train)} training image(s): too few to hold any out for "
                            "validation; add images")
        if not 0 < val_size < len(train):
            raise DataError(f"{given} must be between 1 and {len(train) - 1} ({train.where} holds {len(train)} "
                            "training images), or 0 to hold none out" +
                            (" and validate on the official validation set" if held_out == "val" else "") +
                            f": give another, or leave it out for the source's default ({default} here)")
        cut = len(train) - val_size
        return train.part(None, cut) if split == "train" else train.part(cut, None)


def tensors(pool: Pool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images uint8 (N, S, S, 3), labels long (N,) or None) as torch tensors, sharing memory where they can."""
    images = torch.from_numpy(pool.images if pool.images.flags.c_contiguous else pool.images.copy())
    return images, None if pool.labels is None else torch.from_numpy(pool.labels.astype("int64", copy=False))


def load(source: str, root: str | os.PathLike | None, split: str, val_size: int | None = None,
         **options) -> tuple[torch.Tensor, torch.Tensor | None]:
    """uint8 images (N, S, S, 3) and long labels (N,) (None when unlabelled) of one split."""
    return tensors(Reader(source, root, val_size, **options).split(split))
