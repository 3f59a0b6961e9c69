"""imagetx.data.sources: downsampled ImageNet (pickled batches and npz) and image folders read
exactly, the folder conversion (deterministic, resumable, refusing a changed folder,
skipping unreadable files), the model checked against the data, and the three commands
on each source. Tiny data written here: 8×8 images and 8×8 models, so it all runs in
seconds on a CPU.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import imagetx.data.sources.folder as folder
from helpers import one_error_line, tiny_model, with_changes, write_train_config
from imagetx import load_model, save_pretrained
from imagetx.data.datamodule import ImageDataModule
from imagetx.evaluate import main as evaluate_main
from imagetx.sample import main as sample_main
from imagetx.data.sources import DataError, Reader, load
from imagetx.train import main as train_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]
SIDE = 8


def rgb_images(count: int, side: int = SIDE, seed: int = 0) -> np.ndarray:
    """(count, side, side, 3) uint8 whose R, G and B planes take values from disjoint ranges
    (R < 85 <= G < 170 <= B): any mix-up of channels, or of rows and columns, changes them."""
    rng = np.random.default_rng(seed)
    planes = [rng.integers(low, low + 85, size=(count, side, side), dtype=np.uint8) for low in (0, 85, 170)]
    return np.stack(planes, axis=-1)


# ----- downsampled ImageNet ----------------------------------------------------------------

def imagenet_entry(images: np.ndarray, labels: np.ndarray) -> dict:
    """The official layout: each row the R plane, then G, then B, each row-major; labels from 1."""
    data = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    return {"data": data, "labels": [int(label) + 1 for label in labels], "mean": data.mean(axis=0)}


def write_imagenet_file(path: Path, entry: dict, npz: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if npz:
        np.savez(path.with_name(path.name + ".npz"), **{k: np.asarray(v) for k, v in entry.items()})
    else:
        with path.open("wb") as handle:
            pickle.dump(entry, handle)


def write_imagenet(root: Path, side: int = SIDE, batches=(5, 4, 3), val: int = 3, npz: bool = False,
                   train_folder: str = "", val_folder: str = ""):
    """train_data_batch_1, _2, _10 (numbered so that name order is not batch order) and val_data.
    -> (train images, train labels 0-based, val images, val labels) in reading order."""
    rng = np.random.default_rng(side)
    parts = []
    for number, count in zip((1, 2, 10), batches):
        images, labels = rgb_images(count, side, seed=number), rng.integers(0, 1000, size=count)
        labels[0] = 999 if number == 1 else labels[0]  # the highest class is read too
        write_imagenet_file(root / train_folder / f"train_data_batch_{number}", imagenet_entry(images, labels), npz)
        parts.append((images, labels))
    val_images, val_labels = rgb_images(val, side, seed=99), rng.integers(0, 1000, size=val)
    val_labels[0] = 0
    write_imagenet_file(root / val_folder / "val_data", imagenet_entry(val_images, val_labels), npz)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), val_images, val_labels)


@pytest.mark.parametrize("npz", [False, True], ids=["pickle", "npz"])
def test_imagenet_batches_read_exactly(tmp_path, npz):
    # pickles as unzipped from the archives (one folder each), npz directly under the root
    folders = {} if npz else {"train_folder": "Imagenet8_train", "val_folder": "Imagenet8_val"}
    train_images, train_labels, val_images, val_labels = write_imagenet(tmp_path, npz=npz, **folders)
    images, labels = load("imagenet", tmp_path, "train")  # val_size 0 by default: all training images
    assert images.dtype == torch.uint8 and images.shape == (12, SIDE, SIDE, 3) and labels.dtype == torch.long
    np.testing.assert_array_equal(images.numpy(), train_images)  # batches 1, 2, 10 in that order
    np.testing.assert_array_equal(labels.numpy(), train_labels)
    assert labels.max() == 999 and (images[..., 0] < 85).all() and (images[..., 2] >= 170).all()
    for split in ("val", "test"):  # the official validation set
        images, labels = load("imagenet", tmp_path, split)
        np.testing.assert_array_equal(images.numpy(), val_images)
        np.testing.assert_array_equal(labels.numpy(), val_labels)
    # a held-out part of train, when asked
    images, labels = load("imagenet", tmp_path, "val", val_size=4)
    np.testing.assert_array_equal(images.numpy(), train_images[-4:])
    np.testing.assert_array_equal(labels.numpy(), train_labels[-4:])
    images, _ = load("imagenet", tmp_path, "train", val_size=4)
    np.testing.assert_array_equal(images.numpy(), train_images[:-4])
    np.testing.assert_array_equal(load("imagenet", tmp_path, "test", val_size=4)[0].numpy(), val_images)


@pytest.mark.parametrize("side", [32, 64])
def test_imagenet_image_size_follows_the_row_length(tmp_path, side):
    write_imagenet(tmp_path, side=side, batches=(2, 1, 1), val=1)
    images, _ = load("imagenet", tmp_path, "val")
    assert images.shape == (1, side, side, 3)


def bad_imagenet(root: Path, case: str) -> None:
    images, labels = rgb_images(3), np.array([1, 2, 3])
    entry = imagenet_entry(images, labels)
    path = root / "train_data_batch_1"
    if case == "missing":
        write_imagenet_file(root / "val_data", entry, npz=False)
        return
    if case == "rows":
        entry["data"] = entry["data"][:, :100]
    elif case == "dtype":
        entry["data"] = entry["data"].astype(np.float32)
    elif case == "label zero":
        entry["labels"] = [0, 1, 2]
    elif case == "label 1001":
        entry["labels"] = [1, 1001, 2]
    elif case == "label count":
        entry["labels"] = [1, 2]
    elif case == "keys":
        entry = {"images": entry["data"]}
    write_imagenet_file(path, entry, npz=False)
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif case == "two sizes":
        write_imagenet_file(root / "train_data_batch_2", imagenet_entry(rgb_images(2, side=4), [1, 2]), npz=False)
    elif case == "twice":
        write_imagenet_file(root / "train_data_batch_1", entry, npz=True)


IMAGENET_CASES = {
    "missing": "no downsampled ImageNet train files", "rows": "expected uint8 (N, 3·S·S)",
    "dtype": "'data' is float32", "label zero": "labels span 0..2; expected 1..1000",
    "label 1001": "labels span 1..1001; expected 1..1000", "label count": "expected 3 integers",
    "keys": "expected 'data' and 'labels'", "truncated": "truncated or corrupt",
    "two sizes": "holds 4x4 images", "twice": "keep one",
}


@pytest.mark.parametrize("case", sorted(IMAGENET_CASES))
def test_bad_imagenet_files_are_data_errors(tmp_path, case):
    bad_imagenet(tmp_path, case)
    with pytest.raises(DataError) as info:
        load("imagenet", tmp_path, "train")
    message = str(info.value)
    assert IMAGENET_CASES[case] in message, message
    if case != "missing":
        assert "train_data_batch_" in message, message


# ----- image folders ------------------------------------------------------------------------

def save(path: Path, array: np.ndarray, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **kwargs)
    return path


def write_folder(root: Path, count: int = 10, classes=("cats", "dogs"), side: int = SIDE) -> dict[str, np.ndarray]:
    """PNG files of exactly side x side in class sub-folders (or flat); {relative path: pixels}."""
    images = rgb_images(count, side, seed=5)
    written = {}
    for i, image in enumerate(images):
        rel = f"{classes[i % len(classes)]}/img{i:02d}.png" if classes else f"img{i:02d}.png"
        save(root / rel, image)
        written[rel] = image
    return written


def manifest_of(cache: Path) -> dict:
    (out,) = [p for p in cache.iterdir() if p.is_dir()]
    return json.loads((out / "manifest.json").read_text())


def test_folder_png_and_jpeg_with_class_subfolders_read_exactly(tmp_path):
    root = tmp_path / "photos"
    wide = rgb_images(1, seed=1)[0].repeat(2, axis=1)[:, :12]  # 12 wide, 8 high: the middle 8 columns stay
    big = rgb_images(1, 16, seed=2)[0]  # 16x16: box-resized to 8x8
    planes = np.zeros((SIDE, SIDE, 3), np.uint8)
    planes[..., 0], planes[..., 1], planes[..., 2] = 30, 128, 220  # flat planes survive JPEG nearly intact
    save(root / "cats" / "exact.png", rgb_images(1, seed=3)[0])
    save(root / "cats" / "wide.png", wide)
    save(root / "dogs" / "big.png", big)
    save(root / "dogs" / "puppies" / "planes.JPEG", planes, quality=95)  # class = the first sub-folder
    save(root / "dogs" / ".hidden.png", big)  # hidden files are skipped
    (root / "dogs" / "notes.txt").write_text("not an image")
    reader = Reader("folder", root, val_size=1, image_size=SIDE)
    data = reader.pool("train")
    assert data.num_classes == 2 and data.images.shape == (4, SIDE, SIDE, 3)
    files = manifest_of(root / ".imagetx-cache")["files"]
    assert sorted(f[0] for f in files) == ["cats/exact.png", "cats/wide.png", "dogs/big.png",
                                           "dogs/puppies/planes.JPEG"]
    expected_boxes = np.floor(big.reshape(8, 2, 8, 2, 3).mean(axis=(1, 3)) + 0.5)  # box means, half up
    for (rel, _, _, label), image, stored_label in zip(files, data.images, data.labels):
        assert stored_label == label == (0 if rel.startswith("cats") else 1)
        if rel == "cats/exact.png":
            np.testing.assert_array_equal(image, rgb_images(1, seed=3)[0])
        elif rel == "cats/wide.png":
            np.testing.assert_array_equal(image, wide[:, 2:10])  # centre-cropped, no resize
        elif rel == "dogs/big.png":
            np.testing.assert_array_equal(image, expected_boxes)  # exactly the mean of each 2x2 box
        else:
            decoded = np.asarray(Image.open(root / rel).convert("RGB"))
            np.testing.assert_array_equal(image, decoded)  # the file's own pixels
            assert np.abs(image.astype(int) - planes).max() <= 3  # and R, G, B where they were
    # splits: the last val_size images (in hash order) are val; a folder has no test split
    val = reader.split("val")
    np.testing.assert_array_equal(val.images, data.images[-1:])
    np.testing.assert_array_equal(reader.split("train").labels, data.labels[:-1])
    with pytest.raises(DataError, match="no test split"):
        reader.split("test")
    # val_size 0: every image in train (e.g. to evaluate a whole folder), and no val split
    whole = Reader("folder", root, val_size=0, image_size=SIDE)
    np.testing.assert_array_equal(whole.split("train").images, data.images)
    with pytest.raises(DataError, match="no val split"):
        whole.split("val")


def area_means(image: np.ndarray, size: int) -> np.ndarray:
    """Each output pixel the mean of the input area it covers, fractional pixels weighted."""
    side = image.shape[0]
    weights = np.zeros((size, side))
    for i in range(size):
        start, stop = i * side / size, (i + 1) * side / size
        for j in range(int(start), int(np.ceil(stop))):
            weights[i, j] = min(stop, j + 1) - max(start, j)
    weights /= weights.sum(axis=1, keepdims=True)
    return np.einsum("ah,bw,hwc->abc", weights, weights, image)


def test_flat_folder_is_unlabelled_and_celeba_crop(tmp_path):
    root = tmp_path / "faces"
    rng = np.random.default_rng(0)
    faces = {f"face{i}.jpg": rng.integers(0, 256, size=(218, 178, 3), dtype=np.uint8) for i in range(3)}
    for name, face in faces.items():
        save(root / name, face)
    images, labels = load("folder", root, "train", val_size=1, image_size=SIDE, crop="celeba")
    assert labels is None and images.shape == (2, SIDE, SIDE, 3)
    order = [f[0] for f in manifest_of(root / ".imagetx-cache")["files"]]
    for name, image in zip(order, images):
        with Image.open(root / name) as opened:  # the 138x138 box 40 rows down, 20 columns in
            crop = opened.convert("RGB").crop((20, 40, 158, 178))
        # area means, partly covered pixels weighted (138/8 is not whole), rounded
        exact = area_means(np.asarray(crop, dtype=np.float64), SIDE)
        assert np.abs(image.numpy() - exact).max() <= 0.5 + 1e-9


def convert(root, cache, **options):
    return folder.convert(root, SIDE, cache=cache, **options)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith(".")}


def test_conversion_is_deterministic_and_done_once(tmp_path, monkeypatch):
    monkeypatch.setattr(folder, "SHARD_SIZE", 3)
    root = tmp_path / "photos"
    write_folder(root)
    first, second = convert(root, tmp_path / "a"), convert(root, tmp_path / "b")
    assert first != second and shard_bytes(first) == shard_bytes(second)  # byte for byte
    assert sorted(shard_bytes(first)) == ["complete.json", "manifest.json", *[f"shard-{k:05d}.npz" for k in range(4)]]
    stamps = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    assert convert(root, tmp_path / "a") == first  # a finished conversion is read, not redone
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == stamps


def test_interrupted_conversion_resumes_and_ends_with_the_same_shards(tmp_path, monkeypatch, capsys):
    root = tmp_path / "photos"
    write_folder(root, count=11)
    killed = tmp_path / "killed"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        import imagetx.data.sources.folder as folder
        folder.SHARD_SIZE = 3
        write_shard = folder.write_shard

        def write_shard_then_die(root, out, k, *rest):  # killed outright once shard 1 is written (of 0..3)
            write_shard(root, out, k, *rest)
            if k == 1:
                os.kill(os.getpid(), signal.SIGKILL)

        folder.write_shard = write_shard_then_die
        folder.convert(Path({str(root)!r}), {SIDE}, cache={str(killed)!r})
    """)
    process = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, timeout=120,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert process.returncode == -signal.SIGKILL, process.stderr.decode()[-2000:]
    (out,) = killed.iterdir()
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.npz", "shard-00001.npz"]
    assert not (out / "complete.json").exists()
    stale = out / ".shard-00002.npz.x1y2.tmp"  # as a kill in the middle of a write leaves it
    stale.write_bytes(b"PK half a shard")
    os.utime(stale, (1, 1))
    finished = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard-*")}

    monkeypatch.setattr(folder, "SHARD_SIZE", 3)
    assert convert(root, killed) == out
    assert "continuing at shard 2" in capsys.readouterr().err
    assert {name: (out / name).stat().st_ino for name in finished} == {n: v[0] for n, v in finished.items()}
    assert not stale.exists()
    straight = convert(root, tmp_path / "straight")
    assert shard_bytes(out) == shard_bytes(straight)
    images, labels = load("folder", root, "train", val_size=1, image_size=SIDE, cache=killed)
    assert images.shape == (10, SIDE, SIDE, 3) and labels.shape == (10,)


