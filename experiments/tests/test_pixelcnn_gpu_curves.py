"""experiments/pixelcnn_gpu_curves.py: the Image Transformer's val points placed at the minutes of
its weights' path (each lease from the last one's continuation), PixelCNN++'s at its own, a run
with no finite point left out, and the comparison at PixelCNN++'s last minute."""

from __future__ import annotations

import json
import math

import pytest

from experiments import pixelcnn_gpu_curves


def write_lineage(root):
    """Two leases: the first from step 0 (6 minutes, continuation at 5), the second on from step 500."""
    leases = [
        {"lease": 1, "device": "GPU A", "first_step": 0, "last_step": 600, "training_minutes": 6.0,
         "minutes_to_continuation": 5.0, "val_curve": [[299, 4.0], [599, 3.5]]},
        {"lease": 2, "device": "GPU B", "first_step": 500, "last_step": 900, "training_minutes": 4.0,
         "minutes_to_continuation": 3.0, "val_curve": [[899, 3.2]]},
    ]
    root.mkdir(parents=True)
    (root / "lineage.json").write_text(json.dumps(leases))
    for lease, rows in ((1, [(99, 60.0), (299, 180.0), (499, 300.0)]), (2, [(549, 30.0), (849, 210.0)])):
        folder = root / "leases" / f"lease_{lease}"
        folder.mkdir(parents=True)
        lines = ["step,train/time,val/bpd"] + [f"{step},{seconds}," for step, seconds in rows]
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


def write_result(path, curve):
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "GPU A", "settings": {"precision": "bf16"},
                                "curve": [{"minutes": m, "val_bpd": v} for m, v in curve]}))


def test_points_sit_at_the_minutes_of_the_weights_path_and_compare_at_equal_minutes(tmp_path, capsys):
    write_lineage(tmp_path / "lineage")
    write_result(tmp_path / "lease_1" / "result.json", [(1.0, math.nan), (2.0, math.nan)])  # a NaN run
    write_result(tmp_path / "lease_2" / "result.json", [(1.0, 5.0), (6.0, 3.6)])
    pixelcnn_gpu_curves.main(["--lineage", str(tmp_path / "lineage"), "--pixelcnn",
                              str(tmp_path / "lease_1" / "result.json"), str(tmp_path / "lease_2" / "result.json"),
                              "--out", str(tmp_path / "figure.png")])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    first, second = result["transformer"]
    # lease 1: step 299 logged at 180 s; step 599 between 499 (5 min) and its end, 600 (6 min)
    assert first["points"][0] == [3.0, 4.0]
    assert first["points"][1][0] == pytest.approx(5.0 + 100 / 101)
    # lease 2 starts where lease 1's continuation stood (5 minutes); step 899 between 849 (3.5) and 900 (4)
    assert second["points"][0][0] == pytest.approx(5.0 + 3.5 + 0.5 * 50 / 51)
    assert "lease_1: no finite val point: left out" in lines
    assert result["comparisons"] == [{"pixelcnn": "lease_2", "minutes": 6.0, "pixelcnn_val_bpd": 3.6,
                                      "transformer_val_bpd_by_then": 3.5}]
    assert (tmp_path / "figure.png").stat().st_size > 0
