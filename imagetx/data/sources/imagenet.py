"""Downsampled ImageNet (``--data.source imagenet``; Chrabaszcz, Loshchilov and Hutter
2017, image-net.org "Downsampled ImageNet 32x32 / 64x64"): 1,281,167 training images in
``train_data_batch_1`` … ``train_data_batch_10`` and 50,000 validation images in
``val_data``, 1,000 classes.

Each file is a pickled dict (or, in the npz release, ``<name>.npz``) with ``data`` uint8
(N, 3·S·S), each row the R plane, then the G plane, then the B plane of one image, each
plane row-major S×S; ``labels`` N integers 1..1000 (here 0..999); and ``mean``, unused.
S (32 or 64) follows from the row length. The files may lie in ``--data.root`` itself or
one folder below it (the archives unzip into e.g. ``Imagenet32_train/``, ``Imagenet32_val/``).

Pools: ``train`` (the training batches, in file order) and ``val`` (the official
validation set: the held-out set, which serves as the test split too; ImageNet's test
labels were never released). Everything is read into memory: about 3.9 GB for the 32×32
training set and 15.7 GB for the 64×64 one, plus one batch file while it is read.
A pickle can name any function for its loader to call: the batch files are read by an unpickler
that admits only what the official files hold (numpy arrays, lists, ints, strings) and refuses
any other file in one line, so that data never runs code.
"""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .common import Allocate, DataError, Pool, as_given, in_memory

NUM_CLASSES = 1000
HELD_OUT = "val"  # the official validation set
FILE_NAMES = {"train": re.compile(r"train_data_batch_(\d+)(\.npz)?"), "val": re.compile(r"val_data()(\.npz)?")}
FIX = "replace it with the file from the official release (image-net.org, Downsampled ImageNet)"
# Every global the official pickles name: numpy's reconstruction of arrays and of numpy scalars
# (numpy.core before numpy 2, numpy._core since; _frombuffer: pickle protocol 5) and, in pickles that
# Python 3 wrote at protocol 2, bytes as _codecs.encode(text, "latin1"). Each only builds a value.
ADMITTED_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    *((f"numpy.{core}.multiarray", name) for core in ("core", "_core") for name in ("_reconstruct", "scalar")),
    *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
    ("_codecs", "encode"),
}


class ForeignGlobal(pickle.UnpicklingError):
    """A pickle names a global that no downsampled ImageNet file holds."""


class BatchUnpickler(pickle.Unpickler):
    """An unpickler that looks up only ``ADMITTED_GLOBALS``: a pickle that would call anything else
    (``os.system``, ``builtins.eval``, ...) is refused before that global is even imported."""

    def find_class(self, module: str, name: str):
        if (module, name) not in ADMITTED_GLOBALS:
            raise ForeignGlobal(ascii(f"{module}.{name}"))  # a stranger's text: escapes shown
        return super().find_class(module, name)


def default_val_size(train_images: int) -> int:
    return 0  # 0: validate on the official validation set


def find(root: Path, part: str) -> list[Path]:
    """The files of a pool under root or one folder below it, in batch order."""
    pattern = FILE_NAMES[part]
    folders = [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]
    found: dict[int, Path] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            match = pattern.fullmatch(path.name)
            if not match or not path.is_file():
                continue
            number = int(match.group(1) or 0)
            if number in found:
                raise DataError(f"both {found[number]} and {path} hold {path.name.split('.')[0]}: keep one "
                                "(one variant, pickle or npz), or point --data.root at the folder of the one to use")
            found[number] = path
    return [found[number] for number in sorted(found)]