@pytest.mark.parametrize("change", ["added", "removed", "changed"])
def test_a_changed_folder_is_refused_until_rebuilt(tmp_path, change):
    root = tmp_path / "photos"
    written = write_folder(root)
    out = convert(root, None)
    assert out == root / ".imagetx-cache" / f"{SIDE}px-center-area"
    if change == "added":
        save(root / "cats" / "new.png", rgb_images(1, seed=9)[0])
    elif change == "removed":
        (root / next(iter(written))).unlink()
    else:
        path = root / next(iter(written))
        save(path, rgb_images(1, seed=9)[0])
        os.utime(path, ns=(1, 10**18))
    with pytest.raises(DataError) as info:
        convert(root, None)
    message = str(info.value)
    assert f"1 file(s) {change}" in message and "--data.rebuild true" in message and str(out) in message, message
    rebuilt = convert(root, None, rebuild=True)
    assert shard_bytes(rebuilt) == shard_bytes(convert(root, tmp_path / "fresh"))


def test_unreadable_files_are_skipped_counted_and_named(tmp_path, capsys):
    root = tmp_path / "photos"
    write_folder(root, count=4, classes=())
    good = save(tmp_path / "good.jpg", rgb_images(1, 32)[0])
    (root / "truncated.jpg").write_bytes(good.read_bytes()[:300])
    (root / "text.png").write_text("not a PNG")
    (root / "empty.jpeg").write_bytes(b"")
    images, labels = load("folder", root, "train", val_size=1, image_size=SIDE)
    assert images.shape == (3, SIDE, SIDE, 3) and labels is None
    err = capsys.readouterr().err
    assert "skipped 3 of 7 image files" in err
    for name in ("truncated.jpg", "text.png", "empty.jpeg"):
        assert name in err
    load("folder", root, "train", val_size=1, image_size=SIDE)  # read again: converted, nothing said
    assert "skipped" not in capsys.readouterr().err


