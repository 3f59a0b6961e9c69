"""Determinism on CPU: the same seed gives the same training losses and the same samples;
another seed gives others."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers import tiny_model, train_metrics, write_cifar_npz, write_train_config
from imagetx import save_pretrained
from imagetx.sample import main as sample_main
from imagetx.train import main as train_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def losses(tmp_path, name, seed, data_root):
    run_dir = tmp_path / name
    config = write_train_config(tmp_path / f"{name}.yaml", run_dir, data_root, 4, model={"dropout": 0.1},
                                data={"random_flip": True}, top={"seed_everything": seed})
    train_main(["--config", str(config), "--wandb", "disabled"])
    return train_metrics(run_dir)


def test_same_seed_same_training_losses(tmp_path):
    data_root = tmp_path / "data"
    write_cifar_npz(data_root, train_sizes=(6, 6))
    first, second = losses(tmp_path, "a", 0, data_root), losses(tmp_path, "b", 0, data_root)
    assert sorted(first) == [0, 1, 2, 3]
    assert first == second  # exactly: same initialisation, batches, flips and dropout
    other = losses(tmp_path, "c", 1, data_root)
    assert other[0] != first[0]


def sample_grid(tmp_path, capsys, ckpt, seed, name):
    sample_main(["--ckpt", str(ckpt), "--task", "generate", "--count", "2", "--seed", str(seed),
                 "--out", str(tmp_path / name)])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return np.asarray(Image.open(summary["files"][0]))


def test_same_seed_same_samples(tmp_path, capsys):
    ckpt = tmp_path / "model"
    save_pretrained(tiny_model(seed=5, image_size=8, head="dmol", query_block_length=16), ckpt)  # 64 steps per image
    first = sample_grid(tmp_path, capsys, ckpt, 7, "a")
    assert np.array_equal(first, sample_grid(tmp_path, capsys, ckpt, 7, "b"))
    assert not np.array_equal(first, sample_grid(tmp_path, capsys, ckpt, 8, "c"))
