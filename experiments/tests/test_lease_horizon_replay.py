"""experiments/lease_horizon_replay.py: the horizon's callbacks replayed on a simulated clock
reproduce lease 2's early end of the decay without steering, and with it end the decay when the
budget ends, whichever way the fit before the decay was wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.lease_horizon_replay import replay
from experiments.tests.conftest import REPO_ROOT


def decay_multipliers(result: dict) -> list[float]:
    multipliers = result["multipliers"]
    return [multipliers[update] for update in sorted(multipliers) if update > result["decay_start"]]


def test_without_steering_the_replay_ends_the_decay_early_as_lease_2_did():
    # The lease (superres_gpu lease 2, its metrics.csv): decay 9,431 -> 10,399, the budget's end at
    # step 10,751, its last 352 updates at learning rate 0. The replay uses the lease's costs, so it
    # lands near those steps (its step time is one figure, the lease's varied a little).
    unsteered = replay(steer_every=0)
    assert abs(unsteered["decay_start"] - 9431) < 50 and abs(unsteered["decay_end"] - 10399) < 50
    assert abs(unsteered["last_step"] - 10751) < 50
    assert unsteered["updates_at_rate_0"] > 300


def test_steering_ends_the_decay_with_the_budget_and_never_raises_the_rate():
    steered = replay(steer_every=50)
    assert steered["updates_at_rate_0"] <= 1, "the budget's last update at most"
    assert steered["decay_end"] == steered["last_step"]
    decay = decay_multipliers(steered)
    assert decay[0] > 0.9 and all(later <= earlier for earlier, later in zip(decay, decay[1:]))
    # No step in the decay falls by more than the steepest step of an unsteered decay of its length.
    assert max(earlier - later for earlier, later in zip(decay, decay[1:])) < 0.05


def test_steering_brings_an_end_forward_that_a_late_cost_pushed_past_the_budget():
    # A sample grid late in the decay that no fit before it could count: unsteered, the budget
    # ends with the rate still at a quarter of the peak; steered, at 0.
    late_grid = dict(first_validation_seconds=1.0, grids={10_500: 30.0})
    unsteered, steered = replay(steer_every=0, **late_grid), replay(steer_every=50, **late_grid)
    assert unsteered["last_multiplier"] > 0.2
    assert steered["last_multiplier"] < 0.01 and steered["updates_at_rate_0"] <= 1


@pytest.mark.slow
def test_the_script_prints_the_figures_as_json(tmp_path):
    done = subprocess.run([sys.executable, "-m", "experiments.lease_horizon_replay", "--steer_every", "0",
                           "--json", str(tmp_path / "replay.json")], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed == json.loads((tmp_path / "replay.json").read_text())
    assert printed["updates_at_rate_0"] > 300 and "multipliers" not in printed
