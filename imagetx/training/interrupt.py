"""Ctrl-C during training: the step under way ends, ``last.ckpt`` is written there, and the run
stops with one line (``train.run_training``)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback


class Interruption(Callback):
    """Ctrl-C during ``fit``. The first only asks to stop (``request``: the SIGINT handler that
    ``ctrl_c_ends_the_step`` sets for the fit): the step under way ends, and at its end this callback
    sets ``trainer.should_stop``, at which ``LastCheckpoint`` (a Checkpoint: Lightning runs it after
    this callback) writes last.ckpt, as at any stop, so that nothing is lost and ``--resume last``
    goes on exactly. The validation Lightning runs at a stop is skipped: a KeyboardInterrupt at its
    start. A second Ctrl-C (Python's handler again) stops at once, inside the step, with last.ckpt
    as last written: a checkpoint taken inside a step would hold a batch drawn from the training
    order but not trained on, which a resumed run would skip.

    Lightning catches the KeyboardInterrupt, shuts down and exits with code 1 (``sys.exit(1)``),
    which ``train`` turns into one ``stopped:`` line and exit 130; ``on_exception`` is Lightning's
    hook for an exception in fit."""

    def __init__(self) -> None:
        self.step: int | None = None  # the step at the interrupt, once there was one
        self.requested = False  # Ctrl-C was pressed: stop at the end of the step under way
        self.previous_handler = signal.default_int_handler  # what a second Ctrl-C calls

    def request(self, signum: int, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous_handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.requested:
            trainer.should_stop = True

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.step = trainer.global_step


@contextmanager
def ctrl_c_ends_the_step(interruption: Interruption, trainer: Trainer) -> Iterator[None]:
    """Ctrl-C handled by ``interruption.request`` inside the block, Python's handler (or the one
    that was set) again after it. One process only: with several, each would stop at the step its
    own Ctrl-C came in, and the others would wait for it; there Lightning's own handling stays."""
    if trainer.world_size > 1 or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    interruption.previous_handler = signal.default_int_handler if previous is None else previous
    signal.signal(signal.SIGINT, interruption.request)
    try:
        yield
    finally:  # Lightning ignores Ctrl-C once it has caught one (SIG_IGN): undone here too
        signal.signal(signal.SIGINT, interruption.previous_handler)
