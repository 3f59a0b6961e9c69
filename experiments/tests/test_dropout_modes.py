"""experiments/dropout_modes.py: a model's bits/dim with dropout off, on, and on in one place only."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from experiments.dropout_modes import scores
from experiments.tests.conftest import REPO_ROOT, tiny_model
from imagetx import save_pretrained


def test_without_dropout_every_mode_scores_alike_and_with_it_train_mode_differs():
    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    plain = scores(tiny_model(image_size=8, head="dmol"), images, draws=2)
    assert len(set(plain.values())) == 1
    model = tiny_model(image_size=8, head="dmol", dropout=0.3)
    noisy = scores(model, images, draws=2)
    assert noisy["eval"] != noisy["train_mode"] and noisy["eval"] != noisy["input_dropout_only"]
    assert noisy["eval"] != noisy["residual_dropout_only"]
    assert not any(module.training for module in model.modules())  # handed back in eval mode
    model.train()
    assert scores(model, images, draws=2)["eval"] == noisy["eval"]
    assert all(module.training for module in model.modules())  # and in train mode, where it was in it


def test_the_command_scores_the_splits_first_images(tmp_path, data_root):
    save_pretrained(tiny_model(image_size=32, head="dmol", dropout=0.2), tmp_path / "model")
    done = subprocess.run([sys.executable, "-m", "experiments.dropout_modes", str(tmp_path / "model"),
                           "--data.root", str(data_root), "--val_size", "2", "--split", "val", "--count", "5"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    figures = result["models"][str(tmp_path / "model")]
    assert result["count"] == 2 and figures["dropout"] == 0.2 and figures["eval"] > 0
