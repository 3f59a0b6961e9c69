"""Helpers the tests import (``from helpers import ...``): tiny configurations, models and images,
CIFAR-shaped npz shards, train-CLI configs, and the check of a command's one-line error.
Fixtures live in conftest.py.

Everything here is deliberately small (d_model 16, one or two layers, 4×4 images) so
that the whole suite runs in seconds on two shared CPU cores.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from imagetx import ImageTransformer, ModelConfig, SuperResolutionTransformer, build_model
from imagetx.io.older import model_config
from imagetx.model.attention import FLEX_BLOCK_SIZE
from imagetx.model.transformer import previous_values


# Files the tests read: real CIFAR-10 val images, compressed files made by earlier versions.
ASSETS = Path(__file__).parent / "assets"

# The val bits/dim on the shipped completion model's card (pretrained/completion/README.md), which
# the demo shows beside its samples: one place to change when the model is shipped anew.
COMPLETION_CARD_BPD = "3.493"


# Defaults for a tiny model, in the one-level form (tiny_config). The 2D block (2, 2) tiles both the
# categorical grid of a 4×4 image (4×12 sub-pixels) and the DMOL grid (4×4 pixels).
TINY = dict(
    image_size=4,
    head="categorical",
    n_layers=1,
    d_model=16,
    n_heads=2,
    d_filter=32,
    dropout=0.0,
    attention="local_1d",
    query_block_length=8,
    memory_blocks=1,
    query_block_shape=(2, 2),
    memory_flange=(1, 1),
    position_encoding="sinusoidal",
    num_classes=0,
    norm="post",
    mixture_components=2,
    encoder_layers=0,
    low_res_size=2,
)


def tiny_config(**overrides) -> ModelConfig:
    """A ModelConfig for a tiny model with dropout 0. Any field can be overridden by its name, a
    section's as well: the one-level form older files hold, which ``imagetx.io.older`` reads
    (``attention`` the kind, ``encoder_layers`` > 0 a super-resolution model)."""
    return model_config({**TINY, **overrides})


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, attention_kernel: str = "auto",
               flex_block_size: int = FLEX_BLOCK_SIZE, **overrides) -> ImageTransformer:
    """A seeded tiny ImageTransformer in eval mode, its attention run by ``attention_kernel`` in tiles
    of ``flex_block_size`` (``build_model``)."""
    torch.manual_seed(seed)
    model = build_model(tiny_config(**overrides), attention_kernel, flex_block_size)
    return model.to(dtype).eval()


def random_images(batch: int, size: int, seed: int = 0, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Seeded random images (batch, size, size, 3) with values 0..255."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, size, size, 3), generator=gen).to(dtype)


def random_labels(batch: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_classes, (batch,), generator=gen)


# ----- CIFAR-10 stand-ins for the data, training, evaluation and CLI tests ----------------

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def cifar_arrays(count: int, seed: int = 0):
    """Seeded random CIFAR-shaped arrays: images uint8 (count, 32, 32, 3), labels uint8 (count,)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(count,), dtype=np.uint8)
    return images, labels


def write_npz_shard(path, images, labels) -> None:
    """One shard in the npz format imagetx reads: images uint8 (N, 32, 32, 3), labels (N,)."""
    import numpy as np

    np.savez(path, images=images, labels=labels)


def write_cifar_npz(root, train_sizes=(6, 6), test_size: int = 0, seed: int = 0):
    """train-0.npz, train-1.npz, ... (and test-0.npz) under root; returns the concatenated arrays.

    -> (train_images, train_labels, test_images, test_labels) as numpy arrays in shard order.
    """
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    parts = [cifar_arrays(n, seed=seed + i) for i, n in enumerate(train_sizes)]
    for i, (images, labels) in enumerate(parts):
        write_npz_shard(root / f"train-{i}.npz", images, labels)
    train_images = np.concatenate([p[0] for p in parts])
    train_labels = np.concatenate([p[1] for p in parts])
    test_images = test_labels = None
    if test_size:
        test_images, test_labels = cifar_arrays(test_size, seed=seed + 100)
        write_npz_shard(root / "test-0.npz", test_images, test_labels)
    return train_images, train_labels, test_images, test_labels


def stage_shards(stage):
    """Two 6-image shards as a lease's calls carry them (ops/README.md, "A lease, call by call"):
    train-0.npz in stage/a, train-1.npz in stage/b. -> stage."""
    write_cifar_npz(stage / "a", train_sizes=(6,))  # train-0.npz, carried by one call ...
    (stage / "b").mkdir()
    (stage / "a" / "train-0.npz").rename(stage / "b" / "train-1.npz")  # ... and train-1.npz by another
    write_cifar_npz(stage / "a", train_sizes=(6,))
    return stage


