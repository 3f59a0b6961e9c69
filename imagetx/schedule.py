"""Learning-rate schedules (docs/model.md §8), as multipliers of a peak learning rate.

"noam" (the paper's): lr·d^−½·min(step·w^−1.5, step^−½). Written here as
peak·min(step/w, (w/step)^½), the same curve with peak = lr·(d·w)^−½ reached at
step w; T2T's CIFAR-10 categorical model peaks at ≈3.5e-3.
"""

from __future__ import annotations

import math


def noam(step: int, warmup_steps: int) -> float:
    step = max(step, 1)  # step 0 would give a zero learning rate for the first update
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def warmup_cosine(step: int, warmup_steps: int, total_steps: int) -> float:
    step = max(step, 1)
    if step < warmup_steps:
        return step / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
