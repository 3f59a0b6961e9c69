"""The Trainer that ``imagetx.train`` runs: Lightning's, with the batch limits typed for the parser
and one progress bar whatever is installed.

Kept: Lightning's annotation reaches the parser as ``float | int`` (a YAML ``limit_val_batches: 1`` became
1.0, every batch), and Lightning picks Rich's bar where Rich is installed, which writes nothing to a log
file until the end (the class and ``progress_bar`` say more)."""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

# Where the output is not a terminal (a log file, CI), each redraw of a bar is a line of its own:
# there the bars redraw every this many batches (a line every ~30 s on the CPU presets, ~6 s on
# an H100) instead of every batch.
LOG_REFRESH_BATCHES = 100


def progress_bar() -> TQDMProgressBar:
    """tqdm's bar, redrawn every batch on a terminal and every ``LOG_REFRESH_BATCHES`` elsewhere.
    (Lightning picks Rich's bar where Rich is installed, e.g. by Gradio; outside a terminal that
    one writes nothing until the end.)"""
    return TQDMProgressBar(refresh_rate=1 if sys.stdout.isatty() else LOG_REFRESH_BATCHES)


class Trainer(L.Trainer):
    """Lightning's Trainer, with the batch limits typed ``int | float`` so that a YAML ``1``
    stays the count 1. Lightning's own annotation reaches the parser as ``float | int``
    (typing caches a Union by its members, whatever their order), which turns 1 into 1.0:
    every batch. Its progress bar is tqdm's (``progress_bar``) unless one is given.

    Args:
        limit_train_batches: training batches per epoch: an int counts, a float is a fraction
        limit_val_batches: validation batches per validation: an int counts, a float is a fraction
        limit_test_batches: test batches: an int counts, a float is a fraction
        limit_predict_batches: prediction batches: an int counts, a float is a fraction
    """

    def __init__(self, *args, limit_train_batches: int | float | None = None,
                 limit_val_batches: int | float | None = None, limit_test_batches: int | float | None = None,
                 limit_predict_batches: int | float | None = None, **kwargs) -> None:
        callbacks = kwargs.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if kwargs.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, progress_bar()]
        super().__init__(*args, limit_train_batches=limit_train_batches, limit_val_batches=limit_val_batches,
                         limit_test_batches=limit_test_batches, limit_predict_batches=limit_predict_batches, **kwargs)