# ----- reliability tests: tiny training runs driven through the train CLI -----------------

TINY_TRAIN_MODEL = dict(image_size=32, head="dmol", mixture_components=2, n_layers=1, d_model=16, d_filter=32,
                        dropout=0.0, position_encoding="learned",
                        attention=dict(n_heads=2, kind="local_1d", query_block_length=256))


def with_changes(config: dict, changes: dict) -> dict:
    """``config`` (a model config as YAML gives it) with ``changes``; a section's changes (a mapping
    under ``attention`` or ``superres``) update the section's fields, the rest kept."""
    out = dict(config)
    for name, value in changes.items():
        section = out.get(name)
        out[name] = {**section, **value} if isinstance(section, dict) and isinstance(value, dict) else value
    return out


def write_train_config(path, root_dir, data_root, max_steps=3, model=None, data=None, top=None, **trainer):
    """A YAML config for imagetx.train: the tiny DMOL model, batches of 2, CPU, no progress bar.

    ``model`` updates model.config, ``data`` the data section, ``top`` top-level keys
    (e.g. checkpoint_every_n_steps), ``trainer`` the trainer section. Returns ``path``."""
    import yaml

    config = {
        "seed_everything": 0,
        "trainer": {"default_root_dir": str(root_dir), "accelerator": "cpu", "devices": 1,
                    "max_steps": max_steps, "val_check_interval": 2, "check_val_every_n_epoch": None,
                    "limit_val_batches": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    "log_every_n_steps": 1, **trainer},
        "model": {"config": with_changes(TINY_TRAIN_MODEL, model or {}), "optimizer": "adam_noam", "peak_lr": 0.003,
                  "warmup_steps": 2},
        "data": {"root": str(data_root), "batch_size": 2, "eval_batch_size": 2, "val_size": 2, **(data or {})},
        **(top or {}),
    }
    path.write_text(yaml.safe_dump(config))
    return path


def train_metrics(run_dir, column="train/bpd"):
    """{step: value} of one column over every metrics.csv of a run (all versions, in order)."""
    import csv

    values = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        with metrics.open() as handle:
            for row in csv.DictReader(handle):
                if row.get(column):
                    values[int(row["step"])] = float(row[column])
    return values


def assert_goes_on_as_the_whole_run(tmp_path, run_dir, config, steps: int) -> None:
    """``config`` rerun with ``--resume auto`` in the stopped ``run_dir`` ends as ``config`` run whole
    (in ``tmp_path/whole``): the same training metrics, ``steps`` steps and the same weights."""
    from imagetx.train import main

    main(["--config", str(config), "--wandb", "disabled", "--resume", "auto"])
    main(["--config", str(config), "--wandb", "disabled", "--trainer.default_root_dir", str(tmp_path / "whole")])
    assert train_metrics(run_dir) == train_metrics(tmp_path / "whole")
    resumed = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=False)
    assert resumed["global_step"] == whole["global_step"] == steps
    for key, value in whole["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key


def one_error_line(capsys, command, args) -> str:
    """Run a CLI expecting failure: exit 2, stderr ends in the only 'error:' line, no traceback."""
    with pytest.raises(SystemExit) as info:
        command(args)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.strip().splitlines() if line.strip()]
    assert lines and [line for line in lines if line.startswith("error:")] == lines[-1:], lines
    assert not any(line.startswith("usage:") for line in lines), lines  # not the whole usage text
    return lines[-1]


def weights_checkpoint(model: ImageTransformer, metadata: dict | None = None) -> dict:
    """A checkpoint dict as imagetx.train writes its weights (the LightningModule's ``model.*``
    state and the imagetx metadata), without any training state; ``metadata`` replaces the
    model's own."""
    from imagetx.io.checkpoint import imagetx_metadata

    state = {f"model.{name}": value for name, value in model.state_dict().items()}
    return {"imagetx": metadata if metadata is not None else imagetx_metadata(model.config), "state_dict": state}


def bits_per_dim(model, images: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
                 **options) -> Tensor:
    """``model.bits_per_dim``, given ``low_res`` where the model reads one."""
    return model.bits_per_dim(images, labels, low_res=low_res, **options)


def value_embeddings(model, targets: Tensor) -> Tensor:
    """(B, T, d): each target's value through the decoder's value embedding (with its own channel,
    categorical)."""
    decoder = decoder_of(model)
    return decoder.value_embedding(targets, decoder.step_channels)


