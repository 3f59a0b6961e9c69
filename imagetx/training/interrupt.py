"""Stopping a training run by a signal without losing a step (``train.run_training``).

SIGINT (Ctrl-C), SIGTERM (what SLURM, Kubernetes and cloud preemption send, and torchrun passes on)
and SIGUSR1 (SLURM's usual warning before a time limit: ``#SBATCH --signal=SIGUSR1@90``) only ask
to stop. The step under way ends; at that step boundary every process agrees on the stop (one
small collective a step, where there are several); ``LastCheckpoint`` writes ``last.ckpt`` there,
once, atomically; and the command ends with one ``stopped:`` line and exit status 128 + the
signal's number (130, 143, 138), so that a scheduler, torchrun or a retry loop reads a stop, not a
success. Rerunning the same command with ``--resume auto`` goes on exactly. Under SLURM with
Lightning's ``SLURMEnvironment(auto_requeue=True)`` (its default there), a stop by the
environment's requeue signal requeues the job once the checkpoint is written (``requeue``).

Where no step is under way whose result could be kept, a stop signal ends the run at once (its
handler raises ``StopRequested``, as Python's own raises KeyboardInterrupt): before the first step,
during the sanity check, during a validation (``LastCheckpoint`` has written the step before it) and
during a step that compiles the network (a compiled run's first step, the first after a growth): a
signal there waited minutes (the recipe's final validation on a CPU: an hour). Checkpoints are
written only outside those windows, so a write is never cut: a signal during one is answered at the
next step's end or validation. Under several processes each process ends on its own there (a
scheduler signals every process); one that then finds a peer gone ends with the same ``stopped:`` line.

A second Ctrl-C stops at once, inside the step, with ``last.ckpt`` as last written: a checkpoint
taken inside a step would hold a batch drawn from the training order but not trained on. A second
SIGTERM changes nothing (torchrun passes on to its workers the SIGTERM they may have had already).

Kept: Lightning's own SIGTERM handler (trainer/connectors/signal_connector.py, 2.6) broadcasts from
inside the signal handler, which deadlocked 4 of 5 two-process runs with a rank in the training
step's all-reduce, writes no checkpoint and ends the run with exit status 0; it is replaced once
Lightning has set it (``on_sanity_check_start``, ``on_train_start``), and Lightning puts back the
handler it found, this one, when fit ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class StopRequested(BaseException):
    """Raised at the start of the validation Lightning runs at a stop, to skip it: a preempted
    process has seconds left (SLURM's warning, Kubernetes' grace period), not a validation's worth;
    and by the signal handler where the run stops at once. A BaseException, as KeyboardInterrupt is:
    torch.compile, the data loader and Lightning's hooks catch Exception and would go on."""


