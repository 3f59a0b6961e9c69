"""Replay a lease's learning-rate horizon on a simulated clock: the callbacks that fit and steer
it (imagetx/training/budget.py) and the schedule they shape, driven step by step with the costs
the lease measured, without training anything.

    .venv/bin/python -m experiments.lease_horizon_replay [--steer_every 50] [--json PATH]

The default costs are `superres_gpu`'s lease 2 (docs/experiments.md entry 28, from
`lineage/superres_gpu/leases/lease_2/`: `metrics.csv` and `train.log`): a 360 s budget continued
from step 5,560, a first step of 44 s (compilation), then 0.0525 s a step; validations every
2,500 steps, the first 25 s (a resumed run's first, with no sanity validation before it), the
others 1 s; a sample grid of 18.6 s at step 10,000. The lease ran 5,191 steps, the last 352 at learning rate 0.
`--steer_every 0` replays the horizon as it was then (no steering of the decay).
Prints one JSON object: the steps the budget held, the decay's start and end, how many updates
ran at learning rate 0, and the last update's multiplier of the peak.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from unittest import mock

from lightning.pytorch.callbacks import Timer

from experiments.json_result import emit
from imagetx.training import budget
from imagetx.training.budget import BudgetHorizon
from imagetx.training.schedule import warmup_then_decay

LEASE_2 = dict(budget=360.0, first_step=5560, first_step_seconds=44.0, step_seconds=0.0525,
               validate_every=2500, first_validation_seconds=25.0, validation_seconds=1.0,
               grids={10_000: 18.6}, warmup_steps=1000, decay_fraction=0.2)


class Clock:
    """A monotonic clock that moves only when the replay says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def replay(steer_every: int = 50, budget_seconds: float = LEASE_2["budget"], first_step: int = LEASE_2["first_step"],
           first_step_seconds: float = LEASE_2["first_step_seconds"], step_seconds: float = LEASE_2["step_seconds"],
           validate_every: int = LEASE_2["validate_every"],
           first_validation_seconds: float = LEASE_2["first_validation_seconds"],
           validation_seconds: float = LEASE_2["validation_seconds"], grids: dict | None = None,
           warmup_steps: int = LEASE_2["warmup_steps"], decay_fraction: float = LEASE_2["decay_fraction"]) -> dict:
    """One run from ``first_step`` (a continuation: the warm-up again, as a lease's) until the
    budget is spent, in the order Lightning calls things: the batch-start hook, the step, the
    scheduler setting the next update's rate, the batch-end hooks (a sample grid among them),
    then a validation when one is due. Returns the figures the module docstring lists and
    ``multipliers``, each update's multiplier of the peak."""
    grids = LEASE_2["grids"] if grids is None else grids
    clock = Clock()
    timer = Timer(duration=dict(seconds=budget_seconds))
    timer.time_remaining = lambda *args: max(budget_seconds - clock.now, 0.0)
    trainer = SimpleNamespace(callbacks=[timer], global_step=first_step, max_steps=-1, sanity_checking=False,
                              strategy=SimpleNamespace(broadcast=lambda value, src: value))
    module = SimpleNamespace(horizon=None, first_step=first_step, decay_fraction=decay_fraction, print=lambda *a: None,
                             hparams=SimpleNamespace(warmup_steps=warmup_steps, lr_horizon="budget"))
    callback = BudgetHorizon(steer_every=steer_every)
    rewarmup = (first_step, warmup_steps)

    def rate(update: int) -> float:
        return warmup_then_decay(update, warmup_steps, module.horizon, "wsd", rewarmup)

    multipliers: dict[int, float] = {}
    next_rate = rate(first_step + 1)
    validations = 0
    with mock.patch.object(budget, "time", clock):
        while clock.now < budget_seconds:
            step = trainer.global_step
            callback.on_train_batch_start(trainer, module, None, step)
            clock.now += first_step_seconds if step == first_step else step_seconds
            multipliers[step + 1] = next_rate
            trainer.global_step = step + 1
            next_rate = rate(step + 2)
            callback.on_train_batch_end(trainer, module, None, None, step)
            clock.now += grids.get(trainer.global_step, 0.0)
            if trainer.global_step % validate_every == 0:
                clock.now += first_validation_seconds if validations == 0 else validation_seconds
                validations += 1
                callback.on_validation_end(trainer, module)
    horizon = module.horizon
    return {"steer_every": steer_every, "first_step": first_step, "last_step": trainer.global_step,
            "decay_start": horizon.decay_start, "decay_end": horizon.end,
            "updates_at_rate_0": sum(1 for value in multipliers.values() if value == 0.0),
            "last_multiplier": multipliers[trainer.global_step], "multipliers": multipliers}


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steer_every", type=int, default=50, help="steps between steerings of the decay (0: none)")
    parser.add_argument("--json", help="also write the result to this file")
    options = parser.parse_args(args)
    result = replay(options.steer_every)
    result.pop("multipliers")
    emit(result, options.json)


if __name__ == "__main__":
    main()
