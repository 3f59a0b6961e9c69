"""imagetx.data: npz shards, the torchvision folder, clear DataErrors, downsampling, the DataModule."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from helpers import CIFAR_CLASSES, cifar_arrays, write_cifar_npz, write_npz_shard
from imagetx.data.datamodule import ImageDataModule
from imagetx.model.superres import downsample_area
from imagetx.data.sources import DataError, load

pytestmark = pytest.mark.usefixtures("no_cifar_download")


# ----- npz shards --------------------------------------------------------------------------

def test_npz_train_val_split_and_shard_order(tmp_path):
    train_images, train_labels, _, _ = write_cifar_npz(tmp_path, train_sizes=(5, 7))
    images, labels = load("cifar10", tmp_path, "train", val_size=4)
    assert images.dtype == torch.uint8 and images.shape == (8, 32, 32, 3)
    assert labels.dtype == torch.long and labels.shape == (8,)
    np.testing.assert_array_equal(images.numpy(), train_images[:8])
    np.testing.assert_array_equal(labels.numpy(), train_labels[:8])
    # val = the last val_size training images (they straddle nothing here: all in train-1)
    val_images, val_labels = load("cifar10", tmp_path, "val", val_size=4)
    np.testing.assert_array_equal(val_images.numpy(), train_images[8:])
    np.testing.assert_array_equal(val_labels.numpy(), train_labels[8:])
    # a val split crossing the shard boundary
    val_images, _ = load("cifar10", tmp_path, "val", val_size=9)
    np.testing.assert_array_equal(val_images.numpy(), train_images[3:])


def test_npz_shards_read_in_name_order_not_creation_order(tmp_path):
    parts = {i: cifar_arrays(2, seed=i) for i in (0, 1, 2, 10)}
    for i in (10, 2, 1, 0):  # written in reverse, so directory order is no help
        write_npz_shard(tmp_path / f"train-{i}.npz", *parts[i])
    images, labels = load("cifar10", tmp_path, "train", val_size=1)
    expected = np.concatenate([parts[i][0] for i in (0, 1, 2, 10)])  # train-10 after train-2
    np.testing.assert_array_equal(images.numpy(), expected[:-1])
    expected_labels = np.concatenate([parts[i][1] for i in (0, 1, 2, 10)])
    np.testing.assert_array_equal(labels.numpy(), expected_labels[:-1])


def test_npz_test_split_comes_from_test_shards(tmp_path):
    train_images, _, test_images, test_labels = write_cifar_npz(tmp_path, train_sizes=(4,), test_size=5)
    images, labels = load("cifar10", tmp_path, "test", val_size=2)
    assert images.shape == (5, 32, 32, 3) and labels.dtype == torch.long
    np.testing.assert_array_equal(images.numpy(), test_images)
    np.testing.assert_array_equal(labels.numpy(), test_labels)
    assert not np.array_equal(images.numpy()[:4], train_images)


def test_unknown_split_and_bad_val_size(tmp_path):
    write_cifar_npz(tmp_path, train_sizes=(4,))
    with pytest.raises(DataError, match="unknown"):
        load("cifar10", tmp_path, "validation")
    for val_size in (0, 4, 10):
        with pytest.raises(DataError, match="val_size"):
            load("cifar10", tmp_path, "val", val_size=val_size)


# ----- torchvision's cifar-10-batches-py folder --------------------------------------------

def write_torchvision_folder(root, sizes=(2, 1, 2, 1, 2), test_size=3, seed=0, skip=()):
    """A folder laid out like torchvision's extracted cifar-10-python.tar.gz.

    The original pickles were written by Python 2, whose str keys load as str under
    ``pickle.load(f, encoding="latin1")`` (torchvision reads entry["data"]); so the keys
    are written here as str. 'data' is (N, 3072) uint8 in CHW-flattened order.
    Returns (train images HWC, train labels, test images HWC, test labels).
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = [(f"data_batch_{i + 1}", cifar_arrays(n, seed=seed + i)) for i, n in enumerate(sizes)]
    batches.append(("test_batch", cifar_arrays(test_size, seed=seed + 50)))
    for name, (images, labels) in batches:
        if name in skip:
            continue
        entry = {"batch_label": name, "labels": [int(v) for v in labels],
                 "data": images.transpose(0, 3, 1, 2).reshape(len(images), 3072),
                 "filenames": [f"{name}_{i}.png" for i in range(len(images))]}
        with open(folder / name, "wb") as handle:
            pickle.dump(entry, handle, protocol=2)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": CIFAR_CLASSES, "num_cases_per_batch": 10000, "num_vis": 3072}, handle)
    train = batches[:-1]
    return (np.concatenate([b[1][0] for b in train]), np.concatenate([b[1][1] for b in train]),
            batches[-1][1][0], batches[-1][1][1])