# ----- the commands ----------------------------------------------------------------------------

TINY = {"image_size": SIDE, "attention": {"query_block_length": 16}}


def train(tmp_path, data_root, source, model=None, data=None, extra=(), steps=3):
    run_dir = tmp_path / f"run-{source}"
    config = write_train_config(tmp_path / f"{source}.yaml", run_dir, data_root, steps,
                                model=with_changes(TINY, model or {}),
                                data={"source": source, **(data or {})})
    train_main(["--config", str(config), "--wandb", "disabled", *extra])
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.fixture
def imagenet_root(tmp_path):
    root = tmp_path / "imagenet"
    write_imagenet(root, batches=(6, 4, 4), val=5)
    return root


@pytest.fixture
def folder_root(tmp_path):
    root = tmp_path / "photos"
    write_folder(root, count=12)
    return root


@pytest.fixture
def flat_root(tmp_path):
    root = tmp_path / "flat"
    write_folder(root, count=12, classes=())
    return root


@pytest.fixture
def superres_ckpt(tmp_path):
    path = tmp_path / "superres"
    save_pretrained(tiny_model(seed=4, head="dmol", encoder_layers=1, low_res_size=2, image_size=SIDE,
                                    query_block_length=16), path)
    return path


@pytest.mark.parametrize("source,classes,val,fixture", [
    ("imagenet", 1000, 0, "imagenet_root"), ("folder", 2, 2, "folder_root"), ("folder", 0, 2, "flat_root")],
                         ids=["imagenet-conditional", "folder-conditional", "flat-folder-unconditional"])
