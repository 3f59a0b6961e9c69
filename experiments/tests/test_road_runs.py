"""experiments/road_runs.py and road_table.py (docs/experiments.md entry 35): the proxy's regime, arms
that end at equal added FLOPs, the FLOPs of wider attention as the model computes them, the metrics a
later session goes on from, and the order runs start in."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from experiments import road_runs
from experiments.road_runs import (BATCH, BRANCH, END, EPOCH, GPU_PARAMETERS_PER_IMAGE, PLAN, PROXY_PARAMETERS,
                                   SUBSET_IMAGES, TRUNK_STEPS, VAL_EVERY, Run, flops_per_image, run_steps,
                                   startable, window_means)
from imagetx.model.flops import count_flops


def proxy(heads: int = 4, layers: int = 2):
    return road_runs.proxy_model(layers, heads)


def test_the_subset_gives_the_proxy_the_gpu_models_parameters_per_image():
    assert sum(p.numel() for p in proxy().parameters()) == PROXY_PARAMETERS
    assert PROXY_PARAMETERS / SUBSET_IMAGES == pytest.approx(GPU_PARAMETERS_PER_IMAGE, rel=0.01)
    assert SUBSET_IMAGES % BATCH == 0 and EPOCH == 215
    assert (TRUNK_STEPS, BRANCH, END) == (50 * EPOCH, 40 * EPOCH, 150 * EPOCH)
    assert BRANCH % VAL_EVERY == 0  # an arm's validations fall every 10 epochs, as the trunk's


def measured_training_flops(model) -> int:
    """FlopCounterMode's forward and backward FLOPs of one image, attention as plain products."""
    images = torch.randint(0, 256, (1, 32, 32, 3), dtype=torch.uint8)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model.bits_per_dim(images).mean().backward()
    return counter.get_total_flops()


def test_the_flops_of_wider_attention_are_what_the_widened_model_computes():
    wide = proxy(heads=8)
    assert flops_per_image(2, 8) == measured_training_flops(wide)
    assert flops_per_image() == measured_training_flops(proxy())
    # negative control: count_flops reads d_model for the pairs, and so misses the new heads' attention
    assert count_flops(wide, "cpu").training < measured_training_flops(wide)


def test_every_arm_ends_at_the_added_flops_of_the_base_arm():
    base = flops_per_image()
    for run in PLAN:
        if run.kind != "arm":
            continue
        added = (run_steps(run) - BRANCH) * flops_per_image(run.layers, run.heads)
        wanted = (run.end_epochs * EPOCH - BRANCH) * base
        assert abs(added - wanted) <= flops_per_image(run.layers, run.heads) / 2 * 8, run.name  # half a step
    grown = Run("x", "scratch", "", layers=4)
    assert run_steps(grown) * flops_per_image(4, 4) == pytest.approx(END * base, rel=1e-4)


