"""Weights to share: a folder holding ``model.safetensors`` and ``config.json``, and
``load_model``, which reads such a folder or a torch checkpoint file (checkpoint.py).

The folder follows the huggingface convention (``save_pretrained`` / ``from_pretrained``):
``model.safetensors`` holds the network's tensors and nothing else, so opening it cannot run
code; ``config.json`` holds the ``ModelConfig`` fields and ``format_version``. A folder is read
from a local path only: imagetx downloads nothing. The tensors are checked against the model that
config.json describes, so a missing, extra or wrongly shaped tensor is named rather than left to
a failure deep inside the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from .atomic import atomic_write
from .checkpoint import CheckpointError, check_tensors, model_from_checkpoint
from ..model.config import ModelConfig
from ..model.transformer import ImageTransformer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FORMAT_KEY = "format_version"
FORMAT_VERSION = 1


def save_pretrained(model: ImageTransformer, directory: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write ``directory/model.safetensors`` and ``directory/config.json`` (each atomically);
    ``dtype`` (e.g. torch.bfloat16) stores the floating-point tensors at that precision instead
    of the model's own. Returns the folder."""
    directory = Path(directory)
    tensors = {name: value.detach().to("cpu", dtype if dtype is not None and value.is_floating_point() else None)
               .contiguous() for name, value in model.state_dict().items()}
    # "format": "pt" is the metadata the huggingface tools read to know the tensors are torch's
    atomic_write(directory / WEIGHTS_FILE, lambda handle: handle.write(safetensors_bytes(tensors, {"format": "pt"})))
    config = {FORMAT_KEY: FORMAT_VERSION, **model.config.to_dict()}
    atomic_write(directory / CONFIG_FILE, lambda handle: handle.write((json.dumps(config, indent=2) + "\n").encode()))
    return directory


def from_pretrained(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> ImageTransformer:
    """The model in a folder written by ``save_pretrained`` (or ``imagetx.export``), in float32 and
    eval mode, whatever precision the folder stores; a CheckpointError naming what is wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no weights folder at {directory}: imagetx reads a local folder holding {WEIGHTS_FILE} "
                              f"and {CONFIG_FILE} and downloads nothing (fetch a shared model first, e.g. with "
                              "`huggingface-cli download REPO --local-dir DIR`)")
    model = ImageTransformer(read_config(directory / CONFIG_FILE))
    stored = read_tensors(directory / WEIGHTS_FILE)
    check_tensors(directory / WEIGHTS_FILE, stored, model.state_dict(),
                  "export the folder again from the checkpoint these weights came from")
    model.load_state_dict(stored)
    return model.to(map_location).eval()


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> ImageTransformer:
    """The model stored at ``path``, in eval mode: a weights folder (``from_pretrained``) or a
    checkpoint file written by imagetx.train. Neither runs code from the file."""
    if Path(path).is_dir():
        return from_pretrained(path, map_location)
    return model_from_checkpoint(path, map_location)


def read_config(path: Path) -> ModelConfig:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {CONFIG_FILE}: pass a weights folder written by imagetx.export "
                              "or save_pretrained, or a .ckpt checkpoint")
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read ({error}); write the folder again with imagetx.export") from error
    if not isinstance(values, dict) or FORMAT_KEY not in values:
        raise CheckpointError(f"{path} is not an imagetx {CONFIG_FILE} (no {FORMAT_KEY}); write the folder with "
                              "imagetx.export or save_pretrained")
    version = values.pop(FORMAT_KEY)
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: {FORMAT_KEY} {version!r}, where this imagetx reads {FORMAT_VERSION}: read the "
                              "folder with the imagetx that wrote it, or export it again with this one")
    try:
        return ModelConfig.from_dict(values).validate()
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: {error}; fix the field or export the folder again") from error


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {WEIGHTS_FILE}: pass a weights folder written by imagetx.export "
                              "or save_pretrained, or a .ckpt checkpoint")
    try:
        return load_file(path)
    except Exception as error:  # safetensors' own error type for a bad header, truncation, ...
        raise CheckpointError(f"{path} cannot be read ({type(error).__name__}: {error}): the file is truncated or "
                              "corrupt; export the folder again") from error
