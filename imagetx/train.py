"""``python -m imagetx.train``: LightningCLI training with YAML presets (SPEC §8).

    python -m imagetx.train --config configs/quick.yaml [--data.root DIR] [--trainer.max_steps N]
                            [--resume last|PATH] [--wandb auto|online|offline|disabled]

No subcommand: it always fits. Every run writes, under ``trainer.default_root_dir``:
``checkpoints/`` (``last.ckpt`` and the best by ``val/bpd``), ``csv/version_N/``
(metrics and the resolved ``config.yaml``), ``samples/`` (PNG grids) and ``wandb/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .checkpoint import CheckpointError, atomic_torch_save
from .callbacks import TrainingSpeed
from .data import CIFAR10DataModule, DataError
from .lit import ImageTransformerModule, NonFiniteLossError
from .tracking import WANDB_MODES, choose_wandb_mode

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file and renames it: a kill mid-write never
    leaves a corrupt ``last.ckpt`` behind."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if get_filesystem(path).protocol not in ("file", ("file", "local")) and "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_torch_save(checkpoint, path)


def make_loggers(root: Path, wandb_choice: str, project: str) -> list:
    """CSV metrics always (for plots and for runs with W&B off), plus W&B unless disabled."""
    loggers: list = [CSVLogger(save_dir=str(root), name="csv")]
    if choose_wandb_mode(wandb_choice) != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project=project, save_dir=str(root), log_model=False))
    return loggers


class ImagetxCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--resume", type=str | None, default=None,
                            help="continue a run: 'last' (<default_root_dir>/checkpoints/last.ckpt) or a checkpoint path")
        parser.add_argument("--wandb", type=str, default="auto",
                            help=f"W&B mode, one of {', '.join(WANDB_MODES)}; auto = online with a key, else offline")
        parser.add_argument("--wandb_project", type=str, default="imagetx", help="W&B project name")

    def instantiate_trainer(self, **kwargs: Any):
        trainer_init = self._get(self.config_init, "trainer")
        root = Path(trainer_init.get("default_root_dir") or "runs/default")
        trainer_init["default_root_dir"] = str(root)
        if trainer_init.get("logger") in (None, True):
            trainer_init["logger"] = make_loggers(root, self.config.wandb, self.config.wandb_project)
        if not trainer_init.get("plugins"):
            trainer_init["plugins"] = [AtomicCheckpointIO()]
        checkpoints = root / CHECKPOINT_DIR
        persistent = [
            ModelCheckpoint(dirpath=checkpoints, filename="best-{step}", monitor="val/bpd", mode="min",
                            save_top_k=1, save_last=True, auto_insert_metric_name=False),
            LearningRateMonitor(logging_interval="step"),
            TrainingSpeed(),
        ]
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer({**trainer_init, **kwargs}, extra + persistent)


def resolve_resume(resume: str | None, root: Path) -> str | None:
    if resume is None:
        return None
    path = root / CHECKPOINT_DIR / LAST if resume == "last" else Path(resume)
    if not path.is_file():
        raise CheckpointError(f"--resume {resume}: no checkpoint at {path}; start without --resume "
                              "or pass the path of an existing .ckpt")
    return str(path)


def main(args: list[str] | None = None) -> None:
    debug = bool(os.environ.get("IMAGETX_DEBUG"))
    try:
        cli = ImagetxCLI(
            ImageTransformerModule,
            CIFAR10DataModule,
            run=False,
            args=args,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"description": __doc__},
        )
        root = Path(cli.trainer.default_root_dir)
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=resolve_resume(cli.config.resume, root))
        final = root / CHECKPOINT_DIR / LAST
        if cli.trainer.global_step > 0 and not cli.trainer.interrupted:
            cli.trainer.save_checkpoint(final)  # max_time/max_steps may end between validations
        print(f"checkpoints in {root / CHECKPOINT_DIR}; evaluate with: python -m imagetx.evaluate --ckpt {final}")
    except (DataError, CheckpointError, NonFiniteLossError, OSError, ValueError) as error:
        if debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        if isinstance(error, NonFiniteLossError):
            last = Path(cli.trainer.default_root_dir) / CHECKPOINT_DIR / LAST
            print(f"the last good checkpoint is {last if last.is_file() else 'none yet'}", file=sys.stderr)
        print("(set IMAGETX_DEBUG=1 for the full traceback)", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
