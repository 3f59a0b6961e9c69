"""Training data streamed by LitData (imagetx/data/streaming.py), on a local folder: written once
from npz shards, an epoch of training through ``--data.source litdata`` holds every training image
once, and a run resumed mid-epoch goes on exactly as an uninterrupted one (LitData's loader state
kept by Lightning in the checkpoint)."""

from __future__ import annotations

import subprocess
import sys

import lightning as L
import numpy as np
import pytest
import torch

from helpers import train_metrics, write_cifar_npz, write_train_config
from imagetx.data.streaming import flipped
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


class SeenImages(L.Callback):
    """Records the training images of every batch (as bytes, the flips undone by keeping both)."""

    seen: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        SeenImages.seen += [image.cpu().numpy().tobytes() for image in batch["images"]]


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """The stream, written once for the module (LitData's optimize starts worker processes: seconds)."""
    tmp_path = tmp_path_factory.mktemp("streamed")
    root = tmp_path / "data"
    train_images, *_ = write_cifar_npz(root, train_sizes=(6, 6))
    out = tmp_path / "streamed"
    # the command, in a process of its own: LitData's optimize sets a SIGINT handler of its own in the
    # process that runs it, which later tests' Ctrl-C would call
    subprocess.run([sys.executable, "-m", "imagetx.data.streaming", "--data.source", "cifar10", "--data.root",
                    str(root), "--data.val_size", "2", "--out", str(out)], check=True, capture_output=True)
    return out, train_images


def config(tmp_path, run_dir, out, name, max_steps, callbacks=()):
    return write_train_config(tmp_path / name, run_dir, out, max_steps=max_steps, val_check_interval=100,
                              model={"dropout": 0.1}, data={"source": "litdata", "val_size": None},
                              top={"checkpoint_every_n_steps": 1},
                              callbacks=[{"class_path": f"test_streaming.{cls}", "init_args": {}} for cls in callbacks])


@pytest.mark.slow
def test_an_epoch_streamed_holds_every_training_image_once(tmp_path, streamed):
    out, train_images = streamed
    SeenImages.seen = []
    main(["--config", str(config(tmp_path, tmp_path / "run", out, "epoch.yaml", 5, ["SeenImages"])),
          "--wandb", "disabled"])
    expected = sorted(image.tobytes() for image in train_images[:10])  # the 10 of train (val: the last 2)
    assert sorted(SeenImages.seen) == expected  # 5 steps of 2 = one epoch, each image once


@pytest.mark.slow
def test_a_streamed_run_resumed_mid_epoch_goes_on_exactly(tmp_path, streamed):
    out, _ = streamed
    run_dir, whole = tmp_path / "run", tmp_path / "whole"
    main(["--config", str(config(tmp_path, run_dir, out, "cut.yaml", 3)), "--wandb", "disabled",
          "--data.random_flip", "true"])
    main(["--config", str(config(tmp_path, run_dir, out, "cut.yaml", 3)), "--wandb", "disabled",
          "--data.random_flip", "true", "--resume", "last", "--trainer.max_steps", "8"])
    main(["--config", str(config(tmp_path, whole, out, "whole.yaml", 8)), "--wandb", "disabled",
          "--data.random_flip", "true"])
    assert train_metrics(run_dir) == train_metrics(whole)
    resumed = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    uncut = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=False)
    assert resumed["global_step"] == uncut["global_step"] == 8
    for key, value in uncut["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key


def test_a_streamed_image_s_flip_is_a_function_of_seed_epoch_and_image():
    flips = [[flipped(0, epoch, index) for index in range(64)] for epoch in (1, 2)]
    assert flips[0] == [flipped(0, 1, index) for index in range(64)]
    assert flips[0] != flips[1] and 16 < sum(flips[0]) < 48  # about half, and another draw each epoch