def test_train_evaluate_and_sample_on_each_source(tmp_path, capsys, request, superres_ckpt, source, classes, val,
                                                  fixture):
    root = request.getfixturevalue(fixture)
    ckpt = train(tmp_path, root, source, model={"num_classes": classes}, data={"val_size": val})
    assert torch.load(ckpt, weights_only=False)["global_step"] == 3
    assert load_model(ckpt).config.num_classes == classes
    capsys.readouterr()
    data = ["--data.source", source, "--data.root", str(root), "--val_size", str(val), "--device", "cpu"]
    evaluate_main(["--ckpt", str(ckpt), "--split", "val", *data])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == (5 if source == "imagenet" else 2) and 0 < result["bpd"] < 16
    evaluate_main(["--ckpt", str(ckpt), "--split", "train", "--limit", "3", *data])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["images"] == 3
    for task, ckpt_path in (("complete", ckpt), ("superres", superres_ckpt)):
        out = tmp_path / task
        sample_main(["--ckpt", str(ckpt_path), "--task", task, "--count", "2", "--samples", "1", "--rows", "4",
                     "--temperatures", "1.0", "--out", str(out), *data])
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["images"] == 2 and (out / f"{task}.png").is_file()


def test_a_presets_cifar_val_size_leaves_a_folder_its_own_default(tmp_path, capsys, caplog, folder_root):
    """A preset written for CIFAR-10 (``val_size: 5000``, no source named) run with ``--data.source
    folder``: the folder holds out its own default (a tenth: 1 of 12), and a line says why. A
    val_size the folder cannot hold, given on the command line or by a file written for folders,
    is refused naming where it came from and the option that changes it."""
    import logging

    caplog.set_level(logging.INFO)
    preset = write_train_config(tmp_path / "preset.yaml", tmp_path / "run", tmp_path / "cifar", 2, model=TINY,
                                data={"val_size": 5000})
    on_folder = ["--data.source", "folder", "--data.root", str(folder_root)]
    train_main(["--config", str(preset), "--wandb", "disabled", *on_folder])
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["datamodule_hyper_parameters"]["val_size"] is None
    (note,) = [r.getMessage() for r in caplog.records if "holds out its own default" in r.getMessage()]
    assert f"{preset}" in note and "5000" in note and "cifar10" in note and "--data.val_size" in note, note
    assert "data: 11 train, 1 val images (folder" in caplog.text
    line = one_error_line(capsys, train_main, ["--config", str(preset), "--wandb", "disabled", *on_folder,
                                               "--data.val_size", "12", "--trainer.default_root_dir",
                                               str(tmp_path / "run2")])
    assert "val_size 12 (from --data.val_size) must be between 1 and 11" in line, line
    assert "source's default (1 here)" in line, line
    for_folders = write_train_config(tmp_path / "mine.yaml", tmp_path / "run3", folder_root, 2, model=TINY,
                                     data={"source": "folder", "val_size": 50})
    line = one_error_line(capsys, train_main, ["--config", str(for_folders), "--wandb", "disabled"])
    assert f"val_size 50 (from data.val_size in {for_folders}; --data.val_size N overrides it)" in line, line
    evaluate = ["--ckpt", str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "--device", "cpu", *on_folder]
    line = one_error_line(capsys, evaluate_main, [*evaluate, "--val_size", "12"])
    assert "val_size 12 (from --val_size) must be between 1 and 11" in line, line


