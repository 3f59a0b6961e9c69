"""experiments/superres_information.py: a linear predictor that sees the 8×8 input codes
images whose cells are flat in almost no bits; bad sizes are refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from experiments.tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_information_script_sees_what_a_constant_cell_input_gives_away(tmp_path):
    # Images whose 4x4 cells are flat: the 8x8 input holds every pixel, so a predictor that
    # uses it must code far fewer bits than one that sees only the neighbours.
    rng = np.random.default_rng(0)
    flat = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8).repeat(4, axis=1).repeat(4, axis=2)
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "train-0.npz", images=flat, labels=np.zeros(30, dtype=np.uint8))
    out = tmp_path / "info.json"
    script = [sys.executable, "-m", "experiments.superres_information"]
    done = subprocess.run([*script, "--data.root", str(root), "--val_size", "10", "--train", "20",
                           "--val", "10", "--json", str(out)], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["train_images"] == 20 and result["val_images"] == 10
    assert result["own_cell"] < 2.0 < result["without_input"]  # exact means leave ~nothing to code
    assert result["with_neighbour_cells"] < 2.0
    empty = subprocess.run([*script, "--data.root", str(root), "--train", "0"],
                           capture_output=True, text=True, cwd=REPO_ROOT)
    assert empty.returncode != 0 and empty.stderr.startswith("error:") and "--train" in empty.stderr
