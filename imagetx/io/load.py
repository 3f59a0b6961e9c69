"""``load_model``: the one entry that opens any imagetx model file from a local path: a weights
folder (``weights.model_from_folder``) or a checkpoint written by training
(``checkpoint.model_from_checkpoint``). Neither runs code from the file; nothing is downloaded
(a Hugging Face Hub repository id: ``hub.from_pretrained``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..model.transformer import ImageTransformer
from .checkpoint import model_from_checkpoint
from .weights import model_from_folder


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> ImageTransformer:
    """The model stored at the local ``path``, in eval mode: a weights folder or a checkpoint
    file written by imagetx.train."""
    if Path(path).is_dir():
        return model_from_folder(path, map_location)
    return model_from_checkpoint(path, map_location)