def test_the_training_loss_is_averaged_over_each_ten_epochs():
    # the loss logged at step s is that of update s + 1: window k holds updates k*V+1 .. (k+1)*V
    train = {s: float(s < VAL_EVERY) for s in range(2 * VAL_EVERY + 5)}
    assert window_means(train, 2 * VAL_EVERY + 5) == [(VAL_EVERY, 1.0), (2 * VAL_EVERY, 0.0),
                                                        (2 * VAL_EVERY + 5, 0.0)]


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(road_runs, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(road_runs, "RUNS", tmp_path / "runs")
    (tmp_path / "results" / "ckpt").mkdir(parents=True)
    return tmp_path


def write_metrics(folder, version: int, rows: list[tuple[int, str, float]]) -> None:
    path = folder / "csv" / f"version_{version}" / "metrics.csv"
    path.parent.mkdir(parents=True)
    lines = ["step,train/bpd,val/bpd"] + [f"{s},{v if k == 'train' else ''},{v if k == 'val' else ''}"
                                           for s, k, v in rows]
    path.write_text("\n".join(lines) + "\n")


def test_metrics_kept_in_road_results_and_this_sessions_join_the_newest_winning(results):
    run = Run("arm", "arm", "")
    run_folder = road_runs.RUNS / "arm"
    # a session that reached step 6, kept up to its checkpoint at step 4 ...
    write_metrics(run_folder, 0, [(3, "train", 5.0), (4, "train", 4.9), (5, "train", 4.8), (5, "val", 4.7)])
    road_runs.write_steps(run, road_runs.merged_steps(run, upto=4))
    with gzip.open(road_runs.RESULTS / "arm.steps.csv.gz", "rt") as handle:
        assert handle.read().splitlines() == ["train,3,5.00000", "train,4,4.90000"]
    # ... ended; the next session has no runs/ folder of it, resumes at step 4 and logs again from there
    (run_folder / "csv" / "version_0" / "metrics.csv").unlink()
    write_metrics(run_folder, 1, [(4, "train", 4.9), (5, "train", 4.85), (6, "train", 4.6)])
    kept = road_runs.merged_steps(run)
    assert kept["train"] == {3: 5.0, 4: 4.9, 5: 4.85, 6: 4.6} and kept["val"] == {}


def test_runs_start_in_plan_order_and_none_passes_one_waiting_for_the_branch_point():
    states = {run.name: "ready" for run in PLAN}
    assert startable(states)[:2] == ["trunk", "cont_s0"]
    states.update(trunk="running", cont_s0="waiting for the branch point")
    assert startable(states) == []  # no later run (from scratch, the 2D row) takes the arms' slot
    states.update(cont_s0="running", flip_s0="running", flipdrop_s0="waiting for the regularised arms")
    names = startable(states)
    assert "flipdrop_s0" not in names and names[0] == "drop01_s0" and names.index("cont_s1") < names.index("row2d_s0")


def finished(name: str, val: float) -> None:
    (road_runs.RESULTS / f"{name}.json").write_text(json.dumps({"val_bpd": val}))


def test_the_best_regulariser_is_chosen_once_every_single_regulariser_has_finished(results):
    grown = road_runs.BY_NAME["deepreg_s0"]
    assert road_runs.resolved(grown) is None
    for name, val in (("cont_s0", 3.5), ("flip_s0", 3.4), ("drop01_s0", 3.45)):
        finished(name, val)
    assert road_runs.resolved(grown) is None  # dropout 0.2 has not finished
    finished("drop02_s0", 3.38)
    # flips + dropout takes the better dropout (0.2 here) as soon as both dropout arms are in, and is not
    # waited for: the grown arm takes the best single regulariser
    assert road_runs.resolved(road_runs.BY_NAME["flipdrop_s0"]).dropout == 0.2
    chosen = road_runs.resolved(grown)
    assert not chosen.flip and chosen.dropout == 0.2 and chosen.layers == 4 and "(drop02_s0)" in chosen.what
    finished("drop02_s0", 3.46)
    finished("flipdrop_s0", 3.2)  # a combination that wins does not change the grown arm's regulariser
    chosen = road_runs.resolved(grown)
    assert chosen.flip and chosen.dropout == 0.0 and "(flip_s0)" in chosen.what
    # where nothing beats continuing as is, the grown arms with a regulariser are not needed
    finished("cont_s0", 3.3)
    (road_runs.RESULTS / "ckpt" / "trunk_continuation").mkdir()
    (road_runs.RESULTS / "ckpt" / "trunk_continuation" / "continuation.json").write_text("{}")
    assert road_runs.skipped(grown) and road_runs.state(grown).startswith("not needed")


def test_the_projection_bends_the_lineages_slope_by_the_proxys():
    from experiments.road_table import per_doubling, projection

    assert per_doubling([(25, 4.0), (50, 3.8), (100, 3.6)]) == pytest.approx(-0.2)
    figures = {"trunk_e25": {"val_bpd": 4.0}, "trunk": {"val_bpd": 3.8}, "cont_s0": {"val_bpd": 3.7}}
    p = projection(figures, "cont_s0")
    assert p["proxy_slope_25_50"] == pytest.approx(-0.2)
    assert p["proxy_slope_50_150"] == pytest.approx(-0.1 / math.log2(3))
    assert p["projected_slope"] == pytest.approx(p["lineage_slope_per_doubling"] * p["proxy_slope_50_150"] / -0.2)
    assert p["leases"]["2.95"] < p["leases"]["2.9"]
    # an arm that ends above the trunk's decayed val projects no lease to either target
    figures["cont_s0"]["val_bpd"] = 3.9
    assert projection(figures, "cont_s0")["leases"] == {"2.95": None, "2.9": None}


def test_the_seeds_of_an_arm_are_averaged_and_set_against_arm_1s():
    from experiments.road_table import seed_means

    arm = lambda val, kind="arm": {"kind": kind, "val_bpd": val}  # noqa: E731
    figures = {"trunk": arm(3.56, "trunk"), "cont_s0": arm(3.50), "cont_s1": arm(3.52), "deep_s0": arm(3.39),
               "deep_s1": arm(3.43), "wide_s0": arm(None), "cont_e75_s0": arm(3.6)}
    means = seed_means(figures)
    assert set(means) == {"cont", "deep"}  # the trunk, a run going, an earlier decay: not arms at equal FLOPs
    assert means["deep"]["seeds"] == 2 and means["deep"]["mean"] == pytest.approx(3.41)
    assert means["deep"]["spread"] == pytest.approx(0.04) and means["cont"]["spread"] == pytest.approx(0.02)
    assert means["deep"]["against_arm_1"] == pytest.approx(-0.10) and means["cont"]["against_arm_1"] == 0
