"""The CPU threads of a training run from the command line: torch's intra-op threads, one per core
that other jobs leave free, said in one line.

On a machine shared with other jobs, a step spread over more threads than there are free cores
waits at every operation for the thread that has no core. Measured on this project's 2-core CPU
(the ``quick`` preset's training step, batch 8, 1 and 2 threads interleaved in one process):
beside two other training runs (load 3-5), 1 thread trained at 22 images/s and 2
threads at 3-5. Alone on the machine 2 threads are the faster: 14 minutes of ``quick`` took
2,876-3,080 steps on 2 threads, 2,223-2,269 on 1 thread beside another 1-thread run
(docs/results.md). Decoding, whose steps are much smaller, always takes one thread
(``DECODING_THREADS`` in imagetx/model/sampler.py).

So training takes the cores it may run on, less those the other jobs keep busy (the 1-minute load
average, less this process's own share of it), at least one, never more than torch's own count.
Decided once, at the start: the thread count changes the order of a step's float sums, so a run
keeps one count (and a run resumed at another load may take another, ending within rounding of
the run it continues rather than bitwise).

The user's setting wins: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment (which
torch reads itself), and a Python caller's ``torch.set_num_threads`` (only the command line
chooses: ``imagetx.train.main(args)`` from Python leaves torch's threads as its caller set them).

Kept: Lightning leaves torch on every core: beside two other runs, 2 threads trained at 3-5 images/s
where 1 thread trained at 22 (above; docs/training.md).
"""

from __future__ import annotations

import math
import os
import time

import torch

from ..model.sampler import THREADS_ASKED_BY

# The 1-minute load average decays with this time constant (seconds): a process that has been
# running for t seconds adds 1 - exp(-t / LOAD_WINDOW_SECONDS) to it.
LOAD_WINDOW_SECONDS = 60.0
# Load from other jobs below this share of a core (a shell, a monitor, a job that mostly sleeps)
# leaves that core free: rounding it up would cost an idle machine its second thread.
IDLE_SHARE = 0.25


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def own_load() -> float:
    """This process's share of the 1-minute load average so far: it has run (imports, reading the
    data) for about its CPU time, on one thread."""
    return 1.0 - math.exp(-time.process_time() / LOAD_WINDOW_SECONDS)


def free_cores(cores: int, others: float) -> int:
    """The cores that ``others`` (the load of other jobs) leave free, at least one."""
    return max(cores - math.ceil(others - IDLE_SHARE), 1)


def choose_training_threads(processes: int = 1) -> str:
    """Set torch's threads for training on the CPU, as the module says, with ``processes`` training
    processes on this machine (DDP on the CPU) sharing the free cores. Returns the line that says
    what was done."""
    asked = {name: os.environ[name] for name in THREADS_ASKED_BY if os.environ.get(name)}
    if asked:
        setting = ", ".join(f"{name}={value}" for name, value in asked.items())
        return f"CPU threads: {torch.get_num_threads()}, as {setting} says"
    cores, current = usable_cores(), torch.get_num_threads()
    others = max(os.getloadavg()[0] - own_load(), 0.0) if hasattr(os, "getloadavg") else 0.0
    threads = min(max(free_cores(cores, others) // processes, 1), current)
    if threads != current:
        torch.set_num_threads(threads)
    return (f"CPU threads: {threads} of {cores} cores (other jobs' load {others:.1f}: a step on more threads than "
            "there are free cores waits for the busy ones; OMP_NUM_THREADS=N sets the count)")
