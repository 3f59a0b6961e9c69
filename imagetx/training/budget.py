"""A learning-rate schedule that ends when the time budget does (``trainer.max_time``), on any
machine.

A decay fitted to a step count ends well only on a machine of the speed it was fitted on: on a
slower one the run stops with the learning rate still high, on a faster one it finishes early
and leaves time unused. With a time budget, the horizon is measured instead:

* **Fixed** (``BudgetHorizon.fix``). Training runs at the peak learning rate (after warm-up) until
  the first validation has ended, ``fix_by`` steps have passed or a tenth of the budget has,
  whichever comes first (a short budget on a slow machine may come to neither of the others before
  it ends). By then the steps have been timed, and at a validation the validation and the other
  work between steps (sample grids, checkpoint writes) too, and the step at which the budget runs
  out is fixed: the decay ends there. The cosine starts at once; warmup–stable–decay keeps the
  peak until the run's last ``decay_fraction``. A decay that starts inside the warm-up (a budget
  that holds fewer steps than the warm-up, or not many more) is multiplied by it (``place_decay``).
* **Refitted** (warmup–stable–decay, until its decay starts: ``refit``), at each validation and
  every ``adjust_every`` steps, from the mean time of every step since the run's second
  (validations, grids and checkpoints included): one measurement sees one validation at most, and
  the periodic work it has not seen would leave the budget spent before the decay. Before the
  decay the rate is the peak whatever the horizon, so moving it changes nothing already done.
* **Steered** (warmup–stable–decay, in its decay: ``steer``), every ``adjust_every`` steps (50, or
  a tenth of a shorter decay) and after each validation: its end fitted again from the median of
  the last steps and the time left, the decay going on from the progress it had, so that it ends
  when the budget does whatever a refit could not foresee (one-off costs, a machine that slows
  down or speeds up). The cosine keeps its first fit.

Each horizon fixed or refitted is printed in one line, with its steps (and, where it will be
steered, saying so): the log says where the decay starts, and that its end follows the budget.
The horizon is stored in every checkpoint and a run resumed with the same budget uses it, so
that a cosine ends exactly as an uninterrupted run would (resume.py: another budget); a decay
steered goes on steering.

Kept: Lightning's Timer stops at ``max_time`` but does not end the decay with it; in 14 minutes of
``quick``, a cosine fixed to 3,700 steps cost 0.17 bits/dim, a warmup–stable–decay horizon fitted
once and not refitted 0.55 (docs/training.md, "What training is built from").
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, replace

import lightning as L
from lightning.pytorch.callbacks import Callback, Timer


@dataclass(frozen=True)
class Horizon:
    """The decay of a ``warmup_then_decay`` schedule (schedule.py): from ``decay_start`` (the
    multiplier still 1) to ``end`` (the multiplier 0), in optimiser steps. A decay steered to the
    budget (``BudgetHorizon.steer``) goes on from the progress it had reached at ``steered_at``
    (step, progress) to 1 at its new ``end``, so that the learning rate never jumps."""

    decay_start: int
    end: int
    steered_at: tuple[int, float] | None = None

    def __post_init__(self) -> None:  # a checkpoint's JSON-like copy holds a list
        if self.steered_at is not None:
            object.__setattr__(self, "steered_at", (int(self.steered_at[0]), float(self.steered_at[1])))

    def progress(self, step: int) -> float:
        """How far the decay is at ``step``: 0 at ``decay_start``, 1 from ``end`` on."""
        start, done = self.steered_at or (self.decay_start, 0.0)
        return min(done + (1.0 - done) * max(step - start, 0) / max(self.end - start, 1), 1.0)

    def to_dict(self) -> dict:
        steered = {} if self.steered_at is None else {"steered_at": list(self.steered_at)}
        return {"decay_start": self.decay_start, "end": self.end, **steered}


def place_decay(end: int, earliest: int, warmup_steps: int, first_step: int = 0,
                decay_fraction: float | None = None) -> Horizon:
    """A horizon ending at ``end``, its decay starting at ``earliest`` at the soonest.

    Without ``decay_fraction`` (the cosine) the decay starts as early as it may: where warm-up
    ends, or at ``earliest`` where the warm-up does not fit before ``end``. With it
    (warmup–stable–decay) it takes the last ``decay_fraction`` of this run's steps, those from
    ``first_step`` (0, or the step a continued run started from) to ``end``, wherever the warm-up
    ends: its length follows the run's, so that a horizon refitted one step shorter or longer moves
    its start by a step, not by the warm-up's length.

    A decay that starts inside the warm-up still ends at ``end``: the schedule multiplies the two
    (schedule.warmup_then_decay), and the rate reaches only ``decay_start / warmup_steps`` of the
    peak. Only where no step is left (``end`` at or before ``earliest``) does the horizon pass
    ``end``, by one step."""
    if decay_fraction is not None:
        decay_start = max(earliest, end - round(decay_fraction * (end - first_step)))
    else:
        decay_start = max(earliest, warmup_steps)
        if decay_start >= end:  # the warm-up does not fit: the decay starts within it
            decay_start = earliest
    return Horizon(decay_start, max(end, decay_start + 1))


def described(horizon: Horizon, warmup_steps: int, steered: bool) -> str:
    """The horizon in words, for the line that says each one taken: its steps, how far the warm-up
    has come where a decay starts inside it, and whether its end will follow the budget."""
    within = (f", inside the warm-up of {warmup_steps} steps: the rate rises to "
              f"{horizon.decay_start / warmup_steps:.0%} of the peak by then" if horizon.decay_start < warmup_steps
              else "")
    return (f"the decay runs from step {horizon.decay_start} to {horizon.end}{within}"
            + ("; its end is then steered to the budget's" if steered else ""))


def budget_timer(trainer: L.Trainer | None) -> Timer | None:
    """The Timer that enforces ``trainer.max_time``, or None when the run has no time budget."""
    if trainer is None:
        return None
    return next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)


def run_budget(trainer: L.Trainer) -> dict[str, int | None]:
    """What ends a run: its ``max_steps`` and its ``max_time`` in seconds (None: no time budget).
    Stored in checkpoints: a run resumed with another budget needs another horizon (resume.py)."""
    timer = budget_timer(trainer)
    seconds = None if timer is None else round(timer.time_remaining() + timer.time_elapsed())
    return {"max_steps": trainer.max_steps, "max_time": seconds}


def median_step_seconds(starts: list[float]) -> float:
    """The cost of a step: the median time from one step's start to the next (a validation, a
    grid or a compilation between two steps moves it little)."""
    return statistics.median(b - a for a, b in zip(starts, starts[1:]))


def last_step_in_time(step: int, remaining_seconds: float, seconds_per_step: float, max_steps: int) -> int:
    """The step the time left runs out at, ``step`` updates into the run at ``seconds_per_step``
    each; never past ``max_steps`` (when > 0)."""
    end = step + max(int(remaining_seconds / seconds_per_step), 0)
    return min(end, max_steps) if max_steps > 0 else end


def fit_horizon(step: int, remaining_seconds: float, seconds_per_step: float, overhead_per_step: float,
                warmup_steps: int, max_steps: int, first_step: int = 0,
                decay_fraction: float | None = None) -> Horizon:
    """The horizon that ends the decay when ``remaining_seconds`` run out, ``step`` updates
    into the run: each later step costs ``seconds_per_step`` plus ``overhead_per_step``, the
    share of the periodic work (validations, sample grids, checkpoints) that falls to one step.
    Never past ``max_steps`` (when > 0). The decay starts at update step + 1 at the earliest,
    whose rate the scheduler has already set (to the peak); where, ``place_decay`` says."""
    end = last_step_in_time(step, remaining_seconds, seconds_per_step + overhead_per_step, max_steps)
    return place_decay(end, step + 1, warmup_steps, first_step, decay_fraction)


def wsd_on_budget(trainer: L.Trainer, pl_module) -> bool:
    """Whether the run's schedule is warmup–stable–decay with its horizon on a time budget
    (``lr_horizon: budget`` and a ``max_time``): the one that is refitted before its decay and
    steered in it (BudgetHorizon)."""
    return (pl_module.decay_fraction is not None and pl_module.hparams.lr_horizon == "budget"
            and budget_timer(trainer) is not None)


def agreed_horizon(trainer: L.Trainer, pl_module, remaining_seconds: float, seconds_per_step: float,
                   overhead_per_step: float) -> Horizon | None:
    """``fit_horizon`` at the run's step with the module's schedule settings, the same in every
    process: rank 0's measurement decides. None where rank 0 has no time left (a validation after
    the budget ran out): there is nothing left to fit."""
    horizon = None
    if remaining_seconds > 0:
        horizon = fit_horizon(trainer.global_step, remaining_seconds, seconds_per_step, overhead_per_step,
                              pl_module.hparams.warmup_steps, trainer.max_steps, pl_module.first_step,
                              pl_module.decay_fraction)
    return trainer.strategy.broadcast(horizon, src=0)


# The horizon is fixed at the latest once this share of the budget has passed since the steps
# began to be timed (when neither the first validation nor ``fix_by``'s step count came first):
# a tenth, as ``fix_by``'s tenth of max_steps. It leaves the fit nine tenths of the budget, more than
# warmup–stable–decay's decay takes (its last 20–40 %), and by then a 3-minute run on a busy 2-core
# machine (about 2 s a step) has timed 9 steps.
FIX_BY_BUDGET_SHARE = 0.1
# The fewest step starts a fit or a steering reads: their median needs at least two intervals.
MIN_TIMED_STEPS = 3
# The share of the budget is checked every this many steps, at the same steps in every process:
# under DDP each check is a broadcast of rank 0's verdict (a wait on every process), so not at
# every step; the fix then comes at most 2 steps after the share has passed.
SHARE_CHECK_EVERY = 3


class BudgetHorizon(Callback):
    """Fixes ``ImageTransformerModule.horizon`` from timings, in a run with a time budget
    (docs/model.md §8): at the end of the first validation or, if none has come by then, after
    ``fix_by_step`` steps or a tenth of ``max_steps``, whichever is less (``fix_by``; then only
    the steps themselves are timed, and a validation due at that step still counts), or once a
    tenth of the budget has passed (``FIX_BY_BUDGET_SHARE``), whichever comes first. Steps are
    counted from the run's first (``first_step``: 0, or where a continuation started), and timed
    from the second on (the first includes one-off start-up work, compilation among it): the median
    time from one step's start to the next is the cost of a step; the rest of the time since then
    (the validation, grids, checkpoints) is spread over the steps as overhead. Every decision falls
    at the same step in every process, so that all can take rank 0's measurement.

    Warmup–stable–decay on a budget is then adjusted every ``adjust_every`` steps and after each
    validation: refitted before its decay (``refit``), steered in it (``steer``)."""

    def __init__(self, fix_by_step: int = 200, steer_every: int = 50) -> None:
        self.fix_by_step = fix_by_step
        self.steer_every = steer_every  # the most steps between two adjustments (adjust_every; 0: none)
        self.starts: list[float] = []  # monotonic time at the start of each timed step
        self.since: tuple[int, float] | None = None  # (step, monotonic time) of the first timed step
        self.recent: deque[float] = deque(maxlen=steer_every + 1)  # the decay's last steps' start times

    def forget_timings(self, pl_module) -> None:
        """The model's step cost has changed (a growth, grow.py): a time budget's horizon is fitted
        again from the steps from here on, as at a run's start. A horizon of steps stays."""
        if budget_timer(pl_module.trainer) is not None and pl_module.hparams.lr_horizon == "budget":
            pl_module.horizon = None
        self.starts.clear()
        self.since = None
        self.recent.clear()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step >= pl_module.first_step + 1:
            now = time.monotonic()
            if self.since is None:
                self.since = (trainer.global_step, now)
            if pl_module.horizon is None:
                self.starts.append(now)
            elif self.steers(trainer, pl_module):
                self.recent.append(now)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        # Strictly after: a validation due at step fix_by_step runs after this hook, and its
        # cost belongs in the measurement (the quick presets validate every 200 steps).
        steps = trainer.max_steps - pl_module.first_step if trainer.max_steps > 0 else -1
        if pl_module.horizon is None and (trainer.global_step - pl_module.first_step > self.fix_by(steps)
                                          or self.budget_share_passed(trainer, pl_module)):
            self.fix(trainer, pl_module)
        every = self.adjust_every(pl_module.horizon)
        if every and trainer.global_step % every == 0 and wsd_on_budget(trainer, pl_module):
            if self.steers(trainer, pl_module):
                self.steer(trainer, pl_module)
            else:
                self.refit(trainer, pl_module, periodic=True)

    def fix_by(self, max_steps: int) -> int:
        """The step of the run after which the horizon is fixed without waiting for a validation:
        at most a tenth of the run's ``max_steps`` (-1: none), so that a short run
        (``--trainer.max_steps 200``) still anneals instead of running at the peak until its end,
        which would come first. Never before step 4: ``fix`` needs 3 timed steps (steps 1 to 3)."""
        return self.fix_by_step if max_steps <= 0 else min(self.fix_by_step, max(max_steps // 10, MIN_TIMED_STEPS + 1))

    def budget_share_passed(self, trainer: L.Trainer, pl_module) -> bool:
        """Whether ``FIX_BY_BUDGET_SHARE`` of the budget has passed since the steps began to be
        timed (the time spent since then over that plus the time left), as rank 0's clock says;
        checked every ``SHARE_CHECK_EVERY`` steps. A short budget on a slow machine
        comes to no validation and to no ``fix_by`` step before it ends (3 minutes held 82 steps of
        ``quick``, which validates every 200)."""
        timer = budget_timer(trainer)
        if timer is None or self.since is None or (trainer.global_step - pl_module.first_step) % SHARE_CHECK_EVERY:
            return False
        spent = time.monotonic() - self.since[1]
        passed = spent >= FIX_BY_BUDGET_SHARE * (spent + timer.time_remaining())
        return trainer.strategy.broadcast(passed, src=0)

    def adjust_every(self, horizon: Horizon | None) -> int:
        """Steps between two adjustments of a warmup–stable–decay horizon on a budget (0: none):
        ``steer_every``, or a tenth of a decay shorter than ten times that, so that a short run's
        decay is steered too (a 3-minute run's may span 30 steps); at least ``MIN_TIMED_STEPS``."""
        if horizon is None or self.steer_every <= 0:
            return 0
        return max(min(self.steer_every, (horizon.end - horizon.decay_start) // 10), MIN_TIMED_STEPS)

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            if pl_module.horizon is None:
                self.fix(trainer, pl_module)
            elif self.steers(trainer, pl_module):  # a validation in the decay: its cost counted at once
                self.steer(trainer, pl_module)
            else:
                self.refit(trainer, pl_module)

    def refit(self, trainer: L.Trainer, pl_module, periodic: bool = False) -> None:
        """Warmup–stable–decay before its decay: the horizon again, from the mean cost of every
        step timed so far (the periodic work included, so no overhead is added), said in a line.
        Not for a horizon of steps (``lr_horizon: steps``), which a time budget does not move.

        ``periodic`` (every ``adjust_every`` steps between validations): only a horizon whose decay
        starts earlier is taken. It catches a machine that slowed down before the decay (a short
        run may see no validation before its budget ends). One that starts later is left: the mean
        still holds one-off costs (a resumed run's first validation, a compilation), which weigh
        less at every refit, so that refits taking both would each find a little more time than the
        last and chase the end, the decay starting late and short. A validation's refit takes either."""
        horizon = pl_module.horizon
        if (self.since is None or trainer.global_step >= horizon.decay_start
                or trainer.global_step <= self.since[0] or not wsd_on_budget(trainer, pl_module)):
            return
        step, started = self.since
        seconds_per_step = (time.monotonic() - started) / (trainer.global_step - step)
        refitted = agreed_horizon(trainer, pl_module, budget_timer(trainer).time_remaining(), seconds_per_step, 0.0)
        if refitted is None or refitted == horizon or (periodic and refitted.decay_start >= horizon.decay_start):
            return
        pl_module.horizon = refitted
        pl_module.print(f"learning-rate horizon refitted at step {trainer.global_step}: "
                        f"{described(refitted, pl_module.hparams.warmup_steps, self.steer_every > 0)} "
                        f"({seconds_per_step:.3f} s per step since step {step}, all included)")

    def steers(self, trainer: L.Trainer, pl_module) -> bool:
        """Whether the decay under way is steered to the budget (``steer``): warmup–stable–decay
        with a budget horizon (``lr_horizon: budget`` and a ``max_time``), past its decay's start."""
        horizon = pl_module.horizon
        return (self.steer_every > 0 and horizon is not None and trainer.global_step > horizon.decay_start
                and wsd_on_budget(trainer, pl_module))

    def steer(self, trainer: L.Trainer, pl_module) -> None:
        """Warmup–stable–decay in its decay: the end again, every ``adjust_every`` steps and after
        each validation, from the median time of the last steps and the time left, so that the
        decay ends when the budget does. The fit before the decay cannot know all that is to
        come: a one-off cost (a first validation that compiles its graph), which the mean spreads
        over every later step, would end the decay early and leave the rest of the budget at
        learning rate 0; a sample grid in the decay is the opposite case. The median leaves
        one-off and periodic work out;
        what they cost shows in the time left at the next steering. The rate of update
        ``step + 1`` is already set: the new course starts there, from the progress it had."""
        if len(self.recent) < MIN_TIMED_STEPS:  # the same in every process: each has timed the same steps
            return
        horizon, anchor = pl_module.horizon, trainer.global_step + 1
        end = last_step_in_time(anchor, budget_timer(trainer).time_remaining(), median_step_seconds(list(self.recent)),
                                trainer.max_steps)
        steered = replace(horizon, end=max(end, anchor + 1), steered_at=(anchor, horizon.progress(anchor)))
        steered = trainer.strategy.broadcast(steered, src=0)  # rank 0's measurement decides
        if steered.end != horizon.end:
            pl_module.horizon = steered

    def fix(self, trainer: L.Trainer, pl_module) -> None:
        if pl_module.horizon is not None or len(self.starts) < MIN_TIMED_STEPS:  # every later step: nothing to look up
            return
        timer = budget_timer(trainer)
        if timer is None:
            return
        now = time.monotonic()
        seconds_per_step = median_step_seconds(self.starts)
        overhead = max(now - self.starts[0] - seconds_per_step * len(self.starts), 0.0) / len(self.starts)
        remaining = timer.time_remaining()
        horizon = agreed_horizon(trainer, pl_module, remaining, seconds_per_step, overhead)
        if horizon is None:  # the budget has run out (a validation after the stop): nothing to fit
            return
        pl_module.horizon = horizon
        self.starts.clear()
        steered = self.steer_every > 0 and wsd_on_budget(trainer, pl_module)
        pl_module.print(f"learning-rate horizon fixed at step {trainer.global_step}: "
                        f"{described(horizon, pl_module.hparams.warmup_steps, steered)} ({seconds_per_step:.3f} s "
                        f"per step + {overhead:.3f} s of validations and the rest per step, {remaining:.0f} s of the "
                        f"budget left: this machine reaches about step {horizon.end:,})")
        from .grow import GrowDepth  # here: grow.py imports this module

        for callback in trainer.callbacks:
            said = callback.planned(trainer, pl_module, horizon.end) if isinstance(callback, GrowDepth) else None
            if said is not None:
                pl_module.print(said)