@pytest.fixture
def accept_fake_md5(monkeypatch):
    # torchvision's CIFAR10 checks every batch file's md5 against the real CIFAR-10 files
    # (CIFAR10._check_integrity and _load_meta both call cifar.check_integrity). Our
    # stand-in files have other checksums, so the check is replaced by "the file exists":
    # missing files still fail it, as they would for real.
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


@pytest.mark.usefixtures("accept_fake_md5")
def test_torchvision_folder_read_with_hwc_pixels(tmp_path):
    train_images, train_labels, test_images, test_labels = write_torchvision_folder(tmp_path)
    images, labels = load("cifar10", tmp_path, "train", val_size=3, download=False)
    assert images.dtype == torch.uint8 and images.shape == (5, 32, 32, 3) and labels.dtype == torch.long
    np.testing.assert_array_equal(images.numpy(), train_images[:5])
    np.testing.assert_array_equal(labels.numpy(), train_labels[:5])
    val_images, val_labels = load("cifar10", tmp_path, "val", val_size=3, download=False)
    np.testing.assert_array_equal(val_images.numpy(), train_images[5:])
    np.testing.assert_array_equal(val_labels.numpy(), train_labels[5:])
    images, labels = load("cifar10", tmp_path, "test", download=False)
    np.testing.assert_array_equal(images.numpy(), test_images)
    np.testing.assert_array_equal(labels.numpy(), test_labels)
    # and with download=True nothing is downloaded when the folder is complete
    images, _ = load("cifar10", tmp_path, "test", download=True)
    np.testing.assert_array_equal(images.numpy(), test_images)


@pytest.mark.usefixtures("accept_fake_md5")
def test_incomplete_torchvision_folder_is_a_data_error(tmp_path):
    write_torchvision_folder(tmp_path, skip=("data_batch_3",))
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        load("cifar10", tmp_path, "train", val_size=2, download=False)


# ----- no data at all ----------------------------------------------------------------------

@pytest.mark.parametrize("download", [True, False])
def test_missing_data_names_directory_and_remedy(tmp_path, download):
    root = tmp_path / "nothing-here"
    root.mkdir()
    with pytest.raises(DataError) as info:  # download=True fails: no_cifar_download
        load("cifar10", root, "train", download=download)
    message = str(info.value)
    assert str(root.resolve()) in message
    assert "train-*.npz" in message and "cifar-10-batches-py" in message
    assert "--data.root" in message and "IMAGETX_DATA" in message
    root.rmdir()  # a root that does not exist: a mistyped path, never downloaded into (issue 126)
    with pytest.raises(DataError) as info:
        load("cifar10", root, "train", download=download)
    message = str(info.value)
    assert f"--data.root {root} does not exist: check the path, or set IMAGETX_DATA=DIR" in message, message
    assert not root.exists()


