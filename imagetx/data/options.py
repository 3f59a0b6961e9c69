"""The ``--data.*`` options that say where the images are and how a folder is converted: one plain
dataclass, so that evaluation and sampling take them without the training stack (the DataModule
takes the same fields, its defaults read from here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The folder source's crops and resize filters (data/images.py implements them), named here without
# its imports (torch, PIL): every command parses these options before it loads a model.
CROPS = ("center", "celeba")
FILTER_NAMES = ("area", "bilinear", "bicubic", "lanczos")
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
    resize: Literal[FILTER_NAMES] = "area"
    cache: str | None = None
    rebuild: bool = False
