"""Which checkpoint a training run continues from (``--resume``), and where to continue
after a run stopped on a non-finite loss.

``checkpoint_to_resume`` checks the checkpoint before training starts, so that a wrong one
is refused with one line instead of failing deep inside Lightning's fit loop, and one that would
run code when opened is refused before Lightning opens it (checkpoint.load_weights_only).
"""

from __future__ import annotations

from pathlib import Path

from ..io.checkpoint import CHECKPOINT_DIR, LAST, read_checkpoint
from ..io.errors import CheckpointError
from ..model.config import ModelConfig


def checkpoint_to_resume(resume: str | None, root: Path, config: ModelConfig) -> str | None:
    """The checkpoint ``--resume`` names ('last': ``root/checkpoints/last.ckpt``), checked: it
    exists, is readable, is imagetx's, holds the training state and the same model
    configuration as this run."""
    if resume is None:
        return None
    path = root / CHECKPOINT_DIR / LAST if resume == "last" else Path(resume)
    if path.is_dir():
        raise CheckpointError(f"--resume {resume}: {path} is a folder (weights to share hold no optimiser or loop "
                              "state); resume from a checkpoint written by imagetx.train, e.g. checkpoints/last.ckpt")
    if not path.is_file():
        raise CheckpointError(f"--resume {resume}: no checkpoint at {path}; start without --resume "
                              "or pass the path of an existing .ckpt")
    checkpoint = read_checkpoint(path, mmap=True)
    if "optimizer_states" not in checkpoint or "loops" not in checkpoint:
        raise CheckpointError(f"--resume {path}: this checkpoint holds weights only (no optimiser or loop state); "
                              "resume from a checkpoint written by imagetx.train, e.g. checkpoints/last.ckpt")
    stored = checkpoint["imagetx"].get("model_config", {})
    wanted = config.to_dict()
    differ = [f"{key}={stored[key]!r} there, {wanted[key]!r} here" for key in wanted if stored.get(key) != wanted[key]]
    if differ:
        raise CheckpointError(f"--resume {path}: the checkpoint's model differs from this run's "
                              f"({'; '.join(differ[:3])}): resume with the configuration it was trained with, "
                              "or start a new run elsewhere")
    return str(path)


def last_good_checkpoint(root: Path) -> str:
    """Where to continue from after a non-finite loss, in words."""
    last = root / CHECKPOINT_DIR / LAST
    try:
        step = read_checkpoint(last, mmap=True).get("global_step")
    except CheckpointError:
        return "no checkpoint was written yet: lower --model.peak_lr or set --trainer.gradient_clip_val and start again"
    return (f"the last good checkpoint is {last} (after step {step}): continue with --resume last, perhaps with a "
            "lower --model.peak_lr or --trainer.gradient_clip_val")
