"""Train/eval mode owned by the function that needs it: scoring runs with dropout off
whatever mode its caller left the model in, and hands the model back in that mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the block; its own mode, and that of each submodule,
    restored after it (also when the block raises)."""
    modes = {sub: sub.training for sub in module.modules()}
    module.eval()
    try:
        yield module
    finally:
        for sub, training in modes.items():
            sub.training = training
