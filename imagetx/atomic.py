"""Files written whole or not at all: checkpoints, converted data shards, their manifests.

``atomic_write`` writes into a temporary file beside the target (``.NAME.XXXX.tmp``),
fsyncs it, renames it over the target and fsyncs the directory, so that a killed process,
a full disk or even a power cut leaves either the old file or the new one, never half of
one. A failed write removes its temporary file; one left by a killed process is for the
caller to clean up (``checkpoint.remove_stale_temporaries``, the folder conversion).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
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