class StopSignals(Callback):
    """Turns a stop signal into a stop at the end of the step under way, agreed by every process.

    ``signum``: the first stop signal this process received; ``agreed``: the one every process
    stops for (the highest number any received), once agreed; ``step``: the step at which a second
    Ctrl-C stopped the run inside a step (Lightning's KeyboardInterrupt); ``at_once``: where the run
    is, in words, while a signal ends it at once (None: inside the training, where it ends the step);
    ``during``: those words where a signal ended it so."""

    STARTING = "while starting"

    def __init__(self) -> None:
        self.signum: int | None = None
        self.agreed: int | None = None
        self.step: int | None = None
        self.at_once: str | None = self.STARTING  # nothing trained yet: nothing to keep
        self.during: str | None = None
        self.layers: int | None = None  # the network's layers at the last step's end (a growth changes them)
        self.previous: dict[int, object] = {}  # the handlers found before ``install``

    def request(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.at_once is not None:
            self.stop_now()
        if signum == signal.SIGINT:  # a second Ctrl-C: Python's handler, a KeyboardInterrupt in the step
            previous = self.previous.get(signal.SIGINT)
            signal.signal(signal.SIGINT, previous if callable(previous) else signal.default_int_handler)

    def install(self) -> None:
        """This callback's handler for every stop signal (from the main thread only: Python's rule)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            if signum == signal.SIGINT and self.signum == signal.SIGINT:
                continue  # Ctrl-C was pressed once already: the next one stops at once
            if signal.getsignal(signum) != self.request:
                self.previous.setdefault(signum, signal.getsignal(signum))
                signal.signal(signum, self.request)

    def restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self.previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    # Lightning sets its SIGTERM handler after restoring the checkpoint, just before the sanity check
    # and the training loop: this one goes back in its place.
    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self.install()
        self.at_once = "in the sanity check"

    def on_train_start(self, trainer, pl_module) -> None:
        self.install()

    def stop_now(self) -> None:
        """End the run here, once: a signal during the teardown that follows only records itself."""
        self.during, self.at_once = self.at_once, None
        raise StopRequested

    def on_sanity_check_end(self, trainer, pl_module) -> None:
        self.at_once = self.STARTING

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        # From the first batch on, not from on_validation_start: LastCheckpoint writes the step before
        # the validation there (a Checkpoint: after this callback).
        if trainer.sanity_checking:
            return
        final = trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step
        self.at_once = "in the final validation" if final else "in validation"
        if self.signum is not None and self.agreed is None:
            self.stop_now()  # received since the step ended, while last.ckpt was being written

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.at_once = None  # the validation's results and checkpoints are kept: a stop waits for them

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # a step ends and is kept (even the first, where nothing is compiled), unless it compiles
        self.at_once = "in a step that compiles the network" if compiles(pl_module, self.layers) else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.at_once, self.layers = None, count_layers(pl_module)  # a finished step: kept, at its end
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # inside an accumulation: a stop waits for the optimiser step
        received = self.signum or 0
        if trainer.world_size > 1:  # the same decision on every process, at the same step
            received = int(trainer.strategy.reduce(torch.tensor(received, device=pl_module.device), reduce_op="max"))
        if received:
            self.agreed = received
            trainer.should_stop = True  # LastCheckpoint (a Checkpoint: run after this) writes last.ckpt here
            rank_zero_info(f"{signal.Signals(received).name} received: stopping after step {trainer.global_step}, "
                           "writing last.ckpt")

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.agreed is not None:
            raise StopRequested

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt):
            self.step = trainer.global_step


def count_layers(pl_module) -> int | None:
    layers = getattr(getattr(pl_module, "model", None), "layers", None)
    return None if layers is None else len(layers)


def compiles(pl_module, layers_before: int | None) -> bool:
    """Whether the step about to run compiles the network: a compiled network's first step in this
    process (``layers_before`` None), or its first after a growth changed its layers (traced anew)."""
    hparams = getattr(pl_module, "hparams", {})
    if not hparams.get("compile"):
        return False
    return layers_before is None or layers_before != count_layers(pl_module)


@contextmanager
def stop_signals_end_the_step(stop: StopSignals) -> Iterator[None]:
    """``stop``'s handlers inside the block (set again by the callback once Lightning has set its own),
    the handlers found before it after it."""
    stop.install()
    try:
        yield
    finally:  # Lightning ignores Ctrl-C once it has caught one (SIG_IGN): undone here too
        stop.restore()


def requeue(trainer, signum: int) -> str | None:
    """Requeue the SLURM job this run is part of when ``signum`` is the requeue signal of Lightning's
    ``SLURMEnvironment`` with ``auto_requeue`` on (its default under SLURM), as Lightning would have:
    ``scontrol requeue JOB``, from the first process, after the checkpoint is written. Returns what
    was done, in words, or None where nothing was to be done."""
    environment = getattr(trainer.strategy, "cluster_environment", None)  # a strategy of several processes
    if environment is None and SLURMEnvironment.detect():  # one process: Lightning's default under SLURM
        environment = SLURMEnvironment()
    if not isinstance(environment, SLURMEnvironment) or not environment.auto_requeue:
        return None
    if signum != (environment.requeue_signal or signal.SIGUSR1) or not trainer.is_global_zero:
        return None
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array_job}_{array_task}" if array_job and array_task else os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if not job:
        return "SLURM job not requeued: no SLURM_JOB_ID in the environment; resubmit the same command"
    if scontrol is None:
        return f"SLURM job {job} not requeued: scontrol not found; resubmit the same command"
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        return f"SLURM job {job} not requeued (scontrol: {done.stderr.strip() or done.returncode}); resubmit it"
    return f"SLURM job {job} requeued: it reruns this command"
