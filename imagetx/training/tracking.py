"""Weights & Biases mode selection: online with a key, offline without, never a hang.

``--wandb auto`` (the default) logs online when an API key is configured
(``WANDB_API_KEY`` or a ``wandb login`` entry in ~/.netrc) and offline otherwise,
saying so once; ``offline`` and ``disabled`` force those modes; a ``WANDB_MODE``
already set in the environment is respected. ``SafeWandbLogger`` keeps W&B failures
(no network, a failing call) from ever stopping training. A resumed run (``--resume last``,
``PATH`` or ``auto``, a requeued job's rerun) goes on logging to the W&B run it started: the run's
id is kept in every checkpoint (``KeepWandbRun``) and given back to W&B (``continue_wandb_run``).

Kept: Lightning's CSVLogger and WandbLogger, less ThroughputMonitor's validation rows (their step counts
validation batches: metrics.csv's step ran backwards) and with a failing W&B call turning W&B off instead
of stopping the run (tests/training/test_train_output.py, tests/training/test_reliability_wandb.py).
"""

from __future__ import annotations

import netrc
import os
import sys
from functools import wraps

from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.trainer.states import RunningStage

from ..compat import resume_wandb_run
from ..errors import UserError
from ..io.checkpoint import read_checkpoint

WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_HOST = "api.wandb.ai"
# Lightning's ThroughputMonitor logs the validation's throughput ("validate/samples_per_sec", ...)
# at a step that counts validation batches (1 to 8 at a quick preset's first validation, 9 to 16 at
# its second), not optimiser steps: metrics.csv's step column ran backwards at every validation.
# imagetx's loggers leave those out; the training throughput ("train/...") is logged at training steps.
VALIDATION_THROUGHPUT = f"{RunningStage.VALIDATING.value}/"
# The checkpoint's entry holding the W&B run's id (a string; absent where no W&B run was ever started).
WANDB_RUN_KEY = "wandb_run_id"


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(WANDB_HOST) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def choose_wandb_mode(requested: str = "auto") -> str:
    """Set ``WANDB_MODE`` for this process and return it."""
    if requested not in WANDB_MODES:
        raise UserError(f"--wandb {requested!r} is invalid: choose one of {', '.join(WANDB_MODES)}")
    # Never let wandb wait for a key on standard input.
    os.environ.setdefault("WANDB_SILENT", "true")
    if requested == "auto":
        mode = os.environ.get("WANDB_MODE")
        if mode:
            return mode
        if has_wandb_key():
            mode = "online"
        else:
            mode = "offline"
            print("W&B: no API key found, logging offline (sync later with `wandb sync DIR`; "
                  "`--wandb disabled` turns it off).", file=sys.stderr)
    else:
        mode = requested
    os.environ["WANDB_MODE"] = mode
    return mode


def make_loggers(root: Path, wandb_choice: str, project: str) -> list:
    """CSV metrics always (for plots and for runs with W&B off), plus W&B unless disabled.
    W&B trouble (not installed, no network, a failing call) never stops training."""
    loggers: list = [RunCSVLogger(save_dir=str(root), name="csv")]
    mode = choose_wandb_mode(wandb_choice)
    if mode != "disabled":
        try:
            # The mode goes to wandb.init as well: W&B reads WANDB_MODE once per process, when it
            # first sets itself up, so a second run in one process (a notebook, the Python API)
            # would otherwise start in the first run's mode (online: trying the network).
            loggers.append(SafeWandbLogger(project=project, save_dir=str(root), log_model=False, mode=mode))
        except Exception as error:  # e.g. wandb not installed
            print(f"W&B: cannot start ({type(error).__name__}: {error}); training without it, "
                  "metrics still go to csv/", file=sys.stderr)
    return loggers


def wandb_loggers(loggers: list) -> list[WandbLogger]:
    return [logger for logger in loggers if isinstance(logger, WandbLogger)]


class KeepWandbRun(Callback):
    """Writes the W&B run's id into every checkpoint (``WANDB_RUN_KEY``), so that resuming from it
    continues that run instead of starting a new one each time (issue 111). The id read from the
    checkpoint resumed is written again where this part logged without W&B (``--wandb disabled``,
    or W&B failing to start), so a later resume with W&B still finds the run."""

    def __init__(self) -> None:
        self.run_id: str | None = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.run_id = checkpoint.get(WANDB_RUN_KEY) or self.run_id

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        # a run that did not start (SafeWandbLogger off) has no _experiment: version is then the id
        # it was given (continue_wandb_run), None for a new run
        run_id = next((logger.version for logger in wandb_loggers(trainer.loggers) if logger.version), self.run_id)
        if run_id:
            checkpoint[WANDB_RUN_KEY] = str(run_id)


