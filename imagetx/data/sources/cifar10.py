"""CIFAR-10 (``--data.source cifar10``, the default): 50,000 training and 10,000 test
images, 32×32, 10 classes. Two on-disk formats are read:

* npz shards ``{train,test}-*.npz`` holding ``images`` uint8 (N, 32, 32, 3) and ``labels``
  uint8 (N,), the format of the CIFAR-10 shards in docs/data.md;
* torchvision's ``cifar-10-batches-py`` folder, downloaded through torchvision when
  it is missing and a network is there.

Pools: ``train`` (the training images) and ``test`` (the official test images).
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .common import Allocate, DataError, Pool, as_given, in_memory

NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
TORCHVISION_FOLDER = "cifar-10-batches-py"
HELD_OUT = "test"  # the pool of the official held-out images: the test split


def default_val_size(train_images: int) -> int:
    return 5000  # the last 5,000 training images (half of the customary last shard)


def _check_arrays(images: np.ndarray, labels: np.ndarray, source: str) -> None:
    fix = "; replace it with a shard in the CIFAR-10 format, or remove it"
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{source}: 'images' is {images.dtype} {images.shape}; expected uint8 (N, 32, 32, 3){fix}")
    if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{source}: 'labels' is {labels.dtype} {labels.shape}; expected integers "
                        f"({images.shape[0]},){fix}")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{source}: labels span {labels.min()}..{labels.max()}; expected 0..{NUM_CLASSES - 1}{fix}")


def read_npz_shards(root: Path, prefix: str, allocate: Allocate = in_memory) -> tuple[np.ndarray, np.ndarray] | None:
    """All ``{prefix}-*.npz`` shards under root, in name order; None when there are none."""
    shards = shard_files(root, prefix)
    if not shards:
        return None
    # The labels first (small), then each shard's images into their place: the memory of the images
    # and one shard, not twice the images (a concatenation).
    labels = [read_shard(shard, "labels") for shard in shards]
    images = allocate((sum(map(len, labels)), *IMAGE_SHAPE))
    filled = 0
    for shard, shard_labels in zip(shards, labels):
        shard_images = read_shard(shard, "images")
        _check_arrays(shard_images, shard_labels, str(shard))
        images[filled : filled + len(shard_images)] = shard_images
        filled += len(shard_images)
    return images, np.concatenate([shard_labels.astype(np.int64) for shard_labels in labels])


def shard_files(root: Path, prefix: str) -> list[Path]:
    """The ``{prefix}-*.npz`` shards under root, in name order."""
    return sorted(root.glob(f"{prefix}-*.npz"), key=lambda p: (len(p.name), p.name)) if root.is_dir() else []


def pool_files(root: Path, part: str) -> list[Path]:
    """The files the ``part`` pool is read from (its shards, else torchvision's batches): what its
    memory-mapped copy is checked against (mapped.py)."""
    shards = shard_files(root, part)
    folder = root / TORCHVISION_FOLDER
    return shards or (sorted(path for path in folder.iterdir() if path.is_file()) if folder.is_dir() else [])


def read_shard(shard: Path, name: str) -> np.ndarray:
    """The array ``name`` (images, labels) of one shard, or a DataError saying what is wrong with it."""
    try:
        with np.load(shard) as data:
            if "images" not in data or "labels" not in data:
                raise DataError(f"{shard}: holds {sorted(data.files)}; expected arrays 'images' and 'labels': "
                                "replace it with a shard in the CIFAR-10 format, or remove it")
            return data[name]
    except DataError:  # a ValueError too (a UserError): its own words, not "corrupt"
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise DataError(f"{shard} is truncated or corrupt ({type(error).__name__}: {error}); "
                        "replace it with a good copy") from error


def read_torchvision(root: Path, train: bool, download: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The torchvision layout under root, downloading it only when absent; None when unavailable."""
    present = (root / TORCHVISION_FOLDER).is_dir()
    if not present and not (download and _download(root)):
        return None
    from torchvision.datasets import CIFAR10  # imported late: only this source needs it

    try:
        dataset = CIFAR10(str(root), train=train, download=False)
    except RuntimeError as error:  # torchvision's "Dataset not found or corrupted"
        raise DataError(f"{root / TORCHVISION_FOLDER} is incomplete or corrupt ({error}); "
                        "delete it to download again, or replace it") from error
    images, labels = np.asarray(dataset.data), np.asarray(dataset.targets, dtype=np.int64)
    _check_arrays(images, labels, str(root / TORCHVISION_FOLDER))
    return images, labels


def _download(root: Path) -> bool:
    """Download torchvision's folder to ``root``, True when it is there after. torchvision creates its
    root before it tries the network, so the default ``./data`` (a given root that does not exist is
    refused before: ``Reader.refuse_a_missing_root``) on a machine without one was left as an empty folder: it downloads into a temporary folder in the
    nearest existing folder above ``root`` instead (the same file system, so the move is a rename),
    and only a complete download creates ``root``. Nothing is left when it fails."""
    from torchvision.datasets import CIFAR10

    existing = next(folder for folder in (root.absolute(), *root.absolute().parents) if folder.is_dir())
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{TORCHVISION_FOLDER}-", dir=existing))
    except OSError:  # nowhere to write: nothing can be downloaded
        return False
    try:
        # both parts: the folder holds both, and the second call only checks what the first fetched
        CIFAR10(str(staging), train=True, download=True)
        CIFAR10(str(staging), train=False, download=False)
        root.mkdir(parents=True, exist_ok=True)
        try:
            (staging / TORCHVISION_FOLDER).rename(root / TORCHVISION_FOLDER)
        except OSError:
            # another process (a rank of the same run) moved its copy there first: read that one
            if not (root / TORCHVISION_FOLDER).is_dir():
                raise
        return True
    except (RuntimeError, OSError):  # no network (URLError is an OSError), or a corrupt download
        return False
    finally:
        # the archive, and the folder when another's copy won: torchvision never reads the archive again
        shutil.rmtree(staging, ignore_errors=True)


def read(root: Path, part: str, download: bool = True, allocate: Allocate = in_memory) -> Pool:
    """The ``train`` or ``test`` pool: npz shards if there are any, else torchvision's folder."""
    arrays = read_npz_shards(root, part, allocate) if root.is_dir() else None
    if arrays is None:
        arrays = read_torchvision(root, train=part == "train", download=download)
    if arrays is None and part == HELD_OUT and root.is_dir() and any(root.glob("train-*.npz")):
        # the shared shards (docs/data.md) are the training images only: no test split to fetch there
        raise DataError(
            f"{as_given(root)} holds only the training shards (train-*.npz), no test-*.npz nor {TORCHVISION_FOLDER}/"
            f"{', and could not download' if download else ''}: score the images held out of training with "
            "--split val, or put CIFAR-10's test shards (test-*.npz) there")
    if arrays is None:
        raise DataError(
            f"no CIFAR-10 {part} images under {as_given(root)}: looked for {part}-*.npz shards and "
            f"{TORCHVISION_FOLDER}/, and could not download. Put the shards there (e.g. copy "
            f"shared/cifar10/*.npz), or pass --data.root DIR / set IMAGETX_DATA=DIR, or run once with a network")
    images, labels = arrays
    return Pool(images, labels, NUM_CLASSES, f"--data.source cifar10 --data.root {root}")