@pytest.mark.parametrize("source", ["cifar10", "imagenet", "folder"])
def test_missing_data_is_named_by_the_path_given_not_a_symlinks_target(tmp_path, monkeypatch, source):
    """--data.root data, a link to a folder elsewhere: the message names data (and where that is
    from here), not the link's target, which the user never typed."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data").symlink_to(tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(DataError) as info:
        load(source, "data", "train", download=False)
    message = str(info.value)
    assert f"under data ({tmp_path / 'work' / 'data'})" in message and "elsewhere" not in message, message


@pytest.mark.parametrize("download", [True, False])
def test_split_without_shards_is_a_clear_error(tmp_path, download):
    """A folder of training shards only (as ../shared/cifar10): the test split is not there, and
    the message says so and names the split that is, instead of asking for the shards it reads."""
    write_cifar_npz(tmp_path, train_sizes=(4,))
    with pytest.raises(DataError) as info:  # download=True fails: no_cifar_download
        load("cifar10", tmp_path, "test", download=download)
    message = str(info.value)
    assert "test-*.npz" in message and str(tmp_path) in message
    assert "only the training shards" in message and "--split val" in message, message
    assert "Put the shards there" not in message and "copy" not in message, message
    # the train split of the same directory is fine
    assert load("cifar10", tmp_path, "train", val_size=1, download=False)[0].shape[0] == 3


# ----- bad shards --------------------------------------------------------------------------

def good(count=3):
    return cifar_arrays(count, seed=7)


@pytest.mark.parametrize("case", ["shape", "channels_first", "dtype", "label_high", "label_count", "label_float"])
def test_bad_shard_contents_name_the_file(tmp_path, case):
    images, labels = good()
    if case == "shape":
        images = images[:, :28, :28]
    elif case == "channels_first":
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    elif case == "dtype":
        images = images.astype(np.int16)
    elif case == "label_high":
        labels = labels.copy()
        labels[1] = 10
    elif case == "label_count":
        labels = labels[:2]
    elif case == "label_float":
        labels = labels.astype(np.float32)
    write_npz_shard(tmp_path / "train-0.npz", *good())
    write_npz_shard(tmp_path / "train-1.npz", images, labels)
    with pytest.raises(DataError) as info:
        load("cifar10", tmp_path, "train", val_size=1)
    assert "train-1.npz" in str(info.value)


def test_shard_missing_arrays_names_the_file(tmp_path):
    np.savez(tmp_path / "train-0.npz", x=np.zeros(3))
    with pytest.raises(DataError, match=r"train-0\.npz.*images"):
        load("cifar10", tmp_path, "train", val_size=1)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_shard_names_the_file(tmp_path, damage):
    path = tmp_path / "train-0.npz"
    write_npz_shard(path, *good())
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not an npz file at all" * 10)
    else:
        path.write_bytes(b"")
    with pytest.raises(DataError) as info:
        load("cifar10", tmp_path, "train", val_size=1)
    assert str(path) in str(info.value)


# ----- downsample_area ---------------------------------------------------------------------

def test_downsample_area_exact_rounding_half_up():
    image = torch.zeros(1, 4, 4, 3, dtype=torch.uint8)
    # channel 0 patches (2x2): {0,1,0,1} mean 0.5 -> 1; {10,10,10,11} 10.25 -> 10;
    # all 255 -> 255 (no uint8 overflow); {3,4,4,4} 3.75 -> 4. Whole image: 1078/16 = 67.375 -> 67.
    image[0, :, :, 0] = torch.tensor([[0, 1, 10, 10],
                                      [0, 1, 10, 11],
                                      [255, 255, 3, 4],
                                      [255, 255, 4, 4]])
    # channel 1: one 40 -> patch mean 10 exactly; whole image 40/16 = 2.5 -> 3 (half up, not to even)
    image[0, 3, 0, 1] = 40
    # channel 2 patches: {2,3,2,3} 2.5 -> 3; {1,0,0,0} 0.25 -> 0; {77,0,0,0} 19.25 -> 19; zeros -> 0.
    # Whole image 88/16 = 5.5 -> 6.
    image[0, :, :, 2] = torch.tensor([[2, 3, 1, 0],
                                      [2, 3, 0, 0],
                                      [77, 0, 0, 0],
                                      [0, 0, 0, 0]])
    two = downsample_area(image, 2)
    assert two.dtype == torch.uint8 and two.shape == (1, 2, 2, 3)
    assert two[0, :, :, 0].tolist() == [[1, 10], [255, 4]]
    assert two[0, :, :, 1].tolist() == [[0, 0], [10, 0]]
    assert two[0, :, :, 2].tolist() == [[3, 0], [19, 0]]
    one = downsample_area(image, 1)
    assert one.shape == (1, 1, 1, 3)
    assert one[0, 0, 0].tolist() == [67, 3, 6]
    assert torch.equal(downsample_area(image, 4), image)  # identity at full size


def test_downsample_area_batch_and_32_to_8():
    images = torch.from_numpy(cifar_arrays(2, seed=3)[0])
    low = downsample_area(images, 8)
    assert low.shape == (2, 8, 8, 3) and low.dtype == torch.uint8
    patches = images.double().view(2, 8, 4, 8, 4, 3).mean(dim=(2, 4))
    torch.testing.assert_close(low.long(), torch.floor(patches + 0.5).long(), rtol=0, atol=0)
    with pytest.raises(ValueError):
        downsample_area(images, 5)


def tied_picture(side: int, size: int, seed: int) -> np.ndarray:
    """A random (side, side, 3) picture whose every (side/size)² block averages to exactly k + ½:
    the ties that decide between rounding exactly and rounding a float that lands just below."""
    factor = side // size
    area = factor * factor
    rng = np.random.default_rng(seed)
    blocks = rng.integers(64, 192, (size, factor, size, factor, 3))  # room for the change below
    sums = blocks.sum(axis=(1, 3))
    blocks[:, 0, :, 0] += (sums // area) * area + area // 2 - sums  # one pixel moved by at most area/2
    return blocks.reshape(side, side, 3).astype(np.uint8)


@pytest.mark.parametrize("factor", [6, 10])  # 1/6 and 1/10 are not exact in binary floating point
def test_area_resize_of_a_picture_rounds_ties_as_downsample_area(factor):
    """A picture's area resize (imagetx.data.images, every photo and folder image) is exact: where
    the side is a multiple of the output it equals the integer box mean of downsample_area,
    ties k + ½ rounded up, not to the float below them."""
    from PIL import Image

    from imagetx.data.images import square

    picture = tied_picture(32 * factor, 32, seed=factor)
    exact = downsample_area(torch.from_numpy(picture)[None], 32)[0].numpy()
    means = picture.astype(np.int64).reshape(32, factor, 32, factor, 3).sum(axis=(1, 3))
    assert (2 * means % (2 * factor**2) == factor**2).all()  # every block is a tie: mean k + ½
    np.testing.assert_array_equal(square(Image.fromarray(picture), 32, "center", "area"), exact)


def test_area_resize_equals_rational_arithmetic_at_fractional_scales():
    """Sides that are not a multiple of the output (partly covered pixels), enlarging too: the
    mean of the covered area, weighted, computed with Fractions and rounded half up."""
    from fractions import Fraction
    from math import floor

    from imagetx.data.images import resize_area

    rng = np.random.default_rng(1)
    for side, size in [(45, 6), (13, 5), (3, 7)]:
        picture = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        picture[: side // 2] = 128  # flat regions: many means exactly k + ½ or whole
        weights = [[max(Fraction(0), min(Fraction((i + 1) * side, size), p + 1) - max(Fraction(i * side, size), p))
                    for p in range(side)] for i in range(size)]
        expected = np.array([[[floor(sum(weights[i][p] * weights[j][q] * int(picture[p, q, c])
                                         for p in range(side) for q in range(side) if weights[i][p] and weights[j][q])
                                     / Fraction(side * side, size * size) + Fraction(1, 2))
                               for c in range(3)] for j in range(size)] for i in range(size)])
        np.testing.assert_array_equal(resize_area(picture, size), expected)


# ----- the DataModule ----------------------------------------------------------------------

def test_setup_says_how_many_images_each_split_has(tmp_path, monkeypatch):
    """One log line to check a run against (a half-copied data folder shows there), through
    Lightning's rank_zero_info (whose logger's handlers differ between Lightning releases)."""
    write_cifar_npz(tmp_path, train_sizes=(8, 7), test_size=5)
    dm = ImageDataModule(root=str(tmp_path), val_size=10)
    said = []
    monkeypatch.setattr("imagetx.data.datamodule.rank_zero_info", said.append)
    dm.setup("fit")
    dm.setup("test")
    lines = [line for line in said if line.startswith("data:")]
    assert lines == [f"data: 5 train, 10 val images (cifar10, {tmp_path})",
                     f"data: 5 test images (cifar10, {tmp_path})"]


def test_datamodule_batches_and_no_dropped_images(tmp_path):
    train_images, train_labels, test_images, _ = write_cifar_npz(tmp_path, train_sizes=(8, 7), test_size=5)
    dm = ImageDataModule(root=str(tmp_path), batch_size=3, eval_batch_size=4, val_size=10)
    dm.setup("fit")
    val_batches = list(dm.val_dataloader())
    assert [len(b["images"]) for b in val_batches] == [4, 4, 2]  # drop_last=False
    for batch in val_batches:
        assert set(batch) == {"images", "labels"}
        assert batch["images"].dtype == torch.uint8 and batch["images"].shape[1:] == (32, 32, 3)
        assert batch["labels"].dtype == torch.long and batch["labels"].shape == batch["images"].shape[:1]
    val = torch.cat([b["images"] for b in val_batches])
    np.testing.assert_array_equal(val.numpy(), train_images[5:])  # in order, all 10
    np.testing.assert_array_equal(torch.cat([b["labels"] for b in val_batches]).numpy(), train_labels[5:])
    train_batches = list(dm.train_dataloader())
    assert sorted(len(b["images"]) for b in train_batches) == [2, 3]  # 5 images, last batch kept
    assert train_batches[0]["images"].dtype == torch.uint8
    dm.setup("test")
    test = torch.cat([b["images"] for b in dm.test_dataloader()])
    np.testing.assert_array_equal(test.numpy(), test_images)


def test_datamodule_checks_the_data_against_the_model(tmp_path):
    write_cifar_npz(tmp_path, train_sizes=(6,))
    ImageDataModule(root=str(tmp_path), val_size=2, image_size=32, num_classes=10).setup("fit")  # fits
    ImageDataModule(root=str(tmp_path), val_size=2).setup("fit")  # no model given: nothing to check against
    with pytest.raises(DataError, match="holds 32x32 images but the model is 16x16"):
        ImageDataModule(root=str(tmp_path), val_size=2, image_size=16, num_classes=0).setup("fit")
    with pytest.raises(DataError, match="has 10 classes but the model has num_classes=5"):
        ImageDataModule(root=str(tmp_path), val_size=2, image_size=32, num_classes=5).setup("fit")
