"""Learning-rate schedules (docs/model.md §8), as multipliers of a peak learning rate.

"noam" (the paper's): lr·d^−½·min(step·w^−1.5, step^−½). Written here as
peak·min(step/w, (w/step)^½), the same curve with peak = lr·(d·w)^−½ reached at
step w; T2T's CIFAR-10 categorical model peaks at ≈3.5e-3.
"""

from __future__ import annotations

import math

from .budget import Horizon


def noam(step: int, warmup_steps: int) -> float:
    step = max(step, 1)  # step 0 would give a zero learning rate for the first update
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def warmup_cosine(step: int, warmup_steps: int, horizon: Horizon | None) -> float:
    """Linear warm-up to the peak, then a cosine from the peak at ``horizon.decay_start`` to 0
    at ``horizon.end``; at the peak until then, and while the horizon is not yet known
    (budget.py measures it early in a run with a time budget)."""
    step = max(step, 1)
    if step < warmup_steps:
        return step / warmup_steps
    if horizon is None or step <= horizon.decay_start:
        return 1.0
    progress = min((step - horizon.decay_start) / (horizon.end - horizon.decay_start), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
