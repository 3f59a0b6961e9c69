"""What the commands check of a model's path before torch is imported (a bad argument refused in
a moment, not after seconds of imports: ``python -X importtime -m imagetx.export``): the names of a
weights folder's files, and the refusal of a model path that does not exist. Nothing here imports
torch."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CheckpointError

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"  # the model card save_pretrained adds (io/hub.py)


def missing_model(path: str | os.PathLike) -> CheckpointError:
    """The refusal of a model path (a checkpoint or a weights folder) that does not exist."""
    return CheckpointError(f"checkpoint {path} does not exist: pass the path of a .ckpt file written by imagetx, "
                           "or of a weights folder written by imagetx.export")


def check_model_path(path: str | os.PathLike) -> None:
    """``path`` exists (a checkpoint file or a weights folder), or ``missing_model``'s refusal; what
    is inside is for loading to check."""
    if not Path(path).exists():
        raise missing_model(path)
