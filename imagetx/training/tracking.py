"""Weights & Biases mode selection: online with a key, offline without, never a hang.

``--wandb auto`` (the default) logs online when an API key is configured
(``WANDB_API_KEY`` or a ``wandb login`` entry in ~/.netrc) and offline otherwise,
saying so once; ``offline`` and ``disabled`` force those modes; a ``WANDB_MODE``
already set in the environment is respected. ``SafeWandbLogger`` keeps W&B failures
(no network, a failing call) from ever stopping training.
"""

from __future__ import annotations

import netrc
import os
import sys
from functools import wraps

from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, WandbLogger

WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_HOST = "api.wandb.ai"


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
        raise ValueError(f"--wandb {requested!r} is invalid: choose one of {', '.join(WANDB_MODES)}")
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
    loggers: list = [CSVLogger(save_dir=str(root), name="csv")]
    if choose_wandb_mode(wandb_choice) != "disabled":
        try:
            loggers.append(SafeWandbLogger(project=project, save_dir=str(root), log_model=False))
        except Exception as error:  # e.g. wandb not installed
            print(f"W&B: cannot start ({type(error).__name__}: {error}); training without it, "
                  "metrics still go to csv/", file=sys.stderr)
    return loggers


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


class SafeWandbLogger(WandbLogger):
    """WandbLogger whose every logging call catches its own errors: the first failure is
    reported once on stderr and turns W&B off for the rest of the run (CSV and checkpoints
    carry on). Starting the W&B run (``experiment``, which Lightning touches at setup) is
    guarded the same way, so a failing ``wandb.init`` (no network, a bad key) costs nothing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.wandb_failed: str | None = None

    def turn_off(self, what: str, error: BaseException) -> None:
        self.wandb_failed = f"{type(error).__name__}: {error}"
        print(f"W&B: {what} failed ({self.wandb_failed}); W&B logging is off for the rest of this run. "
              "Training goes on: metrics still go to csv/, checkpoints are unaffected.", file=sys.stderr)

    @property
    def experiment(self):
        if self.wandb_failed is None:
            try:
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
