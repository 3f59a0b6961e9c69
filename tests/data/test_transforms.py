"""Distribution augmentation's data side (imagetx/data/transforms.py): every transform exact on the uint8
pixels, one id per name, each training image once an epoch with the id of what was applied, drawn from
(seed, epoch) after the flips (which stay as they were), evaluation untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import cifar_arrays, write_cifar_npz
from imagetx.data.datamodule import ImageDataModule, ImageDataset, TrainOrder
from imagetx.data.sources import DataError
from imagetx.data.transforms import (CHANNEL_NAMES, COUNT, NAMES, TransformDraw, apply, invert, name,
                                     parse_transform, transform_set)

pytestmark = pytest.mark.usefixtures("no_cifar_download")


def every_value_image(seed: int = 0) -> torch.Tensor:
    """(32, 32, 3) uint8 holding every value 0..255 in every channel, shuffled: no symmetry to hide a lost
    or moved value, and a transform that rounded, clipped or blended values could not give it back."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.arange(32 * 32 * 3) % 256
    return values[torch.randperm(values.numel(), generator=generator)].view(32, 32, 3).to(torch.uint8)


def test_every_transform_is_exact_and_undone_by_its_inverse():
    image = every_value_image()
    outputs = set()
    for transform in range(COUNT):
        out = apply(image, transform)
        assert out.dtype == torch.uint8 and out.shape == image.shape
        assert torch.equal(invert(out, transform), image), name(transform)
        # the same values, each channel's as a whole (a permutation of pixels and of channels)
        assert sorted(out.flatten().tolist()) == sorted(image.flatten().tolist())
        outputs.add(out.numpy().tobytes())
    assert len(outputs) == COUNT  # 48 different images: no two ids do the same thing
    assert torch.equal(apply(image, 0), image)


def test_transforms_are_the_named_symmetries():
    """Against numpy's own rotation, transposition and fancy indexing, pixel for pixel."""
    image = every_value_image(1)
    array = image.numpy()
    assert np.array_equal(apply(image, NAMES["rot90"]).numpy(), np.rot90(array, 1, axes=(0, 1)))
    assert np.array_equal(apply(image, NAMES["rot270"]).numpy(), np.rot90(array, 3, axes=(0, 1)))
    assert np.array_equal(apply(image, NAMES["transpose"]).numpy(), array.transpose(1, 0, 2))
    assert np.array_equal(apply(image, NAMES["bgr"]).numpy(), array[..., ::-1])
    assert np.array_equal(apply(image, NAMES["transpose+rot180+gbr"]).numpy(),
                          np.rot90(array.transpose(1, 0, 2), 2, axes=(0, 1))[..., [1, 2, 0]])
    # the dihedral group's other reflections are here too: a left-right flip is transpose then rot270
    assert np.array_equal(apply(image, NAMES["transpose+rot270"]).numpy(), array[:, ::-1])


def test_names_ids_and_sets():
    assert len(NAMES) == COUNT == 48 and NAMES["identity"] == 0 and set(CHANNEL_NAMES) == set(
        "".join(p) for p in [("r", "g", "b"), ("r", "b", "g"), ("g", "r", "b"), ("g", "b", "r"), ("b", "r", "g"),
                             ("b", "g", "r")])
    for transform in range(COUNT):
        assert parse_transform(name(transform)) == parse_transform(str(transform)) == transform
    for given in ("rot45", "48", "-1", "bgr+rot90", ""):  # unknown, out of range, parts out of order
        with pytest.raises(DataError, match="not a transform"):
            parse_transform(given)
    sizes = {"rotations": 4, "transposition": 2, "channels": 6, "rotations+transposition": 8,
             "rotations+channels": 24, "transposition+rotations+channels": 48}
    for spec, size in sizes.items():
        ids = transform_set(spec)
        assert len(set(ids)) == size and ids[0] == 0, spec
    assert {name(t) for t in transform_set("rotations")} == {"identity", "rot90", "rot180", "rot270"}
    for spec in ("rotation", "channels+channels", "rotations,channels"):
        with pytest.raises(DataError, match="--data.transforms"):
            transform_set(spec)


def keys_of(order: TrainOrder, epoch: int) -> list[tuple]:
    order.set_epoch(epoch)
    return list(order)


