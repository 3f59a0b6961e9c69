"""Files written whole or not at all (checkpoints, converted data shards, their manifests), a
folder put in place of another whole (``replace_folder``: decoded images), and the check that a
folder can be written at all before a command starts its work.

``atomic_write`` writes into a temporary file beside the target (``.NAME.XXXX.tmp``),
fsyncs it, renames it over the target and fsyncs the directory, so that a killed process,
a full disk or even a power cut leaves either the old file or the new one, never half of
one. A failed write removes its temporary file; one left by a killed process is for the
caller to clean up with ``remove_stale_temporaries`` (training, the folder conversion).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TEMPORARY_SUFFIX = ".tmp"


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """``write(handle)`` into a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def remove_stale_temporaries(directory: str | os.PathLike, written_before: float | None = None) -> list[Path]:
    """Delete the temporary files that killed writes left in ``directory`` (``.NAME.XXXX.tmp``);
    with ``written_before`` (a ``time.time()``), only those last written before then, so that
    the writes of a process running beside the caller are left alone. Returns what was removed."""
    removed = []
    for stale in Path(directory).glob(f".*{TEMPORARY_SUFFIX}"):
        try:
            if stale.is_file() and (written_before is None or stale.stat().st_mtime < written_before):
                stale.unlink()
                removed.append(stale)
        except FileNotFoundError:
            pass  # another process removed it first
    return removed


@contextmanager
def exclusive(lock: str | os.PathLike) -> Iterator[None]:
    """The block run by one process at a time among those that take the same ``lock``: a folder
    (locked itself, nothing written in it) or a file (made if missing), through an advisory
    ``flock`` (the processes of a machine, and of several where the filesystem shares locks, as
    NFS 4 does); where there is no ``fcntl`` (Windows), unguarded. For start-up file work that
    every process of a run would otherwise do at once: a later one would delete an earlier one's
    half-written file."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDONLY) if lock.is_dir() else os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


def check_writable(directory: str | os.PathLike, setting: str) -> Path:
    """Create ``directory`` if needed and prove it can be written, or raise one clear
    OSError naming ``setting``, the option that chooses another."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # A probe of its own (unnamed where the system allows): two commands checking one folder at
        # once (two sample grids drawn side by side) must not remove each other's.
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise OSError(f"cannot write to {directory} ({error.strerror or error}); "
                      f"choose another with {setting} DIR") from None
    return directory


def current_umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform can open directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_folder(staging: Path, out: Path, judge: Callable[[Path], object] | None = None) -> None:
    """The complete folder ``staging`` renamed to ``out``; whatever is already there is moved
    aside first and removed after (moved back if the rename fails). ``judge``, given, sees what
    was there once it is aside, where nothing more can be saved into it by its path: it raises to
    refuse the replacement, and it is moved back as it was. A link at ``out`` is replaced, not
    the folder it points to. Ctrl-C waits until it is done, so that it never leaves ``out``
    missing or the old folder's remains beside it."""
    with interrupts_deferred():
        if not out.exists() and not out.is_symlink():
            os.rename(staging, out)
            return
        aside = staging.with_name(staging.name + ".old")
        os.rename(out, aside)
        try:
            if judge is not None:
                judge(aside)
            os.rename(staging, out)
        except BaseException:
            os.rename(aside, out)
            raise
        if aside.is_symlink():  # rmtree refuses a link: it would be left beside ``out``
            aside.unlink()
        else:
            shutil.rmtree(aside, ignore_errors=True)  # the new folder is in place whatever is left of the old


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) held back until the block is done, then raised (in the main thread, the
    only one Python delivers signals to; elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:  # None: a handler not set from Python; Python's own is what raises KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    if received:
        raise KeyboardInterrupt