def test_model_that_does_not_fit_the_data_is_refused(tmp_path, capsys, imagenet_root, folder_root):
    line = one_error_line(capsys, train_main, [
        "--config", str(write_train_config(tmp_path / "a.yaml", tmp_path / "a", imagenet_root, 2,
                                           model={**TINY, "image_size": 4}, data={"source": "imagenet"})),
        "--wandb", "disabled"])
    assert f"--data.source imagenet --data.root {imagenet_root} holds 8x8 images but the model is 4x4" in line
    assert "set --model.config.image_size 8" in line
    for source, root, classes, needle in [("imagenet", imagenet_root, 10, "has 1000 classes"),
                                          ("folder", folder_root, 3, "has 2 classes")]:
        line = one_error_line(capsys, train_main, [
            "--config", str(write_train_config(tmp_path / "b.yaml", tmp_path / "b", root, 2,
                                               model={**TINY, "num_classes": classes}, data={"source": source})),
            "--wandb", "disabled"])
        assert needle in line and "--model.config.num_classes" in line, line
    flat = tmp_path / "flat"
    write_folder(flat, classes=())
    line = one_error_line(capsys, train_main, [
        "--config", str(write_train_config(tmp_path / "c.yaml", tmp_path / "c", flat, 2,
                                           model={**TINY, "num_classes": 2}, data={"source": "folder"})),
        "--wandb", "disabled"])
    assert "class-conditional" in line and "no labels" in line and "num_classes 0" in line, line
    assert not (tmp_path / "a" / "checkpoints").exists()
    # evaluate and sample: the checkpoint's model is 16x16, the data 8x8
    ckpt = tmp_path / "sixteen"
    save_pretrained(tiny_model(head="dmol", image_size=16, query_block_length=16), ckpt)
    data = ["--data.source", "imagenet", "--data.root", str(imagenet_root)]
    line = one_error_line(capsys, evaluate_main, ["--ckpt", str(ckpt), "--split", "val", *data])
    assert "holds 8x8 images but the checkpoint's model is 16x16" in line, line
    # --rows that fits the 16x16 model: the default, 16, is refused before the data is read
    line = one_error_line(capsys, sample_main, ["--ckpt", str(ckpt), "--task", "complete", "--rows", "8", "--out",
                                                str(tmp_path / "o"), *data])
    assert "holds 8x8 images but the checkpoint's model is 16x16" in line, line


