"""experiments/budget_sweep.py: the plan format, and a sweep whose scores equal evaluate's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from experiments.tests.conftest import REPO_ROOT, write_train_config
from imagetx import load_model
from imagetx.data.sources import load

VAL_SIZE = 2


def sweep(tmp_path, plan_text, data_root, *extra):
    plan = tmp_path / "plan.txt"
    plan.write_text(plan_text)
    return subprocess.run([sys.executable, "-m", "experiments.budget_sweep", "--plan", str(plan),
                           "--data.root", str(data_root), "--val_size", str(VAL_SIZE),
                           "--out", str(tmp_path / "sweep"), *extra],
                          capture_output=True, text=True, cwd=REPO_ROOT)


@pytest.mark.parametrize("plan_text, problem", [
    ("a configs/quick.yaml\n", "expected 'NAME CONFIG STEPS"),
    ("a configs/quick.yaml ten\n", "STEPS a positive integer"),
    ("a configs/quick.yaml 0\n", "STEPS a positive integer"),
    ("a configs/quick.yaml 5\na configs/quick.yaml 6\n", "used twice"),
    ("# only a comment\n\n", "holds no runs"),
    ("a configs/quick.yaml 5 --model.peak_lr '0.1\n", "No closing quotation"),
])
def test_a_bad_plan_is_refused_in_one_line_naming_the_line(tmp_path, data_root, plan_text, problem):
    done = sweep(tmp_path, plan_text, data_root)
    assert done.returncode != 0
    assert problem in done.stderr and "Traceback" not in done.stderr
    assert "plan.txt" in done.stderr  # names the file (and the line, where one is at fault)
    assert not (tmp_path / "sweep").exists()  # nothing trained


@pytest.mark.slow
def test_sweep_scores_each_run_as_evaluate_does_and_reports_a_failed_run(tmp_path, data_root):
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", data_root)
    plan = (f"one_layer {config} 2   # a comment\n"
            f"broken {config} 2 --model.config.d_modle 8\n")
    done = sweep(tmp_path, plan, data_root, "--parallel", "2", "--json", str(tmp_path / "out.json"))
    assert done.returncode == 1, done.stderr  # one run failed
    results = {r["name"]: r for r in json.loads((tmp_path / "out.json").read_text())["runs"]}
    assert "error" in results["broken"] and "bpd" not in results["broken"]
    assert "train exited" in results["broken"]["error"]
    good = results["one_layer"]
    assert good["steps"] == 2 and "error" not in good
    # its score is the bits/dim of its own checkpoint on the val split, recomputed here
    ckpt = tmp_path / "sweep" / "one_layer" / "checkpoints" / "last.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == 2
    images = load("cifar10", data_root, "val", val_size=VAL_SIZE)[0]
    with torch.no_grad():
        expected = load_model(ckpt).bits_per_dim(images).mean().item()
    assert good["bpd"] == pytest.approx(expected, rel=1e-5)
    assert "one_layer" in done.stdout and "failed" in done.stdout
    assert "[2/2]" in done.stderr  # progress, one line per finished run


def test_a_folder_that_holds_checkpoints_is_not_trained_over(tmp_path, data_root):
    (tmp_path / "sweep" / "again" / "checkpoints").mkdir(parents=True)
    done = sweep(tmp_path, "again configs/quick.yaml 5\n", data_root)
    assert done.returncode != 0 and "already hold checkpoints" in done.stderr
    assert not (tmp_path / "sweep" / "again" / "sweep.log").exists()  # nothing started
