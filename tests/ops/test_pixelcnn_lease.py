"""ops/pixelcnn_lease.sh end to end on the CPU (``DRY_RUN=1``), with a tiny PixelCNN++, as a lent GPU
machine's calls run it: setup, begin (the CUDA tests' stand-in beside the run's first steps), await,
launch, wait, finish, a finish that stops a run still training, and a run that goes non-finite
followed by one in float32 for the time left. So that a typo or a step that hides its failure is
found here, not in a lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers import stage_shards
from imagetx.data.images import GRID_SCALE, grid_image

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ops" / "pixelcnn_lease.sh"


def lease(step: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *step], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_pixelcnn_lease_on_the_cpu_brings_back_its_result_curve_and_samples(tmp_path):
    stage = stage_shards(tmp_path / "stage")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, DRY_RUN="1", WORK=str(tmp_path / "work"), STAGE=str(stage), OUT=str(out),
               SITE=str(tmp_path / "site"), PYTHON=sys.executable, LAUNCH_WAIT="1", POLL="1", CURVE_SECONDS="1",
               GRID_SAMPLES="2", OMP_NUM_THREADS="1")  # a grid of 2: 16 would draw for 40 s of the suite
    refused = lease(["launch"], env)  # no budget given: the step says how to call it, and starts nothing
    assert refused.returncode != 0 and "launch needs the training seconds" in refused.stderr
    assert not (tmp_path / "work" / "pixelcnn").exists()
    for step in (["setup"], ["begin"], ["await", "300"], ["launch", "3"], ["wait", "120"], ["finish", "120"]):
        done = lease(step, env)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        if step[0] == "await":  # the tests (ops/cuda_suite.py's choice) beside the run's own first steps
            assert "CUDA tests: " in done.stdout and "the run's compiled steps exit 0" in done.stdout, done.stdout
    assert {"result.json", "train.log", "samples.png", "pixelcnn_warm.log", "cuda_tests.log"} <= {
        p.name for p in out.iterdir()}
    result = json.loads((out / "result.json").read_text())
    assert result["minutes"] >= 0.05 and result["images_seen"] == 2 * result["steps"]  # 3 s of batches of 2
    assert result["val_images"] == 2 and result["settings"]["nr_filters"] == 8
    assert result["curve"] and all(point["val_bpd"] > 0 for point in result["curve"])  # every CURVE_SECONDS
    assert [p["steps"] for p in result["curve"]] == sorted(p["steps"] for p in result["curve"])
    assert result["curve"][-1]["steps"] == result["steps"]  # a point at the end too
    assert result["images_per_sec"] > 0 and result["flops_per_image"] > 0
    assert result["mfu"] is None and result["peak_memory_gib"] is None  # a CPU: no peak, no CUDA allocator
    assert result["stopped_by"] is None
    one_row_of_two = grid_image([torch.zeros(2, 32, 32, 3, dtype=torch.uint8)]).size  # GRID_SAMPLES reached the run
    assert Image.open(out / "samples.png").size == tuple(GRID_SCALE * side for side in one_row_of_two)

    # A run that outlives finish's wait: its training is stopped, and it still scores and hands back its result.
    for produced in out.iterdir():
        produced.unlink()
    done = lease(["launch", "600"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = tmp_path / "work" / "pixelcnn" / "train.log"
    for _ in range(120):  # until the run is past its start
        if "PixelCNN++: " in log.read_text():  # built, its signal handler in place
            break
        time.sleep(0.5)
    done = lease(["finish", "1"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stopping its training" in done.stderr
    stopped = json.loads((out / "result.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["minutes"] < 1 and stopped["val_bpd"] > 0
    assert not (out / "samples.png").exists()  # the grid is left out of a stopped run

    # A first run whose steps go non-finite (a learning rate of 1e30) stops at once; float32 trains the time left.
    for produced in out.iterdir():
        produced.unlink()
    diverging = dict(env, PRIMARY_ARGS="--lr 1e30 --progress-seconds 0", FALLBACK_MIN_SECONDS="1", DRAW_SAMPLES="0")
    for step in (["launch", "4"], ["wait", "120"], ["finish", "120"]):
        done = lease(step, diverging)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    first_run = json.loads((out / "result_first.json").read_text())
    assert first_run["nonfinite_stop"].startswith("gradients are not finite at step ") and first_run["minutes"] < 0.05
    fallback = json.loads((out / "result.json").read_text())
    assert fallback["nonfinite_stop"] is None and fallback["settings"]["lr"] == 1e-3
    assert 0 < fallback["minutes"] <= 4 / 60 and 7.5 < fallback["val_bpd"] < 10  # random images: about 8 bits
    assert "the first run stopped on a non-finite step" in (out / "train.log").read_text()