def continue_wandb_run(loggers: list, ckpt_path: str | None) -> None:
    """Before fit: the W&B logger of a run resumed from ``ckpt_path`` continues the W&B run whose id
    the checkpoint holds (``resume="allow"``: W&B starts it afresh where it does not know it, e.g. a
    run logged offline and never synced). Lightning starts the W&B run at setup, before it reads the
    checkpoint, so a callback's own load comes too late: the id is read here, from the mapped file."""
    if ckpt_path is None or not wandb_loggers(loggers):
        return
    run_id = read_checkpoint(ckpt_path, mmap=True).get(WANDB_RUN_KEY)
    if not run_id:  # written before issue 111, or by a run that never had W&B: a new W&B run
        return
    for logger in wandb_loggers(loggers):
        # WandbLogger's own way to resume (its `id`/`version` argument) is only taken when it is
        # made, which imagetx.train does before it knows the checkpoint
        resume_wandb_run(logger, run_id)


class TrainingSteps:
    """For a Lightning logger: every metric at an optimiser step (``VALIDATION_THROUGHPUT`` left out)."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        kept = {key: value for key, value in metrics.items() if not key.startswith(VALIDATION_THROUGHPUT)}
        if kept:
            super().log_metrics(kept, step)


class RunCSVLogger(TrainingSteps, CSVLogger):
    """Lightning's CSVLogger, its rows at optimiser steps only (``TrainingSteps``)."""


# ----- a W&B logger that never costs a run ----------------------------------------------

GUARDED = ("log_metrics", "log_hyperparams", "log_image", "log_table", "log_text", "log_audio", "log_video",
           "log_graph", "watch", "save", "after_save_checkpoint", "finalize")


def _guarded(name: str):
    @wraps(getattr(WandbLogger, name))
    def call(self, *args, **kwargs):
        if self.wandb_failed is not None:
            return None
        try:
            return getattr(super(SafeWandbLogger, self), name)(*args, **kwargs)
        except Exception as error:  # network, quota, a wandb bug: W&B is a convenience, training is not
            self.turn_off(name, error)
            return None

    return call


class SafeWandbLogger(TrainingSteps, WandbLogger):
    """WandbLogger whose every logging call catches its own errors: the first failure is
    reported once on stderr and turns W&B off for the rest of the run (CSV and checkpoints
    carry on). Starting the W&B run (``experiment``, which Lightning touches at setup) is
    guarded the same way, so a failing ``wandb.init`` (no network, a bad key) costs nothing.
    Its metrics are logged at optimiser steps only (``TrainingSteps``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wandb_failed: str | None = None
        self.set_up = False  # wandb.setup() called (experiment)

    def turn_off(self, what: str, error: BaseException) -> None:
        self.wandb_failed = f"{type(error).__name__}: {error}"
        print(f"W&B: {what} failed ({self.wandb_failed}); W&B logging is off for the rest of this run. "
              "Training goes on: metrics still go to csv/, checkpoints are unaffected.", file=sys.stderr)

    @property
    def experiment(self):
        if self.wandb_failed is None:
            try:
                if not self.set_up:
                    # W&B reads WANDB_SILENT (choose_wandb_mode) when it sets itself up, which
                    # wandb.init does only after checking its arguments: Lightning's `anonymous=None`
                    # then printed "The anonymous setting has no effect ..." on every run.
                    # Set up first, W&B is silent from the start, as asked.
                    import wandb

                    wandb.setup()
                    self.set_up = True
                return WandbLogger.experiment.fget(self)
            except Exception as error:
                self.turn_off("starting the run", error)
        return _NoRun()


class _NoRun:
    """Stands in for a W&B run that could not start: every attribute, call and item is a no-op."""

    def __getattr__(self, name: str) -> "_NoRun":
        return self

    def __call__(self, *args, **kwargs) -> "_NoRun":
        return self

    def __getitem__(self, key) -> "_NoRun":
        return self

    def __setitem__(self, key, value) -> None:
        pass


for _name in GUARDED:
    if hasattr(WandbLogger, _name):
        setattr(SafeWandbLogger, _name, _guarded(_name))
