"""The Trainer that ``imagetx.train`` runs: Lightning's, with the batch limits typed for the parser
and one progress bar whatever is installed.

Kept: Lightning's annotation reaches the parser as ``float | int`` (a YAML ``limit_val_batches: 1`` became
1.0, every batch), and Lightning picks Rich's bar where Rich is installed, which writes nothing to a log
file until the end (the class and ``progress_bar`` say more); its tqdm bar redraws by batch counts,
which in a log either stand still for minutes or write a line every fraction of a second
(``LogProgressBar``)."""

from __future__ import annotations

import math
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

# Where the output is not a terminal (a log file, CI), each redraw of a bar is a line of its own:
# there a bar redraws at most every this many seconds (and at its first and last batch), whatever
# a step costs: 4 lines a minute, on a 2-core CPU (2 steps a second) as on an H100 (15 or more).
LOG_REFRESH_SECONDS = 15.0


class LogProgressBar(TQDMProgressBar):
    """tqdm's bar for output that is not a terminal: each bar redraws at its first batch, at its
    last, and between them once ``LOG_REFRESH_SECONDS`` have passed since the last redraw of any
    bar. ``_should_update`` is where Lightning's bar decides every redraw; a count of batches
    there (``refresh_rate``) left a quick run's log at 0 % for its first 100 steps."""

    def __init__(self) -> None:
        super().__init__(refresh_rate=1)
        self.drawn_at = -math.inf  # time.monotonic() of the last redraw

    def _should_update(self, current: int, total: int) -> bool:
        if not self.is_enabled:
            return False
        now = time.monotonic()
        if current in (1, total) or now - self.drawn_at >= LOG_REFRESH_SECONDS:
            self.drawn_at = now
            return True
        return False


def progress_bar() -> TQDMProgressBar:
    """tqdm's bar, redrawn every batch on a terminal and as ``LogProgressBar`` says elsewhere.
    (Lightning picks Rich's bar where Rich is installed, e.g. by Gradio; outside a terminal that
    one writes nothing until the end.)"""
    return TQDMProgressBar(refresh_rate=1) if sys.stdout.isatty() else LogProgressBar()


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
