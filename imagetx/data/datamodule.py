"""Training data: the DataModule and the training order that a resumed run continues mid-epoch.

The images come from ``imagetx/data/sources/`` (``--data.source cifar10|imagenet|folder``); the
options naming them are ``options.DataOptions``'s.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from .images import CROPS, FILTERS
from .options import DataOptions
from .seeding import mix_seed, run_seed
from .sources import DataError, Reader, check_fits, default_root, tensors
from .transforms import COUNT, TransformDraw, apply


class ImageDataset(Dataset):
    """In-memory images and labels; items are dicts so every consumer names what it takes
    (no ``labels`` for unlabelled images).

    A key is an index, or ``(index, flip)`` or ``(index, flip, transform)`` from ``TrainOrder``: the
    flips and transforms come with the training order, so they draw nothing from the RNG while batches
    are fetched. An item with a transform holds its id (``transforms``, data/transforms.py), flipped first."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key: int | tuple[int, bool] | tuple[int, bool, int]) -> dict[str, torch.Tensor]:
        index, flip, *transform = key if isinstance(key, tuple) else (key, False)
        image = self.images[index]
        item = {"images": image.flip(1) if flip else image}
        if transform:
            item["images"] = apply(item["images"], transform[0])
            item["transforms"] = torch.tensor(transform[0])
        if self.labels is not None:
            item["labels"] = self.labels[index]
        return item


