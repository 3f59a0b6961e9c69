"""Seeds drawn from the run's seed, so that a run resumed mid-epoch draws what an
uninterrupted one would: the training order of each epoch (data/datamodule.py, ``TrainOrder``) and
the dropout of each training step (training/module.py)."""

from __future__ import annotations

import hashlib
import os


def mix_seed(*parts: int | str) -> int:
    """A well-spread 63-bit seed from integers (seed, epoch, batch, ...)."""
    digest = hashlib.blake2b(":".join(map(str, ("imagetx", *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def run_seed() -> int:
    """The run's ``seed_everything`` (Lightning keeps it in ``PL_GLOBAL_SEED``)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
