"""experiments/step_cost.py: overrides reach the timed model, and a bad variant is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.tests.conftest import REPO_ROOT, write_train_config


def step_cost(*args):
    return subprocess.run([sys.executable, "-m", "experiments.step_cost", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT)


@pytest.mark.slow
def test_each_variant_is_timed_with_its_own_overrides(tmp_path, data_root):
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", data_root)
    done = step_cost("--config", str(config), "--steps", "2", "--warmup", "1",
                     "--variant", "base", "--variant", "bigger data.batch_size=3 model.config.n_layers=2")
    assert done.returncode == 0, done.stderr
    variants = json.loads(done.stdout.strip().splitlines()[-1])["variants"]
    assert list(variants) == ["base", "bigger"]
    assert variants["base"]["batch"] == 2 and variants["bigger"]["batch"] == 3
    assert all(v["seconds_per_step"] > 0 for v in variants.values())


@pytest.mark.slow
def test_a_bad_variant_is_refused_in_one_line(tmp_path, data_root):
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", data_root)
    for variant, problem in [("typo model.config.d_modle=8", "unknown ModelConfig field"),
                             ("no_equals model.config.n_layers", "is not key=value")]:
        done = step_cost("--config", str(config), "--variant", variant)
        assert done.returncode == 2
        assert problem in done.stderr and "Traceback" not in done.stderr
