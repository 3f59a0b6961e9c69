"""Learning-rate schedules (docs/model.md §8), as multipliers of a peak learning rate.

"noam" (the paper's): lr·d^−½·min(step·w^−1.5, step^−½). Written here as
peak·min(step/w, (w/step)^½), the same curve with peak = lr·(d·w)^−½ reached at
step w; T2T's CIFAR-10 categorical model peaks at ≈3.5e-3.

The other two share one shape: a linear warm-up to the peak, the peak until
``horizon.decay_start``, then a decay to 0 at ``horizon.end`` (budget.py fixes the horizon).
They differ in where the decay starts and how it falls:

* cosine: from the end of warm-up (or from when a time budget was measured), a half cosine;
* warmup–stable–decay (MiniCPM; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
  Beyond Fixed Training Durations"): the decay takes only the run's last ``decay_fraction`` and
  falls as 1 − √progress, the cool-down shape that paper found best. Until the decay, the run
  can be continued at the same learning rate by any later run (continuation.py): the model after
  the decay is the one to use, the state just before it the one to go on from.

Kept as multipliers of torch's stock ``LambdaLR`` (module.py): torch's LinearLR, CosineAnnealingLR and
SequentialLR take their lengths when built, and the horizon is fixed and steered during the run (budget.py).
"""

from __future__ import annotations

import math

from .budget import Horizon


def noam(step: int, warmup_steps: int) -> float:
    step = max(step, 1)  # step 0 would give a zero learning rate for the first update
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def cosine_decay(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def sqrt_decay(progress: float) -> float:
    return 1.0 - math.sqrt(progress)


DECAYS = {"cosine": cosine_decay, "wsd": sqrt_decay}


def warmup_then_decay(step: int, warmup_steps: int, horizon: Horizon | None, decay: str = "cosine",
                      rewarmup: tuple[int, int] | None = None) -> float:
    """Linear warm-up to the peak, the peak until ``horizon.decay_start``, then ``DECAYS[decay]``
    to 0 at ``horizon.end``; at the peak while the horizon is not yet known (budget.py measures it
    early in a run with a time budget). ``rewarmup`` = (first step, length): a second linear
    warm-up, for a run continued without the optimiser's moments (continuation.py).

    A decay that starts inside the warm-up (a budget that holds fewer steps than the warm-up,
    budget.place_decay) multiplies the two, so that the rate still reaches 0 at ``horizon.end``
    and never jumps; a decay after the warm-up (every other horizon) is as before."""
    step = max(step, 1)
    scale = 1.0
    if rewarmup is not None and step < rewarmup[0] + rewarmup[1]:
        scale = max(step - rewarmup[0], 1) / rewarmup[1]
    if step < warmup_steps:
        scale = scale * step / warmup_steps  # in this order, as before: the same floats as every earlier run
    if horizon is None or step <= horizon.decay_start:
        return scale
    return scale * DECAYS[decay](horizon.progress(step))
