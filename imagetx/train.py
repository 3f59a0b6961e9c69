"""``python -m imagetx.train``: LightningCLI training with YAML presets (SPEC §8).

    python -m imagetx.train --config configs/quick.yaml [--data.root DIR] [--trainer.max_steps N]
                            [--resume last|PATH] [--wandb auto|online|offline|disabled]
                            [--checkpoint_every_n_steps N]

No subcommand: it always fits. Every run writes, under ``trainer.default_root_dir``:
``checkpoints/`` (``last.ckpt`` and the best by ``val/bpd``), ``csv/version_N/``
(metrics and the resolved ``config.yaml``), ``samples/`` (PNG grids) and ``wandb/``.

Crashes: ``last.ckpt`` is rewritten (atomically) at every validation and every
``--checkpoint_every_n_steps`` optimiser steps, so a killed run loses at most that many
steps; ``--resume last`` continues it exactly where the checkpoint was taken: the
training order is a function of (seed, epoch) that resumes mid-epoch, and each batch
draws its randomness (dropout, flips) from a seed of (seed, epoch, batch).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger

from .callbacks import TrainingSpeed
from .checkpoint import CheckpointError, check_writable, read_checkpoint, remove_stale_temporaries
from .config import ModelConfig
from .data import DataError
from .lit import ImageTransformerModule, NonFiniteLossError
from .resumable import AtomicCheckpointIO, TrainingDataModule, checkpoint_callbacks
from .tracking import WANDB_MODES, SafeWandbLogger, choose_wandb_mode

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"
DEFAULT_CHECKPOINT_EVERY = 1000  # optimiser steps; validations write last.ckpt too


# ----- loggers and the CLI ---------------------------------------------------------------

def make_loggers(root: Path, wandb_choice: str, project: str) -> list:
    """CSV metrics always (for plots and for runs with W&B off), plus W&B unless disabled.
    W&B trouble (not installed, no network, a failing call) never stops training."""
    loggers: list = [CSVLogger(save_dir=str(root), name="csv")]
    if choose_wandb_mode(wandb_choice) != "disabled":
        try:
            loggers.append(SafeWandbLogger(project=project, save_dir=str(root), log_model=False))
        except Exception as error:  # e.g. wandb not installed
            print(f"W&B: cannot start ({type(error).__name__}: {error}); training without it, "
                  "metrics still go to csv/", file=sys.stderr)
    return loggers


class ImagetxCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--resume", type=str | None, default=None,
                            help="continue a run: 'last' (<default_root_dir>/checkpoints/last.ckpt) or a checkpoint path")
        parser.add_argument("--wandb", type=str, default="auto",
                            help=f"W&B mode, one of {', '.join(WANDB_MODES)}; auto = online with a key, else offline")
        parser.add_argument("--wandb_project", type=str, default="imagetx", help="W&B project name")
        parser.add_argument("--checkpoint_every_n_steps", type=int, default=DEFAULT_CHECKPOINT_EVERY,
                            help="also write last.ckpt every N optimiser steps (a crash loses at most N steps); "
                                 "0 = only at validations")
        prefer_int_batch_limits(parser)

    def parse_arguments(self, parser, args) -> None:
        # the settings' names, for "did you mean" in condensed_parser_error
        KNOWN_KEYS.update(action.dest.split(".")[-1] for action in parser._actions if action.dest)
        super().parse_arguments(parser, args)

    def instantiate_trainer(self, **kwargs: Any):
        trainer_init = self._get(self.config_init, "trainer")
        root = Path(trainer_init.get("default_root_dir") or "runs/default")
        trainer_init["default_root_dir"] = str(root)
        every = self.config.checkpoint_every_n_steps
        if every < 0:
            raise ValueError(f"--checkpoint_every_n_steps {every} is invalid: give N >= 1, or 0 for validations only")
        check_writable(root, "--trainer.default_root_dir")
        remove_stale_temporaries(root / CHECKPOINT_DIR)  # from a run killed mid-write
        if trainer_init.get("logger") in (None, True):
            trainer_init["logger"] = make_loggers(root, self.config.wandb, self.config.wandb_project)
        if not trainer_init.get("plugins"):
            trainer_init["plugins"] = [AtomicCheckpointIO()]
        persistent = [
            *checkpoint_callbacks(root / CHECKPOINT_DIR, every),
            LearningRateMonitor(logging_interval="step"),
            TrainingSpeed(),
        ]
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer({**trainer_init, **kwargs}, extra + persistent)


def prefer_int_batch_limits(parser) -> None:
    """Read ``limit_*_batches: 1`` as one batch, as Lightning means it.

    Lightning types these ``float | int | None``; the parser tries float first and
    turns the count 1 into 1.0, which Lightning reads as 100 % of the batches.
    Trying int first keeps counts counts and fractions (0.25, 1.0) fractions.
    """
    limits = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")
    for action in parser._actions:
        if getattr(action, "dest", "").removeprefix("trainer.") in limits and hasattr(action, "_typehint"):
            action._typehint = int | float | None


def resolve_resume(resume: str | None, root: Path, config: ModelConfig) -> str | None:
    """The checkpoint to resume from, checked: it exists, is readable, is imagetx's, and
    holds the same model configuration as this run."""
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
    # fields a checkpoint from an older version lacks have their defaults
    stored = {**ModelConfig().to_dict(), **checkpoint["imagetx"].get("model_config", {})}
    wanted = config.to_dict()
    differ = [f"{key}={stored[key]!r} there, {wanted[key]!r} here" for key in wanted if stored.get(key) != wanted[key]]
    if differ:
        raise CheckpointError(f"--resume {path}: the checkpoint's model differs from this run's "
                              f"({'; '.join(differ[:3])}): resume with the configuration it was trained with, "
                              "or start a new run elsewhere")
    return str(path)


def condensed_parser_error(message: str) -> str:
    """jsonargparse's multi-line error as one line: the setting's full key and the problem.

    e.g. 'Parser key "model.config": ... Option 'd_modle' is not accepted' becomes
    "model.config: unknown key 'd_modle' (did you mean 'd_model'?)"."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    path: list[str] = []
    details: list[str] = []
    skip = ("Does not validate against", "Subtypes:", "Errors:", "Given value", "- Expected a <class 'NoneType'>",
            "- Problem with given class_path")
    for line in lines:
        key = re.fullmatch(r'-?\s*Parser key "([^"]+)":\s*(.*)', line)
        if key:
            path.append(key.group(1))
            if key.group(2):
                details.append(key.group(2))
        elif not line.startswith(skip):
            details.append(line.lstrip("- "))
    text = " ".join(details) or message.strip().splitlines()[0]
    unknown = re.search(r"Option '([^']+)' is not accepted|unrecognized arguments?: (\S+)"
                        r"|Group '([^']+)' does not accept option '([^']+)'", text)
    if unknown:
        group, name = unknown.group(3), (unknown.group(1) or unknown.group(2) or unknown.group(4)).lstrip("-")
        if group:
            path.append(group)
        known = {f.name for f in fields(ModelConfig)} | KNOWN_KEYS
        parts = name.split(".")
        first_unknown = next((i for i, part in enumerate(parts) if part not in known), len(parts) - 1)
        path += parts[:first_unknown]
        name, wrong = ".".join(parts[first_unknown:]), parts[first_unknown]
        close = difflib.get_close_matches(wrong, sorted(known), n=1)
        text = f"unknown key '{name}'" + (f" (did you mean '{close[0]}'?)" if close else "")
    where = ".".join(path)
    return f"{where}: {text}" if where else text