def decoder_of(model):
    """The decoder of ``model``: itself, or the one a super-resolution model composes."""
    return model.decoder if isinstance(model, SuperResolutionTransformer) else model


def decode_embeddings(model, emb: Tensor, labels: Tensor | None = None, low_res: Tensor | None = None,
                      shift: bool = True, transforms: Tensor | None = None) -> Tensor:
    """(B, T, P) the head's parameters with ``emb`` (B, T, d) as the targets' value embeddings
    (a forward hook gives them in place of the decoder's own), each step's input the one before it
    as the model shifts them (``shift=False``, a negative control: its own), so that tests can
    differentiate with respect to what enters each step."""
    inputs = previous_values(emb) if shift else emb
    hook = decoder_of(model).value_embedding.register_forward_hook(lambda module, args, output: inputs)
    previous = torch.zeros(emb.shape[:2] + ((3,) if model.config.head == "dmol" else ()), dtype=torch.long)
    try:  # the values embedded are replaced by the hook: only their shape counts
        return model(previous, **model.conditioning(len(previous), labels, low_res=low_res, transforms=transforms))
    finally:
        hook.remove()


def dense_attention(q: Tensor, k: Tensor, v: Tensor, can_attend: Tensor, bias: Tensor | None = None) -> Tensor:
    """Reference softmax attention: q (B, h, Tq, e), k and v (B, h, Tk, e), can_attend (Tq, Tk) -> (B, h, Tq, e).

    Written out by hand (no fused kernel) so the fast paths have something
    independent to be compared with. A query with no allowed key gets zeros.
    ``bias`` (h, Tq, Tk): added to the scores of head i of every image.
    """
    scores = torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~can_attend, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhke->bhqe", weights, v)


# ----- pictures a user might give: good ones, and every kind of bad one -----------------------

def header_only_png(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims width x height pixels (a decompression
    bomb's claim): PIL reads the size from the header without decoding anything."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def write_pictures(directory, seed: int = 0) -> dict:
    """Pictures of every kind a user may upload, written into ``directory``:
    {name: (path, what the note or the error must say)}. ``good`` ones are read (the note says
    what was done), ``bad`` ones refused (the error says why); see ``PICTURE_KINDS``."""
    import numpy as np
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    paths = {name: directory / name for name in PICTURE_KINDS}
    Image.fromarray(rgb).save(paths["photo.jpg"], quality=95)
    Image.fromarray(rgb).convert("CMYK").save(paths["cmyk.jpg"])
    Image.fromarray(rng.integers(0, 65536, (40, 50)).astype(np.uint16)).save(paths["grey16.png"])
    Image.fromarray(rgb).convert("P").save(paths["palette.png"])
    alpha = np.concatenate([rgb, np.full((40, 50, 1), 128, np.uint8)], axis=2)
    Image.fromarray(alpha).save(paths["transparent.png"])
    frames = [Image.fromarray(np.roll(rgb, shift, axis=0)).convert("P") for shift in range(3)]
    frames[0].save(paths["animated.gif"], save_all=True, append_images=frames[1:])
    whole = directory / "whole.jpg"
    Image.fromarray(rgb).save(whole)
    paths["truncated.jpg"].write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    whole.unlink()
    paths["not_an_image.png"].write_text("this is text, not a PNG\n")
    paths["bomb.png"].write_bytes(header_only_png(100_000, 100_000))  # 10^10 pixels: past PIL's own limit
    paths["large.png"].write_bytes(header_only_png(8_000, 8_000))  # 64 MP: past imagetx's, under PIL's
    Image.fromarray(rgb[..., 0].astype(np.float32)).save(paths["float.tiff"])
    return {name: (paths[name], said) for name, said in PICTURE_KINDS.items()}


# name -> what reading it must say: the note of a good picture, the error of a bad one
PICTURE_KINDS = {
    "photo.jpg": "photo.jpg: 50x40, centre-cropped to 40x40, resized to 32x32",
    "cmyk.jpg": "converted from CMYK",
    "grey16.png": "16-bit values scaled to 8 bits",
    "palette.png": "palette colours looked up",
    "transparent.png": "transparent parts laid on white",
    "animated.gif": "the first of its 3 frames",
    "truncated.jpg": "truncated or damaged",
    "not_an_image.png": "not an image",
    "bomb.png": "decompression bomb",
    "large.png": "8000x8000, 64,000,000 pixels",
    "float.tiff": "floating-point pixels",
}
BAD_PICTURES = ("truncated.jpg", "not_an_image.png", "bomb.png", "large.png", "float.tiff")
