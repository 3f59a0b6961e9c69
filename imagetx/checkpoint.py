"""Checkpoints that rebuild their model from the file alone.

Every imagetx checkpoint — a plain one from ``save_model`` or a Lightning one
written during training — carries ``checkpoint["imagetx"]["model_config"]``, so
evaluation and sampling need nothing but the path. Writes are atomic: a
temporary file in the same directory, renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from .config import ModelConfig
from .model import ImageTransformer

FORMAT_VERSION = 1
LIGHTNING_PREFIX = "model."  # the LightningModule keeps the network as ``self.model``


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, not imagetx's, or does not fit its config."""


def imagetx_metadata(config: ModelConfig) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "model_config": config.to_dict()}


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temporary file beside ``path``, then rename: a kill never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_model(model: ImageTransformer, path: str | os.PathLike) -> None:
    atomic_torch_save({"imagetx": imagetx_metadata(model.config), "state_dict": model.state_dict()}, path)


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load the raw checkpoint dict, turning every failure into one clear CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass the path of a .ckpt file written by imagetx")
    try:
        # Lightning checkpoints hold more than tensors (loop state, callbacks), so
        # weights_only=False: load only checkpoints you trust, as with any pickle.
        checkpoint = torch.load(path, map_location=map_location, weights_only=False)
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
    model = ImageTransformer(model_config_of(checkpoint))
    try:
        model.load_state_dict(model_state_dict(checkpoint))
    except RuntimeError as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{path}: the weights do not fit the model configuration stored with them ({first})") from error
    return model.to(map_location).eval()
