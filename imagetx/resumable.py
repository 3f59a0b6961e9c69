"""Exact resumption after a crash (reliability): atomic checkpoint files, ``last.ckpt``
at the step a run stops, and a training order that resumes mid-epoch.

The training order is a function of (seed, epoch) alone; a checkpoint records how far
into the epoch the run was; each batch draws its randomness (dropout, flips) from a
seed of (seed, epoch, batch). A run killed and resumed with ``--resume last`` so ends
bitwise equal, on CPU, to one that was never interrupted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, DistributedSampler

from .checkpoint import CheckpointError, atomic_torch_save
from .data import CIFAR10DataModule


# ----- checkpoints -----------------------------------------------------------------------

class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint to a temporary file and renames it: a kill mid-write never
    leaves a corrupt ``last.ckpt`` behind. Remembers what it wrote (path -> global step)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[str, int] = {}

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if get_filesystem(path).protocol not in ("file", ("file", "local")) and "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_torch_save(checkpoint, path)
        except OSError as error:
            reason = error.strerror or str(error)
            raise CheckpointError(
                f"cannot write checkpoint {path} ({reason}); the previous {Path(path).name}, if any, is intact: "
                "free disk space or choose another --trainer.default_root_dir, then continue with --resume") from error
        self.written[os.path.abspath(path)] = int(checkpoint.get("global_step", -1))


class ImagetxCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that, with ``save_at_stop``, also writes ``last.ckpt`` at the training
    step where the run stops (max_steps, max_time), from inside the loop: such a checkpoint
    resumes exactly mid-epoch, while one written after ``fit`` returns has the epoch marked
    as finished, so Lightning would resume at the start of the next one. For the same reason
    it never writes at ``on_train_end``."""

    def __init__(self, *args, save_at_stop: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.save_at_stop = save_at_stop

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        stopping = trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step
        if self.save_at_stop and stopping and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer, pl_module) -> None:
        pass  # main() writes last.ckpt after fit only when nothing wrote it at the final step


def checkpoint_callbacks(directory: Path, every_n_steps: int) -> list[ModelCheckpoint]:
    """The best checkpoint by ``val/bpd`` (and ``last.ckpt``) at every validation, plus
    ``last.ckpt`` every ``every_n_steps`` optimiser steps (0: only at validations) and at
    the step where training stops.

    Both write real files through the trainer's CheckpointIO (no ``save_last="link"``
    symlinks or copies) and always overwrite ``last.ckpt`` (no ``last-v1.ckpt`` when a
    new run starts in an old directory, which ``--resume last`` would then miss)."""
    return [
        ImagetxCheckpoint(dirpath=directory, filename="best-{step}", monitor="val/bpd", mode="min", save_top_k=1,
                          save_last=True, auto_insert_metric_name=False, enable_version_counter=False),
        ImagetxCheckpoint(dirpath=directory, every_n_train_steps=every_n_steps, every_n_epochs=0, save_top_k=0,
                          save_last=True, enable_version_counter=False, save_at_stop=True),
    ]


# ----- a training order that resumes mid-epoch -------------------------------------------

def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (seed, epoch, batch, ...)."""
    digest = hashlib.blake2b(":".join(map(str, ("imagetx", *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class TrainOrder(DistributedSampler):
    """Every epoch a permutation of the training set drawn from (seed, epoch) alone, shared
    out among processes; ``resume_at`` starts one epoch part-way through.

    A DistributedSampler so that Lightning keeps it under DDP instead of replacing it."""

    def __init__(self, dataset, seed: int, num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self._resume: tuple[int, int] | None = None  # (epoch, samples of this process to skip)

    def resume_at(self, epoch: int, samples: int) -> None:
        self._resume = (epoch, samples)

    def __iter__(self):
        generator = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        order += order[: self.total_size - len(order)]  # pad so every process gets as many
        mine = order[self.rank : self.total_size : self.num_replicas]
        skip = self._resume[1] if self._resume and self._resume[0] == self.epoch else 0
        self._resume = None
        return iter(mine[skip:])


class ResumableLoader(DataLoader):
    """The training DataLoader: knows its place in the epoch (``state_dict``, saved by Lightning
    in every checkpoint) and continues from it after ``load_state_dict``.

    Before fetching batch ``b`` of epoch ``e`` it seeds torch's global RNG with
    (seed, epoch, batch, rank), so random flips and the dropout of that training step are
    the same whether or not the run was interrupted, and whatever ran in between
    (validation, sample grids). With ``num_workers`` > 0, flips happen in the workers,
    whose seeds follow the point where the epoch (re)started."""

    sampler: TrainOrder

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._epoch, self._position = 0, 0

    def __iter__(self):
        return self._batches()  # a generator: nothing happens before the first batch is asked for

    def _batches(self):
        order = self.sampler
        self._epoch = order.epoch
        start = order._resume[1] // self.batch_size if order._resume and order._resume[0] == order.epoch else 0
        self._position = start
        torch.manual_seed(mix_seed(order.seed, order.epoch, start, order.rank, "start"))
        batches = super().__iter__()
        while True:
            torch.manual_seed(mix_seed(order.seed, order.epoch, self._position, order.rank))
            try:
                batch = next(batches)
            except StopIteration:
                return
            self._position += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches": self._position, "batch_size": self.batch_size,
                "seed": self.sampler.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("batch_size") not in (None, self.batch_size):
            raise CheckpointError(
                f"the checkpoint was trained with data.batch_size={state['batch_size']}, this run has "
                f"{self.batch_size}: resume with the same batch size (or start a new run)")
        self._epoch, self._position = state["epoch"], state["batches"]
        self.sampler.resume_at(state["epoch"], state["batches"] * self.batch_size)


class TrainingDataModule(CIFAR10DataModule):
    """CIFAR10DataModule whose training batches come from a ResumableLoader (see above);
    the training order's seed is ``seed_everything``."""

    def train_dataloader(self) -> DataLoader:
        dataset = self.dataset("train")
        trainer = getattr(self, "trainer", None)
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        order = TrainOrder(dataset, seed=seed, num_replicas=replicas, rank=rank)
        return ResumableLoader(dataset, batch_size=self.batch_size, sampler=order, num_workers=self.num_workers,
                               drop_last=False, persistent_workers=self.num_workers > 0)
