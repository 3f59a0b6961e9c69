"""Checkpoints that rebuild their model from the file alone.

Every imagetx checkpoint — a plain one from ``save_model`` or a Lightning one
written during training — carries ``checkpoint["imagetx"]["model_config"]``, so
evaluation and sampling need nothing but the path. Writes are atomic: a
temporary file in the same directory, renamed into place (``AtomicCheckpointIO`` makes
Lightning write its checkpoints that way too). ``checkpoint_to_resume`` checks the
checkpoint that ``--resume`` names before training starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .atomic import TEMPORARY_SUFFIX, atomic_write
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


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files of writes that a killed process never finished
    (``.NAME.XXXX.tmp``, as written by ``atomic_torch_save``); returns what was removed."""
    directory = Path(directory)
    removed = []
    if directory.is_dir():
        for stale in directory.glob(f".*{TEMPORARY_SUFFIX}"):
            if stale.is_file():
                stale.unlink(missing_ok=True)
                removed.append(stale)
    return removed


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


def check_device(device: str | torch.device) -> None:
    """A device this machine has, or a ValueError saying which to use instead."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"--device {device!r} is not a device name ({error}); use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")


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


def check_writable(directory: str | os.PathLike, setting: str) -> Path:
    """Create ``directory`` if needed and prove it can be written, or raise one clear
    OSError naming ``setting``, the option that chooses another."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".imagetx-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise OSError(f"cannot write to {directory} ({error.strerror or error}); "
                      f"choose another with {setting} DIR") from None
    return directory


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


def checkpoint_to_resume(resume: str | None, root: Path, config: ModelConfig) -> str | None:
    """The checkpoint ``--resume`` names ('last': ``root/checkpoints/last.ckpt``), checked: it
    exists, is readable, is imagetx's, holds the training state and the same model
    configuration as this run."""
    if resume is None:
        return None
    path = root / CHECKPOINT_DIR / LAST if resume == "last" else Path(resume)
    if not path.is_file():
        raise CheckpointError(f"--resume {resume}: no checkpoint at {path}; start without --resume "
                              "or pass the path of an existing .ckpt")
    checkpoint = read_checkpoint(path, mmap=True)
    if "optimizer_states" not in checkpoint or "loops" not in checkpoint:
        raise CheckpointError(f"--resume {path}: this checkpoint holds weights only (no optimiser or loop state); "
                              "resume from a checkpoint written by imagetx.train, e.g. checkpoints/last.ckpt")
    check_loader_state(checkpoint, path)
    # fields a checkpoint from an older version lacks have their defaults
    stored = {**ModelConfig().to_dict(), **checkpoint["imagetx"].get("model_config", {})}
    wanted = config.to_dict()
    differ = [f"{key}={stored[key]!r} there, {wanted[key]!r} here" for key in wanted if stored.get(key) != wanted[key]]
    if differ:
        raise CheckpointError(f"--resume {path}: the checkpoint's model differs from this run's "
                              f"({'; '.join(differ[:3])}): resume with the configuration it was trained with, "
                              "or start a new run elsewhere")
    return str(path)


def check_loader_state(checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse a training-loader state written by an imagetx older than the StatefulDataLoader
    training order (data.py: TrainOrder, TrainLoader): its ``{epoch, batches, ...}`` cannot
    place this version's order, and Lightning would fail deep inside the fit loop."""
    loops = checkpoint.get("loops") or {}
    states = ((loops.get("fit_loop") or {}).get("state_dict") or {}).get("combined_loader") or []
    if any(isinstance(state, dict) and "batches" in state and "_num_yielded" not in state
           and "_snapshot" not in state for state in states):
        raise CheckpointError(
            f"--resume {path}: this checkpoint's training-loader state is from an older imagetx, which this version "
            "cannot continue: start a new run (without --resume, or in another --trainer.default_root_dir); its "
            "weights still serve imagetx.evaluate and imagetx.sample as they are")


def last_good_checkpoint(root: Path) -> str:
    """Where to continue from after a non-finite loss, in words."""
    last = root / CHECKPOINT_DIR / LAST
    try:
        step = read_checkpoint(last, mmap=True).get("global_step")
    except CheckpointError:
        return "no checkpoint was written yet: lower --model.peak_lr or set --trainer.gradient_clip_val and start again"
    return (f"the last good checkpoint is {last} (after step {step}): continue with --resume last, perhaps with a "
            "lower --model.peak_lr or --trainer.gradient_clip_val")