@pytest.mark.parametrize("case", ["missing", "rows", "label 1001", "empty folder", "unreadable folder",
                                  "crop with imagenet", "folder test split"])
def test_bad_data_through_the_commands(tmp_path, capsys, case):
    root = tmp_path / "data"
    root.mkdir()
    source, extra = "imagenet", []
    if case in ("missing", "rows", "label 1001"):
        bad_imagenet(root, case)
    elif case == "empty folder":
        source = "folder"
        (root / "readme.txt").write_text("no images here")
    elif case == "unreadable folder":
        source = "folder"
        (root / "a.png").write_text("not a PNG")
    elif case == "crop with imagenet":
        write_imagenet(root)
        extra = ["--data.crop", "celeba"]
    if case == "folder test split":
        write_folder(root)
        ckpt = tmp_path / "m"
        save_pretrained(tiny_model(head="dmol", image_size=SIDE, query_block_length=16), ckpt)
        line = one_error_line(capsys, evaluate_main, ["--ckpt", str(ckpt), "--data.source", "folder",
                                                      "--data.root", str(root), "--split", "test"])
        assert "no test split" in line and "val" in line, line
        return
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", root, 2, model=TINY, data={"source": source})
    line = one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled", *extra])
    needle = {"missing": "no downsampled ImageNet train files", "rows": "expected uint8 (N, 3·S·S)",
              "label 1001": "expected 1..1000", "empty folder": "no PNG or JPEG images",
              "unreadable folder": "none of the image files", "crop with imagenet": "--data.crop applies to"}[case]
    assert needle in line, line