def test_each_image_once_an_epoch_with_transforms_drawn_from_seed_and_epoch():
    dataset = list(range(50))
    draw = TransformDraw("rotations+transposition+channels")
    order = TrainOrder(dataset, seed=0, random_flip=True, transforms=draw)
    epochs = [keys_of(order, epoch) for epoch in range(3)]
    for keys in epochs:
        assert sorted(index for index, _, _ in keys) == dataset  # each image once
        assert all(0 <= transform < COUNT for _, _, transform in keys)
    assert len({tuple(t for _, _, t in keys) for keys in epochs}) == 3  # drawn again each epoch
    assert len({t for keys in epochs for _, _, t in keys}) > 24  # from the whole set
    # the same (seed, epoch), the same draws; the flips and the order as without transforms
    assert keys_of(TrainOrder(dataset, seed=0, random_flip=True, transforms=draw), 1) == epochs[1]
    plain = keys_of(TrainOrder(dataset, seed=0, random_flip=True), 1)
    assert plain == [(index, flip) for index, flip, _ in epochs[1]]
    # resumed mid-epoch: the rest of it, with the same transforms
    resumed = TrainOrder(dataset, seed=0, random_flip=True, transforms=draw)
    resumed.load_state_dict({"epoch": 2, "samples": 17})
    assert keys_of(resumed, 2) == epochs[2][17:]
    # two processes: their shares make the epoch, each image with the one transform drawn for it
    halves = [keys_of(TrainOrder(dataset, seed=0, num_replicas=2, rank=r, transforms=draw), 0) for r in (0, 1)]
    together = {index: transform for keys in halves for index, _, transform in keys}
    assert sorted(together) == dataset and together == {index: t for index, _, t in epochs[0]}


def test_identity_probability():
    generator = torch.Generator().manual_seed(0)
    drawn = TransformDraw("channels", identity_probability=0.75)(4000, generator)
    assert 0.72 < drawn.count(0) / 4000 < 0.78  # 0.75, within 5 standard errors of 4,000 draws (0.007)
    assert set(drawn) == set(range(6))
    assert 0 not in TransformDraw("rotations", identity_probability=0.0)(200, generator)
    assert set(TransformDraw("rotations", identity_probability=1.0)(200, generator)) == {0}
    with pytest.raises(DataError, match="identity_probability 1.5"):
        TransformDraw("rotations", identity_probability=1.5)


def test_training_batches_hold_the_ids_of_what_was_applied(tmp_path):
    """Every training image, its id's inverse applied, is a training image, each once an epoch; evaluation
    batches are the images as they are, with no ids."""
    train_images, _, _, _ = write_cifar_npz(tmp_path, train_sizes=(12,))
    dm = ImageDataModule(root=str(tmp_path), batch_size=4, val_size=2, transforms="rotations+channels",
                         random_flip=True, num_transforms=COUNT)
    dm.setup("fit")
    originals = {train_images[i].tobytes(): i for i in range(10)}
    for _ in range(2):  # two epochs
        seen, ids = [], []
        for batch in dm.train_dataloader():
            assert batch["transforms"].dtype == torch.long and batch["transforms"].shape == batch["labels"].shape
            for image, transform in zip(batch["images"], batch["transforms"].tolist()):
                back = invert(image, transform).numpy()
                found = originals.get(back.tobytes(), originals.get(back[:, ::-1].tobytes()))  # or flipped
                assert found is not None
                seen.append(found)
                ids.append(transform)
        assert sorted(seen) == list(range(10)) and len(set(ids)) > 1
    val = next(iter(dm.val_dataloader()))
    assert "transforms" not in val and np.array_equal(val["images"].numpy(), train_images[10:])


def test_dataset_without_a_transform_key_is_unchanged():
    images, labels = (torch.from_numpy(array) for array in cifar_arrays(3))
    dataset = ImageDataset(images, labels)
    assert set(dataset[1]) == {"images", "labels"} and torch.equal(dataset[(1, True)]["images"], images[1].flip(1))
    item = dataset[(1, True, NAMES["rot90"])]
    assert int(item["transforms"]) == NAMES["rot90"]
    assert torch.equal(item["images"], torch.rot90(images[1].flip(1), 1, dims=(0, 1)))


def test_refusals(tmp_path):
    write_cifar_npz(tmp_path, train_sizes=(6,))
    with pytest.raises(DataError, match="num_transforms=0: set --model.config.num_transforms 48"):
        ImageDataModule(root=str(tmp_path), val_size=2, transforms="rotations", num_transforms=0)
    with pytest.raises(DataError, match="give --data.transforms too"):
        ImageDataModule(root=str(tmp_path), val_size=2, identity_probability=0.5)
    with pytest.raises(DataError, match="not with --data.source litdata"):
        ImageDataModule(root=str(tmp_path), source="litdata", transforms="channels").dataset("train")
