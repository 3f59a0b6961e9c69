"""scripts/gpu_lease.sh end to end on the CPU (``DRY_RUN=1``), with a tiny preset, as a lent GPU
machine's calls run it (docs/gpu.md): setup, tests, launch, wait, finish. So that a typo or a
step that hides its failure is found here, not in the 30 minutes of a lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_cifar_npz, write_train_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_lease.sh"


def lease(step: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *step], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def dry_env(tmp_path):
    stage = tmp_path / "stage"
    write_cifar_npz(stage / "a", train_sizes=(6,))  # train-0.npz, carried by one call ...
    (stage / "b").mkdir()
    (stage / "a" / "train-0.npz").rename(stage / "b" / "train-1.npz")  # ... and train-1.npz by another
    write_cifar_npz(stage / "a", train_sizes=(6,))
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", tmp_path / "unused", 3)
    out = tmp_path / "out"
    out.mkdir()
    return dict(os.environ, DRY_RUN="1", WORK=str(tmp_path / "work"), STAGE=str(stage), OUT=str(out),
                SITE=str(tmp_path / "site"), CONFIG=str(config), PYTHON=sys.executable, LAUNCH_WAIT="5", POLL="2",
                GRID_SAMPLES="2", COMPLETIONS="2", EVAL_BATCH="2", VAL_SIZE="2", WANDB_MODE="disabled")


@pytest.mark.slow
def test_a_lease_runs_every_step_and_brings_the_results_back(dry_env):
    out = Path(dry_env["OUT"])
    done = lease(["setup"], dry_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (Path(dry_env["WORK"]) / "data").iterdir()) == ["train-0.npz", "train-1.npz"]

    refused = lease(["launch", "00:00:02:00"], dry_env)  # the tests have not passed yet
    assert refused.returncode == 1 and "CUDA correctness tests have not passed" in refused.stderr

    for step in (["tests"], ["launch", "00:00:02:00", "--data.val_size", "2"], ["wait", "120"], ["finish", "60"]):
        done = lease(step, dry_env)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    names = sorted(p.name for p in out.iterdir())
    assert {"model.safetensors", "config.json", "train.log", "metrics.csv", "eval_val.json"} <= set(names), names
    assert sum(name.endswith(".png") for name in names) == 2, names  # the sample grid and the completion grid
    scored = json.loads((out / "eval_val.json").read_text())
    assert scored["images"] == 2 and scored["bpd"] > 0


def test_a_failing_step_fails_the_call(dry_env):
    finish = lease(["finish", "5"], dry_env)  # no run, no checkpoint: export fails, and so does the step
    assert finish.returncode != 0
    assert not any(Path(dry_env["OUT"]).iterdir())
    unknown = lease(["lanch"], dry_env)
    assert unknown.returncode == 2 and "usage:" in unknown.stderr
