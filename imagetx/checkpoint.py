"""Checkpoints that rebuild their model from the file alone.

Every imagetx checkpoint — a plain one from ``save_model`` or a Lightning one
written during training — carries ``checkpoint["imagetx"]["model_config"]``, so
evaluation and sampling need nothing but the path. Writes are atomic: a
temporary file in the same directory, renamed into place (``AtomicCheckpointIO`` makes
Lightning write its checkpoints that way too). Which checkpoint a run resumes from is
resume.py's business.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .atomic import atomic_write
from .config import ModelConfig
from .model import ImageTransformer

FORMAT_VERSION = 1
LIGHTNING_PREFIX = "model."  # the LightningModule keeps the network as ``self.model``
CHECKPOINT_DIR = "checkpoints"  # under the run's directory (trainer.default_root_dir)
LAST = "last.ckpt"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, not imagetx's, or does not fit its config."""


def imagetx_metadata(config: ModelConfig) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "model_config": config.to_dict()}


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save that a kill never leaves half-written (``atomic.atomic_write``)."""
    atomic_write(path, lambda handle: torch.save(obj, handle))


def save_model(model: ImageTransformer, path: str | os.PathLike) -> None:
    atomic_torch_save({"imagetx": imagetx_metadata(model.config), "state_dict": model.state_dict()}, path)


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """Load the raw checkpoint dict, turning every failure into one clear CheckpointError.

    ``mmap=True`` maps the tensors instead of reading them (a cheap look inside a big file)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass the path of a .ckpt file written by imagetx")
    try:
        # Lightning checkpoints hold more than tensors (loop state, callbacks), so
        # weights_only=False: load only checkpoints you trust, as with any pickle.
        checkpoint = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    except Exception as error:  # truncated zip, wrong format, unpickling failure
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}): "
                              "the file is truncated or corrupt; use another checkpoint (e.g. last.ckpt)") from error
    if not isinstance(checkpoint, dict) or "imagetx" not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not an imagetx checkpoint (no model configuration inside); "
                              "pass a checkpoint written by imagetx.train or imagetx.save_model")
    return checkpoint


def model_config_of(checkpoint: dict[str, Any]) -> ModelConfig:
    try:
        return ModelConfig.from_dict(checkpoint["imagetx"]["model_config"]).validate()
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"the checkpoint's model configuration is not usable: {error}") from error


def model_state_dict(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    state = checkpoint["state_dict"]
    if any(key.startswith(LIGHTNING_PREFIX) for key in state):
        state = {key[len(LIGHTNING_PREFIX):]: value for key, value in state.items() if key.startswith(LIGHTNING_PREFIX)}
    return state


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> ImageTransformer:
    """Rebuild the model stored at ``path`` (plain or Lightning checkpoint), in eval mode."""
    checkpoint = read_checkpoint(path, map_location)
    try:
        config = model_config_of(checkpoint)
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}; use a checkpoint written by imagetx.train or save_model") from error
    model = ImageTransformer(config)
    try:
        model.load_state_dict(model_state_dict(checkpoint))
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{path}: the weights do not fit the model configuration stored with them ({first})") from error
    return model.to(map_location).eval()


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