def read_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """'data' (N, 3·S·S) uint8 and 'labels' (N,) of one file, checked."""
    try:
        if path.suffix == ".npz":
            with np.load(path) as entry:
                keys = entry.files
                data, labels = (entry[key] if key in keys else None for key in ("data", "labels"))
        else:
            with path.open("rb") as handle:
                # latin1: also reads pickles written by Python 2 (numpy arrays inside)
                entry = BatchUnpickler(handle, encoding="latin1").load()
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            data, labels = (entry.get(key) if isinstance(entry, dict) else None for key in ("data", "labels"))
    except ForeignGlobal as error:
        raise DataError(f"{path} is a pickle that calls {error}, which no downsampled ImageNet file does: refused "
                        "unread, since loading it could run code. Use the official file, or its npz form "
                        f"({path.name}.npz: 'data' and 'labels' arrays, as image-net.org also ships them)") from error
    except OSError as error:
        raise DataError(f"{path} cannot be read ({error.strerror or error}); {FIX}") from error
    except Exception as error:  # unpickling and unzipping fail in many ways; all mean a damaged file
        raise DataError(f"{path} is truncated or corrupt ({type(error).__name__}); {FIX}") from error
    if data is None or labels is None:
        raise DataError(f"{path} holds {keys}; expected 'data' and 'labels' as in downsampled ImageNet: {FIX}")
    data, labels = np.asarray(data), np.asarray(labels)
    side = math.isqrt(data.shape[1] // 3) if data.ndim == 2 else 0
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * side * side or side == 0:
        raise DataError(f"{path}: 'data' is {data.dtype} {data.shape}; expected uint8 (N, 3·S·S), e.g. "
                        f"(N, 3072) for 32x32 or (N, 12288) for 64x64 images: {FIX}")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: 'labels' is {labels.dtype} {labels.shape}; expected {len(data)} integers: {FIX}")
    if labels.size and (labels.min() < 1 or labels.max() > NUM_CLASSES):
        raise DataError(f"{path}: labels span {labels.min()}..{labels.max()}; expected 1..{NUM_CLASSES} "
                        f"(downsampled ImageNet numbers its classes from 1): {FIX}")
    return data, labels


def pool_files(root: Path, part: str) -> list[Path]:
    """The files the ``part`` pool is read from: what its memory-mapped copy is checked against."""
    return find(root, part) if root.is_dir() else []


def read(root: Path, part: str, allocate: Allocate = in_memory) -> Pool:
    """The ``train`` or ``val`` pool: images uint8 (N, S, S, 3) and labels 0..999."""
    root = root.expanduser()
    files = find(root, part) if root.is_dir() else []
    if not files:
        names = "train_data_batch_1 … train_data_batch_10" if part == "train" else "val_data"
        raise DataError(f"no downsampled ImageNet {part} files under {as_given(root)}: looked for {names} (or .npz) "
                        "there and one folder below. Unzip the archives from image-net.org (Downsampled ImageNet "
                        "32x32 or 64x64) there, or pass --data.root DIR")
    # Filled in place, batch by batch: the memory of the images plus one batch, not twice the images.
    images, labels, filled, side = None, [], 0, 0
    for i, path in enumerate(tqdm(files, desc=f"reading ImageNet {part}", unit="file", disable=None)):
        data, file_labels = read_file(path)
        count, file_side = len(data), math.isqrt(data.shape[1] // 3)
        if images is None:
            side = file_side
            images = allocate((count * len(files), side, side, 3))  # the first batch is the largest
        elif file_side != side:
            raise DataError(f"{path} holds {file_side}x{file_side} images, {files[0]} {side}x{side}: keep one "
                            "variant under --data.root")
        if filled + count > len(images):  # more than expected: grow (copies once)
            grown = in_memory((filled + count * (len(files) - i), side, side, 3))
            grown[:filled] = images[:filled]
            images = grown
        images[filled : filled + count] = data.reshape(count, 3, side, side).transpose(0, 2, 3, 1)
        labels.append(file_labels.astype(np.int64) - 1)
        filled += count
        del data
    return Pool(images[:filled], np.concatenate(labels), NUM_CLASSES, f"--data.source imagenet --data.root {root}")