# ----- CIFAR-10's download ------------------------------------------------------------------

@pytest.fixture
def offline_network(monkeypatch, no_cifar_download):
    """torchvision's own download code, reaching no network: urlopen fails as on a machine without
    one (no_cifar_download, which this undoes, fails before torchvision creates the root, which hid it)."""
    import urllib.error
    import urllib.request

    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.utils as utils

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(cifar, "download_and_extract_archive", utils.download_and_extract_archive)
    monkeypatch.setattr(urllib.request, "urlopen", offline)


@pytest.mark.usefixtures("offline_network")
@pytest.mark.parametrize("given", [True, False], ids=["mistyped-root", "default-root"])
def test_a_failed_download_creates_no_folder_in_train_evaluate_or_sample(tmp_path, capsys, monkeypatch, given):
    """Issue 111: a mistyped --data.root (or none: ./data) without a network was created, empty, by
    torchvision before its download failed; each command now stops on one line and leaves nothing."""
    monkeypatch.chdir(tmp_path)
    mistyped = tmp_path / "dta"
    root = ["--data.root", str(mistyped)] if given else []
    before = sorted(tmp_path.rglob("*"))
    ckpt = tmp_path / "m"
    save_pretrained(tiny_model(head="dmol"), ckpt)
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", mistyped, 2)
    if not given:  # the default root: no data.root in the config
        settings = yaml.safe_load(config.read_text())
        del settings["data"]["root"]
        config.write_text(yaml.safe_dump(settings))
    commands = [
        (train_main, ["--config", str(config), "--wandb", "disabled"]),
        (evaluate_main, ["--ckpt", str(ckpt), "--split", "val", "--device", "cpu", *root]),
        (sample_main, ["--ckpt", str(ckpt), "--task", "complete", "--rows", "2", "--out", str(tmp_path / "o"),
                      *root])]
    for command, args in commands:
        line = one_error_line(capsys, command, args)
        if given:  # issue 126: never downloaded into (with a network it was)
            assert f"--data.root {mistyped} does not exist: check the path" in line, line
        else:
            assert "no CIFAR-10" in line and "could not download" in line, line
    made = set(tmp_path.rglob("*")) - set(before) - {ckpt, *ckpt.iterdir(), tmp_path / "c.yaml"}
    assert not made, sorted(made)  # not the root, ./data, a download's temporary folder nor the run


def fake_cifar_download(url, download_root, filename=None, md5=None, **_):
    """What torchvision's download leaves: its archive and the extracted batches (4 images each)."""
    folder = Path(download_root) / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    (Path(download_root) / filename).write_bytes(b"archive")
    for number, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        images = rgb_images(4, 32, seed=number)
        with (folder / name).open("wb") as handle:
            pickle.dump({"data": images.transpose(0, 3, 1, 2).reshape(4, -1), "labels": [number] * 4}, handle)
    with (folder / "batches.meta").open("wb") as handle:
        pickle.dump({"label_names": [str(label) for label in range(10)]}, handle)


