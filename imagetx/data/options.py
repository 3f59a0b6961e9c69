"""The ``--data.*`` options that say where the images are and how a folder is converted: one plain
dataclass, so that evaluation and sampling take them without the training stack (the DataModule
takes the same fields, its defaults read from here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .images import CROPS, FILTERS

FOLDER_ONLY = ("crop", "resize", "cache", "rebuild")  # refused with another source


@dataclass
class DataOptions:
    """Where the images come from.

    Args:
        root: data folder (default: $IMAGETX_DATA, else ./data)
        source: cifar10 (npz shards or torchvision's folder), imagenet (downsampled ImageNet's batch
            files, pickle or npz) or folder (PNG/JPEG files, converted once to npz shards); docs/data.md
        crop: folder: center (the largest centred square) or celeba (CelebA's centred 138x138 face box)
        resize: folder: the filter that resizes the crop: area (each pixel the mean of the area it covers) or
            bilinear, bicubic, lanczos (for enlarging)
        cache: folder: where the converted shards go (default: <root>/.imagetx-cache)
        rebuild: folder: convert again, replacing an earlier conversion
    """

    root: str | None = None
    source: Literal["cifar10", "imagenet", "folder"] = "cifar10"
    crop: Literal[CROPS] = "center"
    resize: Literal[tuple(FILTERS)] = "area"
    cache: str | None = None
    rebuild: bool = False