class TrainOrder(DistributedSampler):
    """Every epoch a permutation of the training set, which images of it are flipped and (with
    ``transforms``, a ``TransformDraw``) each image's transform, drawn from (seed, epoch) alone and shared
    out among processes. The transforms are drawn after the flips, which stay as without them.

    Its state (epoch, samples of this process taken) travels in every checkpoint through
    torchdata's StatefulDataLoader; a loaded state sets the epoch and resumes it where it
    stopped, or, when the epoch was finished, starts the next one (as Lightning does).
    A DistributedSampler, so that Lightning keeps it under DDP."""

    def __init__(self, dataset, seed: int, random_flip: bool = False, num_replicas: int = 1, rank: int = 0,
                 transforms: TransformDraw | None = None) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.random_flip, self.transforms = random_flip, transforms
        self.taken = 0
        self.resume: tuple[int, int] | None = None  # (epoch, samples to skip)
        self.next_epoch_loaded = False  # the loaded state was that of a finished epoch

    STATE_KEYS = {"epoch", "samples", "replicas", "finished"}  # state_dict's (older checkpoints: no "finished")

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples": self.taken, "replicas": self.num_replicas,
                "finished": self.taken >= len(self)}

    @staticmethod
    def refuse_another_share(state: dict[str, int], replicas: int, finished: bool) -> None:
        """A place (``state_dict``) in the middle of an epoch is a count of each process's share, which
        another number of processes does not continue (images would be repeated or skipped): refused
        in one line. At an epoch's end any number goes on exactly: the next epoch is shared out afresh."""
        written_by = state.get("replicas", replicas)  # older checkpoints: taken as this run's
        if written_by != replicas and state["samples"] and not finished:
            raise DataError(f"the checkpoint was written by a run of {written_by} processes in the middle of an "
                            f"epoch, this run has {replicas}: resume with {written_by} (devices x nodes), "
                            "or from a checkpoint at an epoch's end")

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The place of a checkpoint (``state_dict``): the epoch resumed where it stopped, or the next
        one started where it had finished; refused mid-epoch for another number of processes."""
        epoch, taken = state["epoch"], state["samples"]
        replicas = state.get("replicas", self.num_replicas)
        finished = taken >= -(-len(self.dataset) // replicas)  # each process's share of an epoch, rounded up
        self.refuse_another_share(state, self.num_replicas, finished)
        self.next_epoch_loaded = taken >= len(self) or finished
        if self.next_epoch_loaded:
            epoch, taken = epoch + 1, 0
        self.set_epoch(epoch)
        self.resume = (epoch, taken)

    def __iter__(self):
        # A generator: nothing is read before the first batch is asked for, and Lightning
        # sets the epoch after it has created the iterator.
        generator = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.dataset), generator=generator).tolist()
        flips = (torch.rand(len(order), generator=generator) < 0.5).tolist()
        transforms = self.transforms(len(order), generator) if self.transforms else None
        order += order[: self.total_size - len(order)]  # pad so every process gets as many
        mine = order[self.rank : self.total_size : self.num_replicas]
        skip = self.resume[1] if self.resume and self.resume[0] == self.epoch else 0
        self.resume, self.taken = None, skip
        for index in mine[skip:]:
            self.taken += 1
            flip = self.random_flip and flips[index]
            yield (index, flip) if transforms is None else (index, flip, transforms[index])


def check_processes(checkpoint: dict, replicas: int) -> None:
    """``checkpoint``'s place in the training order resumable by ``replicas`` processes, or its DataError
    before any process starts: raised inside the fit, the refusal was buried in Lightning's teardown's
    traceback (a requeue on another number of GPUs). The place is TrainOrder's state, found by its keys
    wherever the loader's state (Lightning's, torchdata's) holds it; an older one, without "finished",
    is checked when the order loads it."""
    pending = [checkpoint.get("loops")]
    while pending:
        item = pending.pop()
        if isinstance(item, dict) and item.keys() == TrainOrder.STATE_KEYS:
            TrainOrder.refuse_another_share(item, replicas, bool(item["finished"]))
        elif isinstance(item, dict | list | tuple):
            pending.extend(item.values() if isinstance(item, dict) else item)


class TrainLoader(StatefulDataLoader):
    """torchdata's StatefulDataLoader over a ``TrainOrder``.

    A state taken at an epoch's last batch is resumed by Lightning at the start of the
    next epoch, which torchdata would go on counting from the finished one (its counts
    then differ from an uninterrupted run's; meta-pytorch/data#1437): the order keeps its
    place (the next epoch, from its start) and the loader starts afresh."""

    sampler: TrainOrder

    def __init__(self, *args, **kwargs) -> None:
        # torchdata 0.11 calls torch.set_vital here, which newer torch versions deprecate:
        # harmless, and otherwise said on every training run.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            super().__init__(*args, **kwargs)

    def __iter__(self):
        iterator = super().__iter__()  # loads a pending state into the order
        if self.sampler.next_epoch_loaded:
            self.sampler.next_epoch_loaded = False
            self.load_state_dict({})
            iterator = super().__iter__()
        return iterator


class ImageDataModule(L.LightningDataModule):
    """The training (``train``/``val``) and test (``test``) splits of one data source.

    Training batches come from a ``TrainLoader`` over a ``TrainOrder``, whose position
    Lightning saves in every checkpoint: a run resumed with ``--resume`` continues
    the epoch exactly where it stopped. Evaluation loaders keep the split's order and
    drop nothing: bits/dim is averaged over every image. A folder is converted in
    ``prepare_data`` (once per machine, before the other processes read it); every split
    read is checked against the model (``FROM_MODEL``: its image size and classes)."""

    # What the model decides about the data: imagetx.train links these from the model's
    # config (train.py), so they are never set twice.
    FROM_MODEL = ("image_size", "num_classes", "num_transforms")

    def __init__(
        self,
        root: str | None = DataOptions.root,
        source: Literal["cifar10", "imagenet", "folder", "litdata"] = DataOptions.source,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        val_size: int | None = None,
        num_workers: int = 0,  # data sits in memory; workers only add start-up cost on small machines
        random_flip: bool = False,  # the paper trains without augmentation
        transforms: str | None = None,
        identity_probability: float | None = None,
        download: bool = True,
        image_size: int | None = None,
        num_classes: int | None = None,
        num_transforms: int | None = None,
        crop: Literal[CROPS] = DataOptions.crop,
        resize: Literal[tuple(FILTERS)] = DataOptions.resize,
        cache: str | None = DataOptions.cache,
        rebuild: bool = DataOptions.rebuild,
    ) -> None:
        """
        Args:
            root: data folder (default: $IMAGETX_DATA, else ./data)
            source: cifar10 (npz shards or torchvision's folder), imagenet (downsampled ImageNet's batch
                files, pickle or npz), folder (PNG/JPEG files, converted once to npz shards) or litdata (a
                source written in LitData's format by python -m imagetx.data.streaming, local or remote,
                streamed: an optional extra); docs/data.md
            batch_size: training images per device and step
            eval_batch_size: validation and test images per batch (default: batch_size)
            val_size: training images held out for validation, the last ones (default: 5000 for cifar10; 0 for
                imagenet, which validates on the official validation set; for a folder a tenth, at most 5000)
            num_workers: DataLoader worker processes
            random_flip: flip training images left-right at random (the paper does not)
            transforms: distribution augmentation (data/transforms.py): transform each training image by one of
                a set, given to the model as a conditioning input: factors of rotations, transposition, channels
                joined by + (e.g. rotations+channels); None: none (validation and test never transform)
            identity_probability: with transforms: the identity's probability, the set's others sharing the rest
                equally (None: every transform of the set equally likely, the identity too)
            download: cifar10: download through torchvision when the data is missing
            image_size: the model's image side (imagetx.train sets it from --model.config.image_size): a folder
                is converted to it, other data must hold images of that side; None: a folder is converted to
                32 and other data is not checked
            num_classes: the model's classes (imagetx.train sets it from --model.config.num_classes; 0: an
                unconditional model); the data must have as many; None: not checked
            num_transforms: the model's transform ids (imagetx.train sets it from --model.config.num_transforms;
                0: it takes none), which transforms needs; None: not checked
            crop: folder: center (the largest centred square) or celeba (CelebA's centred 138x138 face box)
            resize: folder: the filter that resizes the crop: area (each pixel the mean of the area it covers) or
                bilinear, bicubic, lanczos (for enlarging)
            cache: folder: where the converted shards go (default: <root>/.imagetx-cache)
            rebuild: folder: convert again, replacing an earlier conversion
        """
        super().__init__()
        # Paths given from Python are kept as strings: the hyper-parameters go into every checkpoint,
        # which is read weights-only (plain data only, checkpoint.py), and a Path there is refused.
        root, cache = (str(path) if path is not None else None for path in (root, cache))
        self.save_hyperparameters()
        self.source, self.root = source, Path(root) if root else default_root()
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.val_size, self.num_workers, self.random_flip, self.download = val_size, num_workers, random_flip, download
        self.image_size, self.num_classes = image_size, num_classes
        if transforms is None and identity_probability is not None:
            raise DataError("--data.identity_probability: give --data.transforms too (the identity's share of them)")
        self.transforms = None if transforms is None else TransformDraw(transforms, identity_probability)
        if self.transforms and num_transforms is not None and num_transforms < COUNT:
            raise DataError(f"--data.transforms {transforms} gives the model a transform id per image, but it has "
                            f"num_transforms={num_transforms}: set --model.config.num_transforms {COUNT}")
        self.crop, self.resize, self.cache, self.rebuild = crop, resize, cache, rebuild
        self.reader: Reader | None = None
        self.datasets: dict[str, ImageDataset] = {}
        # Where val_size was set, for the message that refuses one the data cannot hold: imagetx.train
        # names the file when a --config file set it.
        self.val_size_from = "--data.val_size"

    def make_reader(self, rebuild: bool) -> Reader:
        return Reader(self.source, self.root, self.val_size, self.image_size, self.download, self.crop, self.resize,
                      self.cache, rebuild, self.val_size_from)

    def prepare_data(self) -> None:
        """Lightning calls this in one process per machine before ``setup``: a folder is
        converted (or rebuilt) here, never by several processes at once. (A stream has nothing to prepare.)"""
        if self.source == "litdata":
            return
        self.reader = self.make_reader(self.rebuild)
        self.reader.prepare()

    def dataset(self, split: str) -> ImageDataset:
        if self.source == "litdata":
            return self.streamed(split)
        if split not in self.datasets:
            if self.reader is None:  # prepare_data ran in another process (DDP), or not at all (direct use)
                alone = self.trainer is None or self.trainer.world_size == 1
                self.reader = self.make_reader(self.rebuild and alone)
            data = self.reader.split(split)
            check_fits(data, self.image_size, self.num_classes)
            self.datasets[split] = ImageDataset(*tensors(data))
        return self.datasets[split]

    def values_checked_for(self, num_classes: int) -> bool:
        """Whether every batch holds values a model with ``num_classes`` classes (0: unconditional,
        it reads no labels) takes, checked once as each split was read (``check_fits``: uint8
        images, labels in 0..num_classes−1), so that training steps need not read them back from
        the device. Labels are checked only against this DataModule's own ``num_classes``."""
        return not num_classes or self.num_classes == num_classes

    def streamed(self, split: str):
        """A split in LitData's format (data/streaming.py), checked against the model from its first item."""
        from .streaming import StreamedImages, first_item

        if self.transforms:
            raise DataError("--data.transforms: not with --data.source litdata (a stream draws its own order)")
        if split not in self.datasets:
            url = f"{str(self.root).rstrip('/')}/{split}"
            try:
                item = first_item(url)
            except (OSError, ValueError, AssertionError, FileNotFoundError) as error:
                raise DataError(f"--data.source litdata --data.root {self.root}: no {split} split in LitData's format "
                                f"at {url} ({error}); write it with python -m imagetx.data.streaming --out "
                                f"{self.root}") from None
            size, classes = int(item["image"].shape[0]), int(item["classes"])
            if self.image_size is not None and size != self.image_size:
                raise DataError(f"{url} holds {size}x{size} images but the model is {self.image_size}x"
                                f"{self.image_size}: set --model.config.image_size {size} or stream other data")
            if self.num_classes and classes != self.num_classes:
                raise DataError(f"{url} has {classes} classes but the model has num_classes={self.num_classes}: "
                                f"set --model.config.num_classes {classes} (or 0 for an unconditional model)")
            self.datasets[split] = StreamedImages(url, shuffle=split == "train", seed=run_seed(),
                                                  random_flip=self.random_flip and split == "train")
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        splits = ("test",) if stage == "test" else ("train", "val")
        sizes = ", ".join(f"{len(self.dataset(split)):,} {split}" for split in splits)
        # One line a log can be checked against (a run on a half-copied data folder shows here).
        rank_zero_info(f"data: {sizes} images ({self.source}, {self.root})")

    def train_dataloader(self) -> TrainLoader:
        if self.source == "litdata":  # its place in the epoch: LitData's loader's state, kept by Lightning
            from .streaming import loader

            return loader(self.dataset("train"), self.batch_size, self.num_workers)
        trainer = self.trainer  # None outside a Trainer
        replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        order = TrainOrder(self.dataset("train"), run_seed(), self.random_flip, replicas, rank, self.transforms)
        return TrainLoader(self.dataset("train"), batch_size=self.batch_size, sampler=order,
                           num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def eval_loader(self, split: str) -> DataLoader:
        if self.source == "litdata":
            from .streaming import loader

            return loader(self.dataset(split), self.eval_batch_size, self.num_workers)
        return DataLoader(self.dataset(split), batch_size=self.eval_batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader("test")

    def state_dict(self) -> dict[str, int]:
        return {"batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """A resumed run must cut the epoch into the same batches as the run it continues."""
        if state.get("batch_size", self.batch_size) != self.batch_size:
            raise DataError(f"the checkpoint was trained with data.batch_size={state['batch_size']}, this run has "
                            f"{self.batch_size}: resume with the same batch size (or start a new run)")

