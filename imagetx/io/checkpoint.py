"""Torch checkpoint files (``.ckpt``): written by training, read without running any code.

Every imagetx checkpoint carries ``checkpoint["imagetx"]["model_config"]``, so evaluation and
sampling need nothing but the path. Read with torch alone (no Lightning): the network's weights
are the state dict's ``model.*`` entries. Writes are atomic: a temporary file in the same
directory, renamed into place (``training.checkpoint_io.AtomicCheckpointIO`` makes Lightning
write its checkpoints that way too). Which checkpoint a run resumes from is
``training.resume``'s business; the shareable weights folder (safetensors + config.json) is
weights.py's.

A checkpoint is a pickle, and a pickle can call any function while it is opened.
``load_weights_only`` opens every checkpoint imagetx reads with torch's weights-only
unpickler, which builds nothing but tensors, numbers, strings, lists, tuples, dicts and
OrderedDicts, and refuses any other object before calling it. Nothing is added to torch's own
allowlist: a checkpoint written by ``imagetx.train`` holds only those (the state dict is an
OrderedDict of tensors; the hyper-parameters, loop, callback, optimiser and scheduler states are
plain dicts, lists and numbers; the model configuration a plain dict), so a file that needs
anything else was not written by imagetx as it is and is refused.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch

from ..model.config import ModelConfig
from ..model.transformer import AutoregressiveModel
from .atomic import atomic_write
from .errors import CheckpointError
from .names import missing_model
from .older import model_config
from .weights import checked_model

# 3: the config as ModelConfig.to_dict writes it; 2: in sections, with the attention kernel and its
# tiles; 1: one level. Each read (io/older.py).
FORMAT_VERSION = 3
LIGHTNING_PREFIX = "model."  # the LightningModule keeps the network as ``self.model``
CHECKPOINT_DIR = "checkpoints"  # under the run's directory (trainer.default_root_dir)
LAST = "last.ckpt"


def imagetx_metadata(config: ModelConfig) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "model_config": config.to_dict()}


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save that a kill never leaves half-written (``atomic.atomic_write``)."""
    atomic_write(path, lambda handle: torch.save(obj, handle))


def load_weights_only(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                      mmap: bool = False) -> Any:
    """The object saved in the torch file at ``path``, read with torch's weights-only unpickler:
    the one way imagetx opens a checkpoint. A file that needs any other object is refused before
    any of it is built; every failure is one CheckpointError naming the file.

    ``mmap=True`` maps the tensors instead of reading them (a cheap look inside a big file).
    torch's warnings while reading a file it then refuses ("Detected pickle protocol 4 ...", a plain
    pickle's) are dropped: the one-line refusal says what matters; a file read gives them as torch did."""
    path = Path(path)
    if not path.is_file():
        raise missing_model(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        raise refused(path, error) from error
    except Exception as error:  # truncated zip, wrong format
        raise unreadable(path, error) from error
    for warning in caught:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno,
                               source=warning.source)
    return checkpoint


def refused(path: str | os.PathLike, error: pickle.UnpicklingError) -> CheckpointError:
    """What to say when torch's weights-only unpickler refuses the file at ``path``: the objects
    it would have built, or, for a file that is no torch zip checkpoint, that it cannot be read."""
    unsafe = unsafe_objects(path)
    if unsafe is None:  # torch's legacy reader fails this way on any file that is not a checkpoint
        return unreadable(path, error)
    what = (f"would call {', '.join(unsafe[:3])}{' and more' if len(unsafe) > 3 else ''}" if unsafe
            else "would build objects other than tensors, numbers, strings, lists and dicts")
    return CheckpointError(f"checkpoint {path} is refused: opening it {what}, and imagetx opens checkpoints as data "
                           "only, never running code from them; use a checkpoint written by imagetx.train, or a "
                           "weights folder (model.safetensors + config.json)")


def unsafe_objects(path: str | os.PathLike) -> list[str] | None:
    """The functions and classes named in the pickle of the torch checkpoint at ``path`` beyond
    torch's weights-only set, read from its instructions without running them; None for a file
    that is not a torch zip checkpoint (torch.save's format since torch 1.6), or whose pickle torch
    cannot read that way (one written with another pickle protocol than torch.save's)."""
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, pickle.UnpicklingError):
        return None


def unreadable(path: str | os.PathLike, error: Exception) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}): the file is truncated or "
                           "corrupt, or not a torch.save checkpoint; use another checkpoint (e.g. last.ckpt)")


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """The checkpoint dict of an imagetx checkpoint (``load_weights_only``), or a CheckpointError."""
    checkpoint = load_weights_only(path, map_location, mmap)
    if not isinstance(checkpoint, dict) or "imagetx" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not an imagetx checkpoint (no model configuration inside); "
                              "pass a checkpoint written by imagetx.train, or a weights folder written by "
                              "imagetx.export or save_pretrained")
    return checkpoint


def model_config_of(checkpoint: dict[str, Any]) -> ModelConfig:
    try:
        return model_config(checkpoint["imagetx"]["model_config"]).validate()
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"the checkpoint's model configuration is not usable: {error}") from error


def model_state_dict(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The network's weights: the LightningModule's ``model.*`` entries, without the prefix."""
    return {key.removeprefix(LIGHTNING_PREFIX): value for key, value in checkpoint["state_dict"].items()
            if key.startswith(LIGHTNING_PREFIX)}


def model_from_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AutoregressiveModel:
    """Rebuild the model stored in the checkpoint file at ``path``, in eval mode."""
    checkpoint = read_checkpoint(path, map_location)
    try:
        config = model_config_of(checkpoint)
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}; use a checkpoint written by imagetx.train") from error
    return checked_model(config, model_state_dict(checkpoint), Path(path), "use a checkpoint written by imagetx.train",
                         map_location)

