"""What the experiment scripts' tests share: a tiny model, CIFAR-10 stand-ins on disk, a
tiny training config.

These tests run the scripts as their users do, ``python -m experiments.NAME`` from the
repository root (``REPO_ROOT``), in a subprocess. The helpers are small copies of those
in tests/conftest.py, which is not importable from here (tests/ is not a package).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from imagetx import ImageTransformer, build_model
from imagetx.io.older import model_config

REPO_ROOT = Path(__file__).resolve().parents[2]

# Tiny tensors on two shared cores: intra-op threads only add synchronisation cost.
torch.set_num_threads(1)

# A tiny model: one layer, d_model 16, dropout 0. Image size and head come per test.
TINY = dict(n_layers=1, d_model=16, n_heads=2, d_filter=32, dropout=0.0, attention="local_1d",
            memory_blocks=1, position_encoding="sinusoidal", norm="post", mixture_components=2)  # one level (io.older)

# The tiny DMOL model the training config below trains.
TINY_TRAIN_MODEL = dict(image_size=32, head="dmol", mixture_components=2, n_layers=1, d_model=16, d_filter=32,
                        dropout=0.0, position_encoding="learned",
                        attention=dict(n_heads=2, kind="local_1d", query_block_length=256))


def tiny_model(seed: int = 0, **overrides) -> ImageTransformer:
    """A seeded tiny ImageTransformer in eval mode; any ModelConfig field can be overridden, a
    section's by its own name (the one-level form older files hold, ``imagetx.io.older`` reads)."""
    torch.manual_seed(seed)
    return build_model(model_config({**TINY, **overrides})).eval()


def write_cifar_npz(root: Path, train_sizes=(6, 6), seed: int = 0) -> np.ndarray:
    """Shards train-0.npz, train-1.npz, ... of seeded random CIFAR-shaped images under root
    (``images`` uint8 (N, 32, 32, 3), ``labels`` (N,)); -> all the images, in shard order."""
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, count in enumerate(train_sizes):
        rng = np.random.default_rng(seed + i)
        images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
        np.savez(root / f"train-{i}.npz", images=images, labels=rng.integers(0, 10, size=(count,), dtype=np.uint8))
        shards.append(images)
    return np.concatenate(shards)


def write_train_config(path: Path, root_dir: Path, data_root: Path, max_steps: int = 3) -> Path:
    """A YAML config for imagetx.train: the tiny DMOL model, batches of 2, CPU, no progress bar."""
    config = {
        "seed_everything": 0,
        "trainer": {"default_root_dir": str(root_dir), "accelerator": "cpu", "devices": 1,
                    "max_steps": max_steps, "val_check_interval": 2, "check_val_every_n_epoch": None,
                    "limit_val_batches": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    "log_every_n_steps": 1},
        "model": {"config": TINY_TRAIN_MODEL, "optimizer": "adam_noam", "peak_lr": 0.003, "warmup_steps": 2},
        "data": {"root": str(data_root), "batch_size": 2, "eval_batch_size": 2, "val_size": 2},
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield


@pytest.fixture
def data_root(tmp_path):
    """npz shards of 12 training images (val_size 2 leaves 10)."""
    root = tmp_path / "data"
    write_cifar_npz(root, train_sizes=(6, 6))
    return root
