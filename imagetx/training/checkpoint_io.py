"""Lightning's checkpoint writer, made atomic (``io.checkpoint.atomic_torch_save``).

Kept: Lightning's TorchCheckpointIO writes through an fsspec transaction, into the system's temporary
folder and then moved over the target (a copy where that is another filesystem), with no fsync; here the
file is written beside it, fsynced and renamed, and a full disk says that the previous file is intact
(docs/training.md, "When things go wrong"; tests/training/test_reliability_checkpoints.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..io.checkpoint import atomic_torch_save
from ..io.errors import CheckpointError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, through ``atomic_torch_save``: a kill or a full disk
    mid-write never leaves a corrupt ``last.ckpt`` behind. Remote paths (``s3://``, ...)
    are left to Lightning."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_torch_save(checkpoint, path)
        except OSError as error:
            raise CheckpointError(
                f"cannot write checkpoint {path} ({error.strerror or error}); the previous {Path(path).name}, if any, "
                "is intact: free disk space or choose another --trainer.default_root_dir, then continue with --resume"
            ) from error
