"""CIFAR-10 data (SPEC §6 tasks; brief: data sources): reading, splitting, the DataModule.

Two on-disk formats are read:

* npz shards ``{split}-*.npz`` holding ``images`` uint8 (N, 32, 32, 3) and ``labels``
  uint8 (N,), as in ``shared/cifar10/README.md``;
* torchvision's ``cifar-10-batches-py`` folder, downloaded through torchvision when
  it is missing and a network is there.

Splits: ``train`` and ``val`` both come from the training images (``val`` is the
last ``val_size`` of them), ``test`` from the official test images.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

SPLITS = ("train", "val", "test")
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
TORCHVISION_FOLDER = "cifar-10-batches-py"


class DataError(RuntimeError):
    """Data that cannot be found or read; the message says where and what to do."""


def default_root() -> Path:
    return Path(os.environ.get("IMAGETX_DATA", "./data"))


def _check_arrays(images: np.ndarray, labels: np.ndarray, source: str) -> None:
    fix = "; replace it with a shard in the CIFAR-10 format, or remove it"
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{source}: 'images' is {images.dtype} {images.shape}; expected uint8 (N, 32, 32, 3){fix}")
    if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{source}: 'labels' is {labels.dtype} {labels.shape}; expected integers "
                        f"({images.shape[0]},){fix}")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{source}: labels span {labels.min()}..{labels.max()}; expected 0..{NUM_CLASSES - 1}{fix}")


def read_npz_shards(root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray] | None:
    """All ``{prefix}-*.npz`` shards under root, in name order; None when there are none."""
    shards = sorted(root.glob(f"{prefix}-*.npz"), key=lambda p: (len(p.name), p.name))
    if not shards:
        return None
    images, labels = [], []
    for shard in shards:
        try:
            with np.load(shard) as data:
                if "images" not in data or "labels" not in data:
                    raise DataError(f"{shard}: holds {sorted(data.files)}; expected arrays 'images' and 'labels': "
                                    "replace it with a shard in the CIFAR-10 format, or remove it")
                shard_images, shard_labels = data["images"], data["labels"]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
            raise DataError(f"{shard} is truncated or corrupt ({type(error).__name__}: {error}); "
                            "replace it with a good copy") from error
        _check_arrays(shard_images, shard_labels, str(shard))
        images.append(shard_images)
        labels.append(shard_labels.astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)


def read_torchvision(root: Path, train: bool, download: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The torchvision layout under root, downloading it only when absent; None when unavailable."""
    present = (root / TORCHVISION_FOLDER).is_dir()
    if not present and not download:
        return None
    from torchvision.datasets import CIFAR10  # imported late: only this source needs it

    try:
        dataset = CIFAR10(str(root), train=train, download=not present)
    except RuntimeError as error:  # torchvision's "Dataset not found or corrupted"
        if not present:
            return None
        raise DataError(f"{root / TORCHVISION_FOLDER} is incomplete or corrupt ({error}); "
                        "delete it to download again, or replace it") from error
    except OSError:  # no network: URLError is an OSError
        return None
    images, labels = np.asarray(dataset.data), np.asarray(dataset.targets, dtype=np.int64)
    _check_arrays(images, labels, str(root / TORCHVISION_FOLDER))
    return images, labels


def load_cifar10(root: str | os.PathLike, split: str, val_size: int = 5000,
                 download: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, 32, 32, 3) and long labels (N,) of one split."""
    if split not in SPLITS:
        raise DataError(f"split {split!r} is unknown; choose one of {', '.join(SPLITS)}")
    root = Path(root).expanduser()
    source = "test" if split == "test" else "train"
    arrays = read_npz_shards(root, source) if root.is_dir() else None
    if arrays is None:
        arrays = read_torchvision(root, train=source == "train", download=download)
    if arrays is None:
        raise DataError(
            f"no CIFAR-10 {source} images under {root.resolve()}: looked for {source}-*.npz shards and "
            f"{TORCHVISION_FOLDER}/, and could not download. Put the shards there (e.g. copy "
            f"shared/cifar10/*.npz), or pass --data.root DIR / set IMAGETX_DATA=DIR, or run once with a network")
    images, labels = arrays
    if split != "test":
        if not 0 < val_size < len(images):
            raise DataError(f"val_size={val_size} must be between 1 and {len(images) - 1} (the training images)")
        cut = len(images) - val_size
        images, labels = (images[:cut], labels[:cut]) if split == "train" else (images[cut:], labels[cut:])
    return torch.from_numpy(np.ascontiguousarray(images)), torch.from_numpy(labels)


class ImageDataset(Dataset):
    """In-memory images and labels; items are dicts so every consumer names what it takes."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, random_flip: bool = False) -> None:
        self.images, self.labels, self.random_flip = images, labels, random_flip

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image = self.images[index]
        if self.random_flip and torch.rand(()) < 0.5:
            image = image.flip(1)
        return {"images": image, "labels": self.labels[index]}


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 splits for training (``train``/``val``) and testing (``test``)."""

    def __init__(
        self,
        root: str | None = None,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        val_size: int = 5000,  # the last 5,000 training images (half of the customary last shard)
        num_workers: int = 0,  # data sits in memory; workers only add start-up cost on small machines
        random_flip: bool = False,  # the paper trains without augmentation
        download: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root) if root else default_root()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.val_size, self.num_workers, self.random_flip, self.download = val_size, num_workers, random_flip, download
        self.datasets: dict[str, ImageDataset] = {}

    def dataset(self, split: str) -> ImageDataset:
        if split not in self.datasets:
            images, labels = load_cifar10(self.root, split, self.val_size, self.download)
            self.datasets[split] = ImageDataset(images, labels, self.random_flip and split == "train")
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        if stage in ("fit", None):
            self.dataset("train")
            self.dataset("val")
        if stage == "test":
            self.dataset("test")

    def loader(self, split: str, shuffle: bool = False) -> DataLoader:
        # drop_last=False everywhere: bits/dim is averaged over every image of the split.
        return DataLoader(self.dataset(split), batch_size=self.batch_size if shuffle else self.eval_batch_size,
                          shuffle=shuffle, num_workers=self.num_workers, drop_last=False,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")


def downsample_area(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, size, size, 3): the box mean of each (H/size)² patch, rounded
    half up (T2T "resize by area"; SPEC §6). Exact integer arithmetic, no float rounding doubt."""
    batch, height, width, channels = images.shape
    if height % size or width % size:
        raise ValueError(f"cannot box-downsample {height}x{width} to {size}x{size}: size must divide both")
    fh, fw = height // size, width // size
    patches = images.long().view(batch, size, fh, size, fw, channels).sum(dim=(2, 4))
    area = fh * fw
    return ((2 * patches + area) // (2 * area)).to(torch.uint8)  # floor(mean + ½)
