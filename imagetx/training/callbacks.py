"""Training callbacks: ``last.ckpt`` for resuming, the continuation checkpoint, and sample grids.

* ``LastCheckpoint`` keeps ``checkpoints/last.ckpt`` fresh, including at the step where a
  run stops, so that ``--resume last`` continues it exactly; a run resumed from another folder's
  checkpoint keeps its own best checkpoints.
* ``ContinuationCheckpoint`` writes ``checkpoints/continue.ckpt`` at a warmup–stable–decay
  run's last step at the peak, for a later run to go on from (its format: continuation.py).
* ``SampleGrid`` draws images with the cached sampler every N steps, writes a PNG
  into the run directory and, when a W&B logger is active, logs the grid there.

All kept: ``LastCheckpoint`` for an exact ``--resume last`` (its class says what ModelCheckpoint lacks);
``ContinuationCheckpoint`` as ModelCheckpoint saves on step counts, epochs, times or a monitored metric,
never at a step fixed during the run (the decay's start); ``SampleGrid`` as Lightning has no callback
that samples from a model. The best checkpoint by ``val/bpd`` is Lightning's ModelCheckpoint
(imagetx/train.py), as ``RunBestCheckpoint``: pruning only the run's own best checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from ..io.checkpoint import LAST
from ..model.superres import downsample_area
from ..data.images import save_grid
from ..model.sampler import sample
from .continuation import CONTINUE


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` every ``every_n_steps`` optimiser steps (0: never on a
    count), at the first step end ``every_minutes`` after it was last written (0: never on the
    clock), before and after every validation, at the training step where the run stops (max_steps,
    max_time, a stop signal, a callback's ``should_stop``), and at the end of the last epoch.
    The clock is ModelCheckpoint's ``train_time_interval`` for this file: a killed run (SIGKILL, a
    lost machine) loses at most that many minutes, however long its steps.

    Kept: ModelCheckpoint(save_last=True) writes the stopping step's last.ckpt after the loop has
    closed the epoch, and a run resumed from it counts that epoch as done (its order and dropout
    then drawn from the next); from inside the loop, it ends bitwise as the uninterrupted run
    (docs/training.md, "Crashes"; tests/training/test_reliability_resume.py).
    A ``Checkpoint``, so Lightning runs it after the other callbacks (the Timer among them)."""

    def __init__(self, dirpath: str | Path, every_n_steps: int = 0, every_minutes: float = 0) -> None:
        self.path = Path(dirpath) / LAST
        self.every_n_steps, self.every_seconds = every_n_steps, every_minutes * 60
        self.saved_step = -1
        self.saved_at = time.monotonic()  # the clock starts with the run

    def save(self, trainer, again: bool = False) -> None:
        """``last.ckpt`` at this step, unless it holds it already (``again``: rewritten all the same)."""
        # The same decision on every rank: save_checkpoint waits for all of them.
        if trainer.global_step > 0 and (again or trainer.global_step != self.saved_step) \
                and not trainer.sanity_checking:
            # weights_only here is Lightning's save option (False: the optimiser and loop state
            # too, for --resume), not torch.load's; every load in imagetx is weights-only.
            trainer.save_checkpoint(self.path, weights_only=False)
            self.saved_step, self.saved_at = trainer.global_step, time.monotonic()

    def time_is_up(self, trainer) -> bool:
        """Whether ``every_minutes`` have passed, by any process's clock: one decision for all."""
        if not self.every_seconds:
            return False
        due = time.monotonic() - self.saved_at >= self.every_seconds
        return trainer.strategy.reduce_boolean_decision(due, all=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if (self.every_n_steps and step % self.every_n_steps == 0) or trainer.should_stop \
                or 0 < trainer.max_steps <= step or self.time_is_up(trainer):
            self.save(trainer)

    def on_validation_start(self, trainer, pl_module) -> None:
        # The step before a validation, kept: a stop signal during the validation ends the run at
        # once (training/interrupt.py), which would otherwise lose every step since the last write.
        if trainer.state.fn == "fit":
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit":
            self.save(trainer, again=True)  # with what the validation decided (the best checkpoint's state)

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer)  # the epochs ran out (max_epochs): the checkpoint marks the last one finished

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """A checkpoint written in another run folder (a continuation, a copied ``last.ckpt``)
        brings the best checkpoints of that folder: this run keeps its own, from its first
        validation. Lightning's ModelCheckpoint would reload only their path, warning that "the
        dirpath has changed" on every continued run: its state is dropped here, as every
        callback's ``on_load_checkpoint`` runs before any callback reads its state."""
        states = checkpoint.get("callbacks", {})
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                state = states.get(callback.state_key)
                if state is not None and state.get("dirpath") != callback.dirpath:
                    del states[callback.state_key]


class RunBestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, pruning only what its run owns: a best checkpoint (a name of its
    ``filename``'s, e.g. ``best-{step}``: ``best-*.ckpt``) directly in its own folder. Lightning's
    removes any path its state names in its folder, ``..`` left in: a resumed run restores that state
    from the checkpoint, so an edited or crafted one (naming ``../x``, ``last.ckpt``, ``continue.ckpt``)
    had training delete a file it never wrote. The folder's best checkpoints are its run's own:
    run_folder.refuse_another_run keeps any other run out of the folder."""

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's own: every checkpoint written before keeps this callback's state under it
        return ModelCheckpoint.__qualname__ + super().state_key.removeprefix(type(self).__qualname__)

    def _should_remove_checkpoint(self, trainer, previous: str, current: str) -> bool:
        path = Path(previous)
        own = (path.resolve().parent == Path(self.dirpath).resolve() and path.suffix == self.FILE_EXTENSION
               and path.name.startswith((self.filename or "").split("{")[0]))
        return own and super()._should_remove_checkpoint(trainer, previous, current)


def count_images(batch: dict[str, torch.Tensor]) -> int:
    """Batch size for Lightning's ThroughputMonitor: its ``samples_per_sec`` are images/s."""
    return batch["images"].shape[0]


class SampleGrid(L.Callback):
    """Every ``every_n_steps``: sample ``count`` images, save ``samples/step_XXXXXXX.png``, log to W&B."""

    def __init__(self, every_n_steps: int = 1000, count: int = 8, temperature: float = 1.0,
                 seed: int = 0, at_end: bool = True) -> None:
        self.every_n_steps, self.count, self.temperature, self.seed = every_n_steps, count, temperature, seed
        self.at_end = at_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps > 0 and step > 0 and step % self.every_n_steps == 0:
            self.draw(trainer, pl_module, batch)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.at_end and trainer.global_step > 0:
            self.draw(trainer, pl_module, None)

    @rank_zero_only
    def draw(self, trainer, pl_module, batch) -> None:
        model = pl_module.model
        cfg = model.config
        device = pl_module.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        labels = torch.arange(self.count, device=device) % cfg.num_classes if cfg.num_classes else None
        low_res = None
        if cfg.superres:
            if batch is None:
                return  # super-resolution grids need inputs; the last batch is gone at train end
            low_res = downsample_area(batch["images"][: self.count], cfg.superres.low_res_size)
        count = self.count if low_res is None else low_res.shape[0]
        images = sample(model, count, labels, low_res, self.temperature, generator=generator)
        directory = Path(trainer.default_root_dir) / "samples"
        path = save_grid([images], directory / f"step_{trainer.global_step:07d}.png")
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="samples", images=[str(path)], step=trainer.global_step)


class ContinuationCheckpoint(Checkpoint):
    """Writes ``<dirpath>/continue.ckpt`` after the last update at the peak learning rate of a
    warmup–stable–decay run (``horizon.decay_start``): the one place a new budget can take over
    from this run without repeating or undoing a decay. A ``Checkpoint``: Lightning runs it after
    the other callbacks, BudgetHorizon (which fixes the horizon) among them."""

    def __init__(self, dirpath: str | Path) -> None:
        self.path = Path(dirpath) / CONTINUE

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        horizon = pl_module.horizon
        if pl_module.decay_fraction is None or horizon is None or trainer.global_step != horizon.decay_start:
            return
        pl_module.writing_continuation = True
        try:
            trainer.save_checkpoint(self.path, weights_only=False)  # Lightning's option: all the state
        finally:
            pl_module.writing_continuation = False
        pl_module.print(f"continuation checkpoint {self.path} (step {trainer.global_step}, the last before the "
                        f"decay): train on from it with --resume {self.path} --trainer.max_time ...")
