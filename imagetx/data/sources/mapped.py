"""Each pool of a source, read once into one memory-mapped file that every process then shares.

A data-parallel run starts one process per device, and each reads the training set: read into
each process's own memory, 8 processes on 1.28 M images of 64×64 held 8 copies (about 126 GB a
node). Instead the first process to need a pool writes it, as read from the source's files,
into ``<cache>/<source>-<pool>-<fingerprint>/`` (``images.u8``: the uint8 images, raw, in order;
``labels.npy``; ``pool.json``: their shape and what the pool is), and every process maps that
file (``numpy.memmap``): the operating system's page cache holds the images once a machine, and a
process's memory grows only by the pages it touches. The other processes wait meanwhile (a file
lock, ``io.atomic.exclusive``), then map the same file.

The fingerprint is the pool's source files (paths, sizes, modification and change times, inodes)
and this format's version: the cache is used while the source is unchanged (a file rewritten in
place with its size and modification time put back still has a new change time), written anew
(and the old one removed) when it changes. It is written whole or not at all (a folder renamed
into place), so a process killed while writing leaves nothing a later one would read, only its
temporary folder, removed by the next start (under the same lock, so never a live writer's).

The copy is checked each time a process opens it: the sizes always, and a CRC-32 of ``pool.json``'s
description, the labels and the images, written with the copy (CIFAR-10's 147 MiB: about 0.1 s,
docs/data.md). A copy that fails (flipped bytes, a truncated or edited file) is said to be damaged
in one line and written again from the source. Its disk space is reserved before the images are
written (``os.posix_fallocate``): a full disk is said in one line (how much the copy needs, how
much is free) and the pool read into memory, where writing into a mapped file with no room would
kill the process (SIGBUS). Where no cache folder can be written, the pool is read into memory as
before, said in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...io.atomic import TEMPORARY_SUFFIX, exclusive, fsync_directory
from .common import Allocate, DataError, Pool, in_memory

FORMAT = 2  # the cache's layout; a new layout takes a new number, so that no old cache is misread
IMAGES, LABELS, META = "images.u8", "labels.npy", "pool.json"
CHECKSUM = "crc32"  # pool.json's key for the copy's CRC-32 (zlib's: several GB/s, in the stdlib)
# Bytes read at a time while checking: as fast as larger pieces (CIFAR-10's 147 MiB from the page
# cache in about 0.06 s), and a buffer that leaves no trace in a reader's memory figures.
MEBIBYTE = 2**20
CHUNK = MEBIBYTE


class Damaged(Exception):
    """A copy that is not as it was written; the message says what is wrong with it."""


def fingerprint(files: list[Path]) -> str:
    """SHA-256 of the files' resolved paths, sizes, modification and change times, devices and
    inodes, and ``FORMAT``: a file changed in place changes its change time (which no user call
    sets back), a file replaced its inode."""
    listing = [FORMAT]
    for path in files:
        status = path.stat()
        listing.append([str(path.resolve()), status.st_size, status.st_mtime_ns, status.st_ctime_ns,
                        status.st_dev, status.st_ino])
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def mapped_pool(cache: Path, name: str, files: list[Path], read: Callable[[Allocate], Pool]) -> Pool:
    """The pool ``read(allocate)`` gives, from its memory-mapped copy under ``cache`` (written first
    where there is none for these ``files``, or the one there is damaged: ``read`` fills the mapped
    file itself), or read into memory where ``cache`` cannot be written or has no room."""
    folder = cache / f"{name}-{fingerprint(files)[:16]}"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with exclusive(cache / f".{name}.lock"):
            # Copies are written only under this lock: a temporary folder now is a killed write's, and
            # another copy of this pool one of an earlier version of the source, removed before the
            # new copy needs its room (a disk with room for one copy would otherwise never get one).
            for stale in [*cache.glob(f".{name}-*{TEMPORARY_SUFFIX}"), *cache.glob(f"{name}-*")]:
                if stale != folder:
                    shutil.rmtree(stale, ignore_errors=True)
            if folder.exists():
                try:
                    return open_pool(folder)
                except Damaged as damage:  # a file of it changed, or lost (as a killed removal leaves it)
                    print(f"data: the mapped copy {folder} is damaged ({damage}): writing it again from the source",
                          file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
            write(folder, read)
            try:
                return open_pool(folder)
            except Damaged as damage:  # not as written a moment ago: the disk, or another program
                raise DataError(f"the mapped copy {folder} is damaged right after it was written ({damage}): "
                                f"check the disk, or delete {cache}") from None
    except OSError as error:
        # (no Lightning here: evaluate and sample read pools too, and import no training stack)
        print(f"data: {name} read into memory, not shared: its cache {cache} cannot be written "
              f"({error.strerror or error})", file=sys.stderr)
        return read(in_memory)


def write(folder: Path, read: Callable[[Allocate], Pool]) -> None:
    """The pool ``read`` gives into ``folder``, whole or not at all: written beside it, then renamed
    into place. ``read`` fills the images file through the allocator it is given; a pool it gives
    in another array (a download, read whole) is written out after."""
    temporary = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=TEMPORARY_SUFFIX, dir=folder.parent))
    try:
        allocated: list[np.memmap] = []

        def allocate(shape: tuple[int, ...]) -> np.ndarray:
            reserve(temporary / IMAGES, math.prod(shape))
            allocated.append(np.memmap(temporary / IMAGES, dtype=np.uint8, mode="r+", shape=shape))
            return allocated[-1]

        pool = read(allocate)
        images = pool.images
        if allocated and np.shares_memory(images, allocated[-1]):  # filled in place: keep its first images
            allocated[-1].flush()
            del allocated[:]
            os.truncate(temporary / IMAGES, images.nbytes)
        else:
            images = np.ascontiguousarray(images)
            reserve(temporary / IMAGES, images.nbytes)
            with open(temporary / IMAGES, "rb+") as handle:
                handle.write(memoryview(images.reshape(-1)))
        with open(temporary / IMAGES, "rb+") as handle:
            os.fsync(handle.fileno())
        if pool.labels is not None:
            np.save(temporary / LABELS, pool.labels.astype(np.int64, copy=False))
        meta = {"format": FORMAT, "shape": list(images.shape), "labels": pool.labels is not None,
                "num_classes": pool.num_classes, "where": pool.where}
        meta[CHECKSUM] = checksum(temporary, meta)
        (temporary / META).write_text(json.dumps(meta))
        del pool, images
        os.replace(temporary, folder)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(folder.parent)


def reserve(path: Path, size: int) -> None:
    """``path`` made ``size`` bytes long with its disk space taken now: writing through a memory
    map into a file the disk has no room for kills the process (SIGBUS), where this raises an
    OSError saying how much is needed and free. Where the file system cannot reserve space, the
    file is only made that long, as before."""
    with open(path, "wb") as handle:
        try:
            if size:  # posix_fallocate refuses a length of 0
                os.posix_fallocate(handle.fileno(), 0, size)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                handle.truncate(size)  # EOPNOTSUPP, EINVAL: a file system that keeps no reservations
                return
            free = shutil.disk_usage(path.parent).free
            raise OSError(error.errno, f"no space left for its copy: it needs {size / MEBIBYTE:.1f} MiB, "
                                       f"{free / MEBIBYTE:.1f} MiB are free") from None
        except AttributeError:  # no posix_fallocate (macOS, Windows)
            handle.truncate(size)


def checksum(folder: Path, meta: dict) -> int:
    """CRC-32 of the copy in ``folder``: its description ``meta`` (less the checksum itself), the
    labels file and the images file, read a chunk at a time."""
    described = {key: value for key, value in meta.items() if key != CHECKSUM}
    crc = zlib.crc32(json.dumps(described, sort_keys=True).encode())
    buffer = bytearray(CHUNK)
    for name in (LABELS, IMAGES):
        if name == LABELS and not meta["labels"]:
            continue
        with open(folder / name, "rb") as handle:
            while count := handle.readinto(buffer):
                crc = zlib.crc32(memoryview(buffer)[:count], crc)
    return crc


def open_pool(folder: Path) -> Pool:
    """The pool in ``folder``, its images mapped (copy-on-write: writable for torch, never written
    back), once its sizes and checksum are as written; ``Damaged`` otherwise."""
    try:
        meta = json.loads((folder / META).read_text())
        shape = tuple(meta["shape"])
        if not (meta["format"] == FORMAT and len(shape) == 4 and all(type(side) is int and side >= 0 for side in shape)
                and shape[1] == shape[2] and shape[3] == 3):
            raise Damaged(f"{META} describes format {meta['format']!r}, shape {shape}: not a copy this version wrote")
        size = (folder / IMAGES).stat().st_size
        if size != math.prod(shape):
            raise Damaged(f"{IMAGES} holds {size} bytes where {shape} images take {math.prod(shape)}")
        if checksum(folder, meta) != meta[CHECKSUM]:
            raise Damaged("its CRC-32 is not the one written with it: bytes changed since")
        images = np.memmap(folder / IMAGES, dtype=np.uint8, mode="c", shape=shape) if shape[0] else \
            np.zeros(shape, np.uint8)
        labels = np.load(folder / LABELS, allow_pickle=False) if meta["labels"] else None
        if labels is not None and labels.shape != shape[:1]:
            raise Damaged(f"{LABELS} holds {labels.shape} labels for {shape[0]} images")
        return Pool(images, labels, meta["num_classes"], meta["where"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise Damaged(f"{type(error).__name__}: {' '.join(str(error).split())}") from None
