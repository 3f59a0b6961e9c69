"""Non-finite training steps (docs/model.md §8): decided on the device every step, read on the
host only at logging steps, before every checkpoint and at the end of training.

A step whose loss or gradients hold a NaN or an infinity is skipped where it happens, on the
device: the optimiser is told through ``optimizer.found_inf`` (the attribute torch's GradScaler
sets for fused optimisers), and torch's fused Adam and AdamW then leave the parameters, their
moments and the step count as they were. ``NonFiniteSteps`` notes the step in a few device
counters; ``read`` takes them to the host (one read) and stops the run, naming the step, once
more steps were skipped than allowed. Weights that are not finite are never saved either way
(``non_finite_tensors`` before every checkpoint).

Kept: Lightning skips no step. ``detect_anomaly`` (autograd's anomaly mode, slow on every step) raises
at the first NaN of a backward, EarlyStopping's ``check_finite`` stops only at a check, after the update
has made the weights NaN; here the step is skipped on the device, read at logging steps (docs/model.md §8;
tests/training/test_host_reads.py)."""

from __future__ import annotations

from enum import IntEnum

import torch
from torch import Tensor


class NonFiniteLossError(FloatingPointError):
    """The training loss, the gradients or the weights became NaN or infinite."""


def non_finite_tensors(state: dict[str, Tensor]) -> list[str]:
    """Names of the floating-point tensors in ``state`` holding a NaN or an infinity (one read)."""
    names = [name for name, value in state.items() if torch.is_tensor(value) and value.is_floating_point()]
    if not names:
        return []
    finite = torch.stack([torch.isfinite(state[name]).all() for name in names]).cpu()
    return [name for name, ok in zip(names, finite.tolist()) if not ok]


class StepKind(IntEnum):
    """What a noted step had: its loss's value, or (a finite loss) its gradients. Integers, so
    that the device can count them; 0 is none."""

    LOSS_NAN = 1
    LOSS_INF = 2
    LOSS_MINUS_INF = 3
    GRADIENTS = 4

    def __str__(self) -> str:
        return {StepKind.LOSS_NAN: "training loss is nan", StepKind.LOSS_INF: "training loss is inf",
                StepKind.LOSS_MINUS_INF: "training loss is -inf", StepKind.GRADIENTS: "gradients are not finite"}[self]


def gradients_not_finite(parameters) -> Tensor:
    """0-d bool on the device: whether any gradient of ``parameters`` holds a NaN or an infinity
    (one norm over them all, read by no one on the host)."""
    return ~torch.isfinite(torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None]))


def step_kind(loss: Tensor) -> Tensor:
    """0-d long: the ``StepKind`` of a step with this loss, were it not finite (computed on the device)."""
    inf = float("inf")
    return torch.where(loss.isnan(), StepKind.LOSS_NAN,
                       torch.where(loss == inf, StepKind.LOSS_INF,
                                   torch.where(loss == -inf, StepKind.LOSS_MINUS_INF, StepKind.GRADIENTS)))


class NonFiniteSteps:
    """The non-finite steps since the last ``read``, on the device: (count, the first one's step
    and kind, the step and kind of the one that went past the limit).

    ``skipped``: the steps skipped before, read and allowed (saved in checkpoints); ``limit``:
    how many may be skipped (``max_nonfinite_skips``; 0 stops at the first); ``option``: the
    command-line option that sets the limit, which the messages name."""

    def __init__(self, limit: int, skipped: int = 0, option: str = "--model.max_nonfinite_skips") -> None:
        self.limit, self.skipped, self.option = limit, skipped, option
        self.pending: Tensor | None = None

    def note(self, found: Tensor, step: int, kind: Tensor) -> None:
        """Count optimiser step ``step`` if ``found`` (0-d bool on the device): no host read."""
        found = found.long()
        if self.pending is None:  # count, first step, its kind, the step past the limit, its kind
            self.pending = torch.zeros(5, dtype=torch.long, device=found.device)
        pending = self.pending
        count = pending[0] + found
        first = found * (pending[0] == 0)
        past_limit = found * (self.skipped + count == self.limit + 1)
        self.pending = pending + torch.stack([found, first * step, first * kind, past_limit * step, past_limit * kind])

    def read(self) -> str | None:
        """Take the counters to the host (one read) and start them afresh: raise
        NonFiniteLossError if a step went past the limit; else a warning naming the steps
        skipped since the last read, or None."""
        if self.pending is None:
            return None
        count, first_step, first_kind, over_step, over_kind = self.pending.tolist()
        self.pending = None
        if over_step:
            if self.limit:
                why = f"{self.limit} such steps were skipped already, the limit set by {self.option} {self.limit}"
            else:
                why = f"{self.option} N would skip up to N such steps"
            raise NonFiniteLossError(f"{StepKind(over_kind)} at step {over_step}; training stopped ({why})")
        if not count:
            return None
        self.skipped += count
        if count == 1:
            steps = f"at step {first_step}: step skipped"
        else:
            steps = f"at step {first_step} and {count - 1} more non-finite step(s) after it: steps skipped"
        return f"{StepKind(first_kind)} {steps} ({self.skipped} of {self.option.lstrip('-')}={self.limit})"
