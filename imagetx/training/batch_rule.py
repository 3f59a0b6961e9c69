"""The batch rule (docs/experiments.md entry 38): how the peak learning rate and the warm-ups follow the
global batch, so that a recipe set for one GPU runs on many with no other flag.

A recipe names the global batch its ``peak_lr`` and warm-ups were set for (``reference_batch``); a run at
another global batch B (devices x batch x accumulation) scales them by r = B / reference_batch:

* the peak learning rate by r ** ``LR_EXPONENT``;
* every warm-up by 1 / r in steps, the same number of images (what a warm-up protects is Adam's
  first updates, counted in the images its moments average).

Measured on the CPU proxy of entries 33 and 35 at batch 8, 32 and 128 at equal images (entry 38): the
rule holds up to r = ``MEASURED_RATIO``; beyond it the run says that it is extrapolated.
"""

from __future__ import annotations

from dataclasses import dataclass

LR_EXPONENT = 0.0  # entry 38: at equal images a larger batch gained nothing from a larger peak
MEASURED_RATIO = 16  # batch 128 against 8: the largest ratio entry 38 measured


@dataclass(frozen=True)
class BatchRule:
    """The rule for one run: ``reference`` (the recipe's global batch; None: no rule) and ``batch`` (the
    run's; None: not known yet, no rule)."""

    reference: int | None
    batch: int | None

    @property
    def ratio(self) -> float:
        if self.reference is None or self.batch is None:
            return 1.0
        return self.batch / self.reference

    def peak_lr(self, peak_lr: float) -> float:
        return peak_lr * self.ratio ** LR_EXPONENT

    def steps(self, warmup_steps: int) -> int:
        """A warm-up of ``warmup_steps`` at the reference batch, in steps at this one: the same images."""
        return max(round(warmup_steps / self.ratio), 1)

    def described(self, peak_lr: float, warmup_steps: int) -> str | None:
        """The rule's effect in one line, where it changes anything."""
        if self.ratio == 1.0:
            return None
        beyond = ("; beyond the largest ratio measured (16x, docs/experiments.md entry 38): extrapolated"
                  if max(self.ratio, 1 / self.ratio) > MEASURED_RATIO else "")
        return (f"batch rule: global batch {self.batch}, {self.ratio:g}x the recipe's {self.reference}: peak learning "
                f"rate {peak_lr:g} -> {self.peak_lr(peak_lr):.4g}, warm-up {warmup_steps} -> "
                f"{self.steps(warmup_steps)} steps (the same images){beyond}")
