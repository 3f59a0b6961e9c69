"""Each pool of a source, read once into one memory-mapped file that every process then shares.

A data-parallel run starts one process per device, and each reads the training set: read into
each process's own memory, 8 processes on 1.28 M images of 64×64 held 8 copies (about 126 GB a
node). Instead the first process to need a pool writes it, as read from the source's files,
into ``<cache>/<source>-<pool>-<fingerprint>/`` (``images.u8``: the uint8 images, raw, in order;
``labels.npy``; ``pool.json``: their shape and what the pool is), and every process maps that
file (``numpy.memmap``): the operating system's page cache holds the images once a machine, and a
process's memory grows only by the pages it touches. The other processes wait meanwhile (a file
lock, ``io.atomic.exclusive``), then map the same file.

The fingerprint is the pool's source files (paths, sizes, modification times) and this format's
version: the cache is used while the source is unchanged, written anew (and the old one removed)
when it changes. It is written whole or not at all (a folder renamed into place), so a process
killed while writing leaves nothing a later one would read. Where no cache folder can be written,
the pool is read into memory as before, said in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...io.atomic import exclusive, fsync_directory
from .common import Allocate, Pool, in_memory

FORMAT = 1  # the cache's layout; a new layout takes a new number, so that no old cache is misread
IMAGES, LABELS, META = "images.u8", "labels.npy", "pool.json"


def fingerprint(files: list[Path]) -> str:
    """SHA-256 of the files' resolved paths, sizes and modification times, and ``FORMAT``."""
    listing = [FORMAT]
    for path in files:
        status = path.stat()
        listing.append([str(path.resolve()), status.st_size, status.st_mtime_ns])
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def mapped_pool(cache: Path, name: str, files: list[Path], read: Callable[[Allocate], Pool]) -> Pool:
    """The pool ``read(allocate)`` gives, from its memory-mapped copy under ``cache`` (written first
    where there is none for these ``files``: ``read`` fills the mapped file itself), or read into
    memory where ``cache`` cannot be written."""
    folder = cache / f"{name}-{fingerprint(files)[:16]}"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with exclusive(cache / f".{name}.lock"):
            if not (folder / META).is_file():
                write(folder, read)
                for older in cache.glob(f"{name}-*"):  # the copies of an earlier version of the source
                    if older != folder and (older / META).is_file():
                        shutil.rmtree(older, ignore_errors=True)
            return open_pool(folder)
    except OSError as error:
        # (no Lightning here: evaluate and sample read pools too, and import no training stack)
        print(f"data: {name} read into memory, not shared: its cache {cache} cannot be written "
              f"({error.strerror or error})", file=sys.stderr)
        return read(in_memory)


def write(folder: Path, read: Callable[[Allocate], Pool]) -> None:
    """The pool ``read`` gives into ``folder``, whole or not at all: written beside it, then renamed
    into place. ``read`` fills the images file through the allocator it is given; a pool it gives
    in another array (a download, read whole) is written out after."""
    temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        allocated: list[np.memmap] = []

        def allocate(shape: tuple[int, ...]) -> np.ndarray:
            allocated.append(np.memmap(temporary / IMAGES, dtype=np.uint8, mode="w+", shape=shape))
            return allocated[-1]

        pool = read(allocate)
        images = pool.images
        if allocated and np.shares_memory(images, allocated[-1]):  # filled in place: keep its first images
            allocated[-1].flush()
            del allocated[:]
            os.truncate(temporary / IMAGES, images.nbytes)
        else:
            images = np.ascontiguousarray(images)
            with open(temporary / IMAGES, "wb") as handle:
                handle.write(memoryview(images.reshape(-1)))
        with open(temporary / IMAGES, "rb+") as handle:
            os.fsync(handle.fileno())
        if pool.labels is not None:
            np.save(temporary / LABELS, pool.labels.astype(np.int64, copy=False))
        meta = {"format": FORMAT, "shape": list(images.shape), "labels": pool.labels is not None,
                "num_classes": pool.num_classes, "where": pool.where}
        (temporary / META).write_text(json.dumps(meta))
        del pool, images
        os.replace(temporary, folder)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(folder.parent)


def open_pool(folder: Path) -> Pool:
    """The pool in ``folder``, its images mapped (copy-on-write: writable for torch, never written back)."""
    meta = json.loads((folder / META).read_text())
    shape = tuple(meta["shape"])
    images = np.memmap(folder / IMAGES, dtype=np.uint8, mode="c", shape=shape) if shape[0] else \
        np.zeros(shape, np.uint8)
    labels = np.load(folder / LABELS) if meta["labels"] else None
    return Pool(images, labels, meta["num_classes"], meta["where"])
