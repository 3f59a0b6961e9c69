"""The memory-mapped copy of a pool (imagetx.data.sources.mapped) is not trusted blindly: a damaged
copy (flipped bytes, an edited, unreadable or truncated file) is said in one line and written again
from the source; a source file changed in place with its size and modification time put back gets
a new copy; a full disk is said in one line, before any image is written, leaving no partial copy;
killed writes' temporary folders are removed by the next start."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import cifar_arrays, write_cifar_npz, write_npz_shard
from imagetx.data.sources import Reader, mapped

MIB = 2**20


def read_train(root: Path):
    return Reader("cifar10", root, val_size=0, download=False).pool("train")


def copies(root: Path) -> list[Path]:
    return sorted((root / ".imagetx-cache" / "mapped").glob("cifar10-train-*"))


def flip_bytes(copy: Path) -> None:
    """1,000 bytes of the images inverted, spread over the file, in place (it keeps its size)."""
    data = np.fromfile(copy / mapped.IMAGES, np.uint8)
    data[np.linspace(0, data.size - 1, 1000).astype(int)] ^= 0xFF
    with open(copy / mapped.IMAGES, "r+b") as handle:
        handle.write(data.tobytes())


def fewer_images(copy: Path) -> None:
    meta = json.loads((copy / mapped.META).read_text())
    meta["shape"][0] -= 2  # the first 10 of 12 images: the file is larger than the shape says
    (copy / mapped.META).write_text(json.dumps(meta))


def other_labels(copy: Path) -> None:
    labels = np.load(copy / mapped.LABELS)
    np.save(copy / mapped.LABELS, (labels + 1) % 10)  # a file of the same size and shape


DAMAGE = {
    "flipped bytes": flip_bytes,
    "pool.json edited to fewer images": fewer_images,
    "pool.json not JSON": lambda copy: (copy / mapped.META).write_text('{"format": 2, "shape": [12'),
    "images truncated": lambda copy: os.truncate(copy / mapped.IMAGES, 5 * 32 * 32 * 3 + 7),
    "images missing": lambda copy: (copy / mapped.IMAGES).unlink(),
    "pool.json missing": lambda copy: (copy / mapped.META).unlink(),  # as a killed removal can leave it
    "labels changed": other_labels,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_copy_is_said_in_one_line_and_written_again(tmp_path, capsys, damage):
    root = tmp_path / "data"
    images, labels, *_ = write_cifar_npz(root, train_sizes=(6, 6))
    read_train(root)
    (copy,) = copies(root)
    DAMAGE[damage](copy)
    capsys.readouterr()
    pool = read_train(root)
    np.testing.assert_array_equal(np.asarray(pool.images), images)
    np.testing.assert_array_equal(pool.labels, labels)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "is damaged" in lines[0] and "writing it again" in lines[0], lines
    assert copies(root) == [copy]  # the same copy, written again: read as it is from now on
    read_train(root)
    assert capsys.readouterr().err == ""


def test_a_source_changed_in_place_with_its_size_and_time_put_back_gets_a_new_copy(tmp_path, monkeypatch):
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6, 6))
    read_train(root)
    (stale,) = copies(root)
    shard = root / "train-0.npz"
    before = shard.stat()
    # The change time is kept at the kernel's clock tick (1-10 ms): let one pass, so that the
    # rewrite below cannot share the first write's change time whatever the machine's speed.
    time.sleep(0.02)
    changed, changed_labels = cifar_arrays(6, seed=9)
    write_npz_shard(shard, changed, changed_labels)  # the same file (inode), rewritten
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    remains = root / ".imagetx-cache" / "mapped" / "cifar10-train-0123456789abcdef"
    remains.mkdir()  # an older copy's removal, killed after pool.json went
    (remains / mapped.IMAGES).write_bytes(bytes(MIB))
    reserve, left_when_reserving = os.posix_fallocate, []

    def recording(fd, offset, length):  # the new copy reserves its room once the stale ones are gone
        left_when_reserving.extend(path for path in (stale, remains) if path.exists())
        reserve(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", recording)
    np.testing.assert_array_equal(np.asarray(read_train(root).images[:6]), changed)
    (copy,) = copies(root)
    assert copy != stale and left_when_reserving == []


def test_a_full_disk_is_said_in_one_line_before_any_image_is_written_and_leaves_no_copy(tmp_path, capsys,
                                                                                        monkeypatch):
    """posix_fallocate failing as on a full disk (a memory-mapped write there was a SIGBUS, exit 135,
    and the partial copy left filling the disk): the pool is read into memory, said once, with how
    much the copy needs."""
    root = tmp_path / "data"
    images, *_ = write_cifar_npz(root, train_sizes=(6, 6))

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    pool = read_train(root)
    np.testing.assert_array_equal(np.asarray(pool.images), images)
    assert not isinstance(pool.images, np.memmap)
    lines = capsys.readouterr().err.splitlines()
    needed = f"{images.nbytes / MIB:.1f} MiB"
    assert len(lines) == 1 and "read into memory" in lines[0] and f"needs {needed}" in lines[0], lines
    assert "MiB are free" in lines[0]
    assert [path.name for path in (root / ".imagetx-cache" / "mapped").iterdir()] == [".cifar10-train.lock"]


def test_the_space_of_a_copy_is_reserved_before_it_is_written(tmp_path):
    """The images file takes its blocks when it is made, not as pages are written through the map."""
    path = tmp_path / "images.u8"
    mapped.reserve(path, 3 * MIB)
    status = path.stat()
    assert status.st_size == 3 * MIB and status.st_blocks * 512 >= 3 * MIB  # st_blocks: 512-byte units


def test_a_killed_writes_temporary_folder_is_removed_at_the_next_start(tmp_path):
    root = tmp_path / "data"
    images, *_ = write_cifar_npz(root, train_sizes=(6, 6))
    cache = root / ".imagetx-cache" / "mapped"
    killed = cache / ".cifar10-train-0123456789abcdef.k1ll3d.tmp"  # as mkdtemp names a write's folder
    killed.mkdir(parents=True)
    (killed / mapped.IMAGES).write_bytes(bytes(MIB))
    other = cache / ".cifar10-test-0123456789abcdef.k1ll3d.tmp"  # another pool's: its own start's to remove
    other.mkdir()
    np.testing.assert_array_equal(np.asarray(read_train(root).images), images)
    assert not killed.exists() and other.exists()
