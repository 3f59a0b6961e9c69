"""Several processes (``--trainer.strategy ddp``): the collective timeout that ends a run whose
process hung or died, and its one line.

A DDP step waits at its gradients' all-reduce for every process. One that hangs (stopped, stuck in
a driver call, its machine gone) would hold the others for torch's default process-group timeout,
30 minutes, of every GPU of the job. ``--collective_timeout`` (seconds) is given to Lightning's
``DDPStrategy(timeout=...)``, which hands it to ``torch.distributed.init_process_group``: a process
that waits longer at a collective fails there (gloo raises; NCCL's watchdog aborts the
communicator), and the run ends in one line (``CollectiveTimeout``) with a non-zero exit status; a
launcher (torchrun, srun, Lightning's own) then ends the processes left.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import torch
from lightning.pytorch.strategies import Strategy, StrategyRegistry

# Long enough for the first step of a compiled model (its compilation, minutes on a GPU, runs in
# every process at once but not in the same time), short against a job's hours.
DEFAULT_COLLECTIVE_TIMEOUT = 600.0


def ddp_with_timeout(strategy, seconds: float) -> Strategy | None:
    """Lightning's strategy named ``strategy`` (``ddp``, ``ddp_find_unused_parameters_true``, ...:
    any registered name with a ``timeout``), made with a collective timeout of ``seconds``; None
    where ``strategy`` is another name or already an object (its own timeout stands)."""
    if not isinstance(strategy, str) or not strategy.startswith("ddp") or strategy not in StrategyRegistry:
        return None
    entry = StrategyRegistry[strategy]  # {"strategy": the class, "init_params": what its name sets}
    return entry["strategy"](**{**entry["init_params"], "timeout": timedelta(seconds=seconds)})


def timed_out(error: BaseException) -> bool:
    """Whether ``error``, or one it was raised from, is a collective's timeout or a peer gone (the
    words gloo and NCCL use for it)."""
    while error is not None:
        if isinstance(error, torch.distributed.DistError) or (
                isinstance(error, RuntimeError) and any(word in str(error) for word in
                                                        ("Timed out", "timed out", "Connection closed by peer",
                                                         "Connection reset by peer"))):
            return True
        error = error.__cause__ or error.__context__
    return False


class CollectiveTimeout(RuntimeError):
    """A process that waited past the collective timeout, or lost a peer: one line, and the
    processes this one started (Lightning's launcher: the others of the machine) ended."""

    def __init__(self, trainer, seconds: float) -> None:
        super().__init__(f"process {trainer.global_rank} of {trainer.world_size} waited for the others at a collective "
                         f"and gave up (--collective_timeout {seconds:g} s, or a process it talks to died): another "
                         "process hung or died, its own log says why; last.ckpt holds the last step written, "
                         "and rerunning the command with --resume auto goes on from it")
        self.launcher = getattr(trainer.strategy, "launcher", None)

    def end_started_processes(self) -> None:
        """End the processes Lightning's launcher started from this one (None under torchrun or srun,
        which end the others themselves), as Lightning does at a Ctrl-C: one of them may be the
        hung one, and would hold its device for ever."""
        if self.launcher is not None:
            self.launcher.kill(signal.SIGKILL)