def test_a_download_creates_the_root_only_when_complete(tmp_path, monkeypatch):
    """The download goes to a temporary folder in the nearest existing folder above the root, then
    moves in: the default root and its parents appear holding the batches, and nothing else is left.
    A given root that does not exist is refused, never downloaded into (issue 126: a mistyped one was)."""
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "download_and_extract_archive", fake_cifar_download)
    # the fake batches have not CIFAR-10's checksums: a file present is whole
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    above = tmp_path / "above"
    above.mkdir()
    root = above / "new" / "cifar"
    with pytest.raises(DataError, match="does not exist: check the path"):
        load("cifar10", above / "mistyped", "test")
    assert list(above.iterdir()) == []
    monkeypatch.setenv("IMAGETX_DATA", str(root))  # the default root takes a download
    images, labels = load("cifar10", root, "test")
    assert images.shape == (4, 32, 32, 3) and labels.tolist() == [5] * 4
    assert np.array_equal(images.numpy(), rgb_images(4, 32, seed=5))
    assert sorted(path.name for path in above.iterdir()) == ["new"]  # no temporary folder left
    assert sorted(path.name for path in (above / "new").iterdir()) == ["cifar"]
    assert sorted(path.name for path in root.iterdir()) == ["cifar-10-batches-py"]  # the archive not kept


# ----- presets -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["imagenet32.yaml", "imagenet64.yaml", "faces_superres.yaml"])
def test_data_presets_hold_valid_data_settings(name):
    from imagetx.model.config import ModelConfig

    values = yaml.safe_load((REPO / "configs" / name).read_text())
    config = ModelConfig.from_dict(values["model"]["config"]).validate()
    assert set(values["data"]) <= set(inspect.signature(ImageDataModule).parameters), name
    data = ImageDataModule(**values["data"])
    assert data.source == ("folder" if name.startswith("faces") else "imagenet")
    assert config.image_size == (64 if name == "imagenet64.yaml" else 32) and config.num_classes == 0
    if name.startswith("faces"):
        assert data.crop == "celeba" and config.superres and config.superres.low_res_size == 8


# ----- the pools memory-mapped, shared by the processes of a machine (sources/mapped.py) ----------

def test_two_processes_reading_at_once_share_one_mapped_copy_and_no_reader_holds_twice_the_data():
    """scripts/data_memory.py: two processes read a synthetic 64x64 ImageNet at once (the second waits
    for the first to write the mapped copy): each one's PSS grows by about half the data, not all of
    it (each in its own memory: 1.04x), and the writer's reading peaks at the data and one batch
    file (a concatenation: 2x)."""
    from scripts import data_memory

    summary = data_memory.main(["--images", "8000", "--side", "64", "--processes", "2"])
    assert summary["same_images"]
    # shared: 0.5 each, private: 1.04 each; the bound their midpoint, as a busy machine's page accounting
    # puts a shared reader up to about 0.7 (0.672 seen with a training run beside it)
    assert max(summary["pss_growth_x"]) <= (0.5 + 1.04) / 2, summary
    assert max(summary["read_peak_x"]) <= 1.15, summary  # 1 + one of the 10 batch files + labels


def test_a_pool_is_read_from_its_mapped_copy_while_the_source_is_unchanged(tmp_path, monkeypatch):
    from helpers import write_cifar_npz
    from imagetx.data.sources import Reader, cifar10

    root = tmp_path / "data"
    train_images, *_ = write_cifar_npz(root, train_sizes=(6, 6))
    first = Reader("cifar10", root, val_size=2).split("train")
    assert isinstance(first.images.base, np.memmap) or isinstance(first.images, np.memmap)
    assert (np.asarray(first.images) == train_images[:10]).all()
    copies = list((root / ".imagetx-cache" / "mapped").glob("cifar10-train-*"))
    assert len(copies) == 1
    # unchanged source: the copy is read, not the shards (reading one would fail; a chmod to make
    # one unreadable would change its change time, which the fingerprint counts as a change)
    with monkeypatch.context() as patched:
        patched.setattr(cifar10, "read_shard", lambda *args: pytest.fail("a shard was read"))
        again = Reader("cifar10", root, val_size=2).split("train")
    assert (np.asarray(again.images) == train_images[:10]).all()
    # a changed source: a new copy, the old one removed
    write_cifar_npz(root, train_sizes=(6, 6), seed=5)
    changed, *_ = (np.load(root / "train-0.npz")["images"],)
    third = Reader("cifar10", root, val_size=2).split("train")
    assert (np.asarray(third.images[:6]) == changed).all()
    now = list((root / ".imagetx-cache" / "mapped").glob("cifar10-train-*"))
    assert len(now) == 1 and now != copies