KNOWN_KEYS: set[str] = set()


class ConfigError(ValueError):
    """A setting the parser rejected (unknown key, wrong type)."""


def main(args: list[str] | None = None) -> None:
    debug = bool(os.environ.get("IMAGETX_DEBUG"))
    cli = None
    try:
        from argparse import ArgumentError  # what jsonargparse raises with exit_on_error=False

        try:
            cli = ImagetxCLI(
                ImageTransformerModule,
                TrainingDataModule,
                run=False,
                args=args,
                seed_everything_default=0,
                save_config_kwargs={"overwrite": True},
                parser_kwargs={"description": __doc__, "exit_on_error": False},
            )
        except ArgumentError as error:
            if debug:
                raise
            raise ConfigError(condensed_parser_error(str(error)) +
                              " (fix the YAML file or the --flag; python -m imagetx.train --help lists them)") from None
        root = Path(cli.trainer.default_root_dir)
        ckpt_path = resolve_resume(cli.config.resume, root, cli.model.config)
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path)
        final = root / CHECKPOINT_DIR / LAST
        written = getattr(cli.trainer.strategy.checkpoint_io, "written", {})
        need_final = (cli.trainer.global_step > 0 and not cli.trainer.interrupted
                      and written.get(os.path.abspath(final)) != cli.trainer.global_step)
        # Only rank 0 writes files, so only it knows; every rank must agree, because
        # save_checkpoint waits for all of them at a barrier.
        if cli.trainer.strategy.broadcast(need_final, src=0):
            cli.trainer.save_checkpoint(final)  # e.g. max_epochs ended without a validation
        if cli.trainer.is_global_zero:
            print(f"checkpoints in {root / CHECKPOINT_DIR}; evaluate with: python -m imagetx.evaluate --ckpt {final}")
    except (ConfigError, DataError, CheckpointError, NonFiniteLossError, OSError, ValueError) as error:
        if debug:
            raise
        message = " ".join(str(error).split("\n"))
        if isinstance(error, NonFiniteLossError) and cli is not None:
            message += "; " + last_good_checkpoint(cli.trainer)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def last_good_checkpoint(trainer) -> str:
    """Where to continue from after a non-finite loss, in words."""
    last = Path(trainer.default_root_dir) / CHECKPOINT_DIR / LAST
    if not last.is_file():
        return "no checkpoint was written yet: lower --model.peak_lr or set --trainer.gradient_clip_val and start again"
    io = getattr(trainer.strategy, "checkpoint_io", None)
    step = getattr(io, "written", {}).get(os.path.abspath(last))
    when = f"after step {step}" if step is not None else "written before this run"
    return (f"the last good checkpoint is {last} ({when}): continue with --resume last, perhaps with a lower "
            "--model.peak_lr or --trainer.gradient_clip_val")


if __name__ == "__main__":
    main()
