"""The Trainer that ``imagetx.train`` runs: Lightning's, with the batch limits typed for the parser
and one progress bar whatever is installed.

Kept: Lightning's annotation reaches the parser as ``float | int`` (a YAML ``limit_val_batches: 1`` became
1.0, every batch), and Lightning picks Rich's bar where Rich is installed, which writes nothing to a log
file until the end (the class and ``progress_bar`` say more); its tqdm bar redraws by batch counts,
which in a log either stand still for minutes or write a line every fraction of a second
(``LogProgressBar``). A run resumed in the middle of an epoch kept a bar with no total whose rate
counted the batches done before it as done at once, and the bar wrote val/bpd to 3 significant
digits (Lightning's) where metrics.csv holds the whole number (``TrainingBar``)."""

from __future__ import annotations

import math
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf

from ..compat import redraw_rule, restarted_mid_epoch
from .budget import budget_timer

# Where the output is not a terminal (a log file, CI), each redraw of a bar is a line of its own:
# there a bar redraws at most every this many seconds (and at its first and last batch), whatever
# a step costs: 4 lines a minute, on a 2-core CPU (2 steps a second) as on an H100 (15 or more).
LOG_REFRESH_SECONDS = 15.0


# The decimals of a bits/dim in the bar: metrics.csv's number rounded to this many places, the same
# places whatever its size (Lightning's bar wrote 3 significant digits: 9.870 but 10.20), as
# imagetx.export's model card quotes them.
BAR_DECIMALS = 4


class TrainingBar(TQDMProgressBar):
    """tqdm's bar as Lightning draws it, with two changes.

    Resumed in the middle of an epoch, Lightning calls no ``on_train_epoch_start`` (the epoch had
    started), so the bar stayed ``init_train_tqdm``'s: no total, and its first count, the batches
    done before the resume plus one, taken as done in the first fraction of a second (a rate of
    thousands). Here that bar is set up as an epoch's is, counting from the batches already done.

    Its float metrics (val/bpd, the one the module shows there) are metrics.csv's numbers rounded to ``BAR_DECIMALS`` places, not the
    3 significant digits Lightning's bar wrote."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_mid_epoch = False  # the bar awaits its first batch, whose index is the batches done

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self.resumed_mid_epoch = restarted_mid_epoch(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if not self.resumed_mid_epoch:
            return
        self.resumed_mid_epoch = False
        self.on_train_epoch_start(trainer)
        bar, done = self.train_progress_bar, batch_idx
        # Lightning's total is the epoch's batches, less any past max_steps: counted from this
        # run's first step, to which the batches done before are added (the bar counts the epoch)
        total = convert_inf(self.total_train_batches)
        bar.total = None if total is None else min(trainer.num_training_batches, done + total)
        # tqdm's rate is (n - initial) / elapsed: only this run's batches, over this run's time
        bar.initial = bar.n = bar.last_print_n = done
        bar.refresh()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.end_at_budget(trainer, pl_module, batch_idx)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def end_at_budget(self, trainer, pl_module, batch_idx: int) -> None:
        """In a run with a time budget, the bar ends where the budget does once that is known (the
        learning-rate horizon's end, budget.py): the epoch's batches said ``84/5625 [01:19<1:27:33]``
        for a 14-minute run. Lightning ends it at ``max_steps`` the same way. Taken afresh from the
        epoch's batches at every step, as the horizon's end moves with the budget (steered later too)."""
        horizon = getattr(pl_module, "horizon", None)
        epoch = convert_inf(trainer.num_training_batches)
        if budget_timer(trainer) is None or horizon is None or epoch is None:
            return
        batches_left = max(horizon.end - trainer.global_step, 0) * trainer.accumulate_grad_batches
        self.train_progress_bar.total = min(epoch, batch_idx + 1 + batches_left)

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = {key: f"{value:.{BAR_DECIMALS}f}" if isinstance(value, float) else value
                   for key, value in super().get_metrics(trainer, pl_module).items()}
        timer = budget_timer(trainer)
        if timer is not None and trainer.training:  # the budget's time left, not the epoch's
            seconds = int(max(timer.time_remaining(), 0.0))
            metrics["budget left"] = f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        return metrics


@redraw_rule
class LogProgressBar(TrainingBar):
    """tqdm's bar for output that is not a terminal: each bar redraws at its first batch, at its
    last, and between them once ``LOG_REFRESH_SECONDS`` have passed since the last redraw of any
    bar. ``should_redraw`` decides every redraw (``compat.redraw_rule``); a count of batches
    (Lightning's ``refresh_rate``) left a quick run's log at 0 % for its first 100 steps."""

    def __init__(self) -> None:
        super().__init__(refresh_rate=1)
        self.drawn_at = -math.inf  # time.monotonic() of the last redraw

    def should_redraw(self, current: int, total: int) -> bool:
        if not self.is_enabled:
            return False
        now = time.monotonic()
        if current in (1, total) or now - self.drawn_at >= LOG_REFRESH_SECONDS:
            self.drawn_at = now
            return True
        return False


def progress_bar() -> TrainingBar:
    """tqdm's bar (``TrainingBar``), redrawn every batch on a terminal and as ``LogProgressBar``
    says elsewhere. (Lightning picks Rich's bar where Rich is installed, e.g. by Gradio; outside a
    terminal that one writes nothing until the end.)"""
    return TrainingBar(refresh_rate=1) if sys.stdout.isatty() else LogProgressBar()


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
