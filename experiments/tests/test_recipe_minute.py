"""experiments/recipe_minute_table.py and subset_shards.py: the table's differences and
projection from a runs folder, and a subset folder that keeps the same val images."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from experiments.recipe_minute_table import GPU_IMAGES_PER_S, SLOPE_PER_DOUBLING
from experiments.tests.conftest import REPO_ROOT


def run(module: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"experiments.{module}", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT)


def fake_run(folder, bpd: float) -> None:
    folder.mkdir(parents=True)
    (folder / "sweep.log").write_text(f"$ python -m imagetx.evaluate ...\n{json.dumps({'bpd': bpd, 'images': 5000})}\n")


def test_differences_are_taken_seed_by_seed_and_projected_by_the_gpu_speed(tmp_path):
    for name, bpd in [("base_s0", 4.0), ("base_s1", 4.1), ("full_s0", 3.9), ("full_s1", 4.05), ("wide_s1", 3.7)]:
        fake_run(tmp_path / name, bpd)
    done = run("recipe_minute_table", str(tmp_path))
    assert done.returncode == 0, done.stderr
    variants = json.loads(done.stdout.strip().splitlines()[-1])["variants"]
    full, wide = variants["full"], variants["wide"]
    assert math.isclose(full["delta_mean"], (-0.1 - 0.05) / 2)
    speed = GPU_IMAGES_PER_S["full causal (Flash), batch 120"] / GPU_IMAGES_PER_S["recipe, batch 120"]
    assert math.isclose(full["projected_per_gpu_minute"], -0.075 + SLOPE_PER_DOUBLING * math.log2(speed))
    assert full["projected_per_gpu_minute"] > full["delta_mean"]  # slower on the GPU: worth less per minute
    assert list(wide["delta"]) == ["1"] and math.isclose(wide["delta"]["1"], -0.4)  # seed 1 only, against base_s1
    assert variants["rows4"]["delta_mean"] is None  # nothing ran


@pytest.mark.slow
def test_a_subset_keeps_the_first_images_and_the_same_val(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    images = np.zeros((6000, 32, 32, 3), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = np.arange(6000) % 256, np.arange(6000) // 256  # each image its own
    labels = (np.arange(6000) % 10).astype(np.uint8)
    np.savez(source / "train-0.npz", images=images[:3000], labels=labels[:3000])
    np.savez(source / "train-1.npz", images=images[3000:], labels=labels[3000:])
    done = run("subset_shards", str(source), str(tmp_path / "out"), "--train", "100")
    assert done.returncode == 0, done.stderr
    out = np.load(tmp_path / "out" / "train-0.npz")
    assert np.array_equal(out["images"][:100], images[:100]) and np.array_equal(out["images"][100:], images[1000:])
    assert np.array_equal(out["labels"][100:], labels[1000:]) and len(out["labels"]) == 5100
    assert run("subset_shards", str(source), str(tmp_path / "bad"), "--train", "1001").returncode != 0  # into val
