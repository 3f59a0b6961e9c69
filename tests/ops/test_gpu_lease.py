"""ops/gpu_lease.sh end to end on the CPU (``DRY_RUN=1``), with a tiny preset, as a lent GPU
machine's calls run it (ops/README.md, "A lease, call by call"): setup, first (the tests and the warm-up side by side), launch,
wait, finish; then two leases in a row, the second going on from the continuation the first brought
home (ops/lease_record.py), as the repository keeps it: the model a user loads in pretrained/NAME,
its training history in lineage/NAME. So that a typo or a step that hides its failure is found here,
not in the 15 minutes of a lease."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from helpers import stage_shards, train_metrics, write_cifar_npz, write_train_config
from imagetx.train import main as train_main
from ops.lease_cards import lineage_folder, minutes_sentence, table

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ops" / "gpu_lease.sh"
PEAK = 0.003
MiB = 2**20


def lease(step: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *step], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def dry_env(tmp_path):
    stage = stage_shards(tmp_path / "stage")
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", tmp_path / "unused", 10)
    values = yaml.safe_load(config.read_text())  # the recipe's schedule: warmup-stable-decay at the budget
    values["model"].update(optimizer="adamw_wsd", peak_lr=PEAK, warmup_steps=2, decay_fraction=0.2)
    config.write_text(yaml.safe_dump(values))
    out = tmp_path / "out"
    out.mkdir()
    return dict(os.environ, DRY_RUN="1", WORK=str(tmp_path / "work"), STAGE=str(stage), OUT=str(out),
                SITE=str(tmp_path / "site"), CONFIG=str(config), PYTHON=sys.executable, LAUNCH_WAIT="1", POLL="1",
                WARM_STEPS="2", GRID_SAMPLES="2", COMPLETIONS="2", EVAL_BATCH="2", VAL_SIZE="2", WANDB_MODE="disabled")


def call(step: list[str], env: dict) -> tuple[subprocess.CompletedProcess, Path | None]:
    """One call of the device tool: the step with an empty $OUT of its own; the folder if files came back."""
    work = Path(env["WORK"])
    out = work.parent / f"{work.name}_out_{len(list(work.parent.glob(work.name + '_out_*')))}"
    out.mkdir()
    done = lease(step, dict(env, OUT=str(out)))
    assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done, out if any(out.iterdir()) else None


def run_lease(env: dict, *launch: str, check: tuple[list[str], ...] = (["begin", "--data.val_size", "2"],
                                                                       ["await", "300"])) -> list[Path]:
    """One lease's steps on the machine, a call each; ``check``: the steps before the launch (``begin``: the
    tests beside the warm-up, detached, as call 1 starts them; ``await``: the launching call waits for them).
    Returns the folders of the calls that brought files back, and of the `more` calls `finish` asked for."""
    folders = []
    for step in (*check,
                 ["launch", "00:00:02:00", "--data.val_size", "2", *launch], ["wait", "120"],
                 ["finish", "60"]):
        done, out = call(step, env)
        folders += [out] if out else []
        if step[0] == "await":  # the warm-up beside the tests trained its steps in a folder of its own
            assert "warm: compiled and ran 2 steps" in done.stdout, done.stdout[-3000:]
            assert "CUDA tests: " in done.stdout, done.stdout[-3000:]  # which ones (ops/cuda_suite.py)
    while "left for 'bash ops/gpu_lease.sh more'" in done.stdout:
        done, out = call(["more"], env)
        folders.append(out)
    return folders


def bring_home(folders: list[Path], into: Path, *options: str, fails: bool = False) -> list[dict] | str:
    done = subprocess.run([sys.executable, str(REPO / "ops" / "lease_record.py"), "home", *map(str, folders),
                           "--into", str(into), *options], capture_output=True, text=True, timeout=120)
    if fails:
        assert done.returncode != 0, done.stdout
        return done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((lineage_folder(into) / "lineage.json").read_text())


@pytest.mark.slow
def test_two_leases_in_a_row_add_to_one_model(dry_env, tmp_path):
    work = Path(dry_env["WORK"])
    done = lease(["setup"], dry_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (work / "data").iterdir()) == ["train-0.npz", "train-1.npz"]
    assert "continuation staged" not in done.stdout  # nothing to go on from: the recipe starts

    refused = lease(["launch", "00:00:02:00"], dry_env)  # the tests have not passed yet
    assert refused.returncode == 1 and "CUDA correctness tests have not passed" in refused.stderr

    # 10 steps; the horizon fixed after step 4: the decay from step 8. What a call brings back made tiny
    # (4 files of 4 KiB: parts of 3; the tiny model 7.5 KiB, its continuation 23), so that each takes several
    # parts and the lease more calls, as a grown model's do at the device tool's 8 files of 16 MiB.
    limits = dict(OUT_FILES="4", OUT_FILE_MIB=str(4 / 1024), PART_MIB=str(3 / 1024))
    folders = run_lease(dict(dry_env, **limits))
    waited, finished, *more = folders
    sent = [sorted(p.name for p in folder.iterdir()) for folder in folders]
    assert all(name.startswith("continue.ckpt.part") for name in sent[0]), sent  # wait: as soon as it was written
    assert "results.tar" in sent[1] and more, sent  # what finish had no room for came in calls of their own
    everything = [name for names in sent for name in names]
    assert len(everything) == len(set(everything)) == 8 + 3 + 1, sent  # each part once, in the order queued
    assert all(len(names) <= 4 for names in sent)
    assert all(p.stat().st_size <= 3 * 1024 for folder in folders for p in folder.iterdir() if p.name != "results.tar")
    with tarfile.open(finished / "results.tar") as tar:
        names = set(tar.getnames())
    assert {"continuation.json", "model.safetensors.parts.json", "config.json", "lease.json", "metrics.csv",
            "train.log", "eval_val.json"} <= names
    assert sum(name.endswith(".png") for name in names) == 2, names  # the sample grid and the completion grid
    model = tmp_path / "pretrained" / "cifar10_gpu"
    # without the `more` calls' files: one line naming the fix, and nothing installed
    assert "`bash ops/gpu_lease.sh more`" in bring_home([waited, finished], model, fails=True)
    assert not model.exists()
    first = bring_home(folders, model)[0]
    assert (model / "model.safetensors").read_bytes() == (work / "export" / "model.safetensors").read_bytes()
    history = tmp_path / "lineage" / "cifar10_gpu"
    assert lineage_folder(model) == history
    # the model folder holds what a user loads; the lineage, the lease's logs and the continuation beside it
    assert sorted(p.name for p in model.iterdir()) == ["README.md", "complete.png", "config.json", "generate.png",
                                                      "model.safetensors"]
    assert sorted(p.name for p in history.iterdir()) == ["continuation", "leases", "lineage.json"]
    assert {p.name for p in (history / "leases" / "lease_1").iterdir()} >= {"metrics.csv", "train.log"}
    assert "lineage/cifar10_gpu/" in (model / "README.md").read_text()
    assert first["first_step"] == 0 and first["last_step"] == 10 and first["continuation_step"] == 8
    assert first["val_bpd"] > 0 and first["images_seen"] == 20
    # the first call's speed check of the step (scripts/step_check.py), kept in the lineage and the card
    assert first["step_check"]["images_per_s"] > 0 and first["step_check"]["batch"] == 2
    assert "Speed check (the step alone" in (model / "README.md").read_text()
    # the continuation's own timer: up to step 8 of the lease's 10, so within its training minutes
    assert 0 < first["minutes_to_continuation"] <= first["training_minutes"] + 0.05

    # The next lease: a fresh machine, the shards and the repository's continuation carried in.
    stage = Path(dry_env["STAGE"])
    shutil.copytree(history / "continuation", stage / "cont" / "continuation")
    second_env = dict(dry_env, WORK=str(tmp_path / "work2"), SITE=str(tmp_path / "site2"))
    done = lease(["setup"], second_env)
    assert done.returncode == 0 and "continuation staged: step 8 images 16" in done.stdout, done.stdout + done.stderr
    # on from step 8 to 16: the decay over its last 20 %; the tests alone (the first lease ran `first`); the
    # device tool's limits: wait's call brings the continuation, finish's the model and the figures
    folders = run_lease(second_env, "--trainer.max_steps", "16", "--data.random_flip", "true", check=(["tests"],))
    assert [sorted(p.name for p in folder.iterdir()) for folder in folders] == [
        ["continue.ckpt.part00"], ["model.safetensors.part00", "results.tar"]]
    lineage = bring_home(folders, model, "--device-minutes", "13.1")
    second = lineage[1]
    assert "device_minutes" not in lineage[0] and second["device_minutes"] == 13.1
    assert [entry["lease"] for entry in lineage] == [1, 2]
    # the second lease flipped its training images, the first did not: the lineage and the card say which
    assert [entry["random_flip"] for entry in lineage] == [False, True]
    assert second["first_step"] == 8 and second["last_step"] == 16 and second["images_seen"] == 32
    assert second["continuation_step"] == 14  # 16 - round(0.2 x 8)
    assert json.loads((history / "continuation" / "continuation.json").read_text())["step"] == 14
    assert (history / "leases" / "lease_2" / "metrics.csv").is_file() and not (model / "leases").exists()
    run = tmp_path / "work2" / "run"
    rates = train_metrics(run, "lr-AdamW")
    # the first update after the cut re-warms Adam (the lease keeps no moments): half-way, then the peak
    assert min(rates) == 8 and rates[8] == PEAK / 2 and rates[9] == PEAK, rates
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    # the data order went on: 32 of the 10 training images' epochs = epoch 3, 2 images in
    assert last["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["_sampler_iter_state"]["sampler_state"] \
        == {"epoch": 3, "samples": 2, "replicas": 1, "finished": False}
    card = (model / "README.md").read_text()
    assert "| 2 |" in card and f"value: {second['val_bpd']:.3f}" in card
    assert minutes_sentence(lineage) in card
    assert f"({second['shape']['n_layers']} layers, d {second['shape']['d_model']}, " in card  # the model's own shape
    assert card.count("random left-right flips") == 1  # lease 2's notes only
    assert card.index("- Lease 2:") < card.index("random left-right flips")


def test_the_cards_rows_give_each_leases_training_and_device_minutes():
    lease = {"lease": 1, "date": "2026-11-28", "device": "GPU", "training_minutes": 6.1, "first_step": 0,
             "last_step": 10, "images_seen": 1200, "val_bpd": 3.0}
    header, _, unknown, known = table([lease, dict(lease, lease=2, device_minutes=13.1)], superres=False).splitlines()
    assert "| training / device minutes |" in header
    assert "| 6.1 / – |" in unknown and "| 6.1 / 13.1 |" in known  # a lease that did not record it: a dash
    assert unknown.count("|") == known.count("|") == header.count("|")


def test_the_card_counts_the_minutes_on_the_weights_path():
    """Equal GPU minutes between two models are minutes on their weights' paths: each earlier lease
    up to its continuation, then the newest lease whole; unknown where an earlier lease lacks it."""
    lineage = [{"training_minutes": 5.7, "minutes_to_continuation": 4.55},
               {"training_minutes": 5.0, "minutes_to_continuation": 4.07}, {"training_minutes": 2.3}]
    assert minutes_sentence(lineage).startswith("13.0 GPU minutes of training so far, 10.9 of them on the path")
    lineage[1]["minutes_to_continuation"] = None
    assert minutes_sentence(lineage) == "13.0 GPU minutes of training so far"
    assert minutes_sentence([{"training_minutes": 6.3}]).startswith("6.3 GPU minutes of training so far, 6.3 of them")


def test_candidates_are_each_measured_and_a_failure_recorded(dry_env, tmp_path):
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("# a comment, then a blank line\n\nfine --batch 3\nbroken --flex-block-size 48\n")
    done = lease(["candidates", "120"], dict(dry_env, CANDIDATES=str(candidates)))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (Path(dry_env["WORK"]) / "step_candidates.json").read_text().splitlines()
    fine, broken = (json.loads(line) for line in lines)
    assert fine["name"] == "fine" and fine["images_per_s"] > 0 and fine["batch"] == 2  # the dry run's tiny batch
    assert broken["name"] == "broken" and broken["failed"] is True
    assert broken["exit"] not in (0, 124) and 10 < broken["seconds_left"] <= 120  # an error, not the clock
    assert "flex_block_size" in broken["last_lines"][-1]  # why it failed comes home with the record
    assert "flex_block_size" in done.stderr


def test_a_failing_step_fails_the_call(dry_env):
    finish = lease(["finish", "5"], dry_env)  # no run, no checkpoint: export fails, and so does the step
    assert finish.returncode != 0
    assert not any(Path(dry_env["OUT"]).iterdir())
    unknown = lease(["lanch"], dry_env)
    assert unknown.returncode == 2 and "usage:" in unknown.stderr


@pytest.mark.slow
def test_a_superres_lease_brings_back_what_its_input_is_worth(dry_env, tmp_path):
    """A super-resolution preset's lease: the val score with and without exact_box_means, the score
    given another image's 8x8 input, and the grids (upsampled input | samples | original). The steps
    before `finish` are every preset's (the test above runs them); here the run they launch is
    trained in this process, into the lease's run folder, and `finish` brings it back."""
    config = Path(dry_env["CONFIG"])
    values = yaml.safe_load(config.read_text())
    values["model"]["config"]["superres"] = dict(encoder_layers=1, low_res_size=8, low_res_reading="cell_add",
                                                 low_res_zero_start=True, cell_remainder_input=True)
    config.write_text(yaml.safe_dump(values))
    out, work = Path(dry_env["OUT"]), Path(dry_env["WORK"])
    write_cifar_npz(work / "data", train_sizes=(6, 6))  # what `setup` stages
    (work / "run").mkdir()
    (work / "run" / "train.log").write_text("trained in the test's process\n")  # where `launch` logs
    train_main(["--config", str(config), "--data.root", str(work / "data"), "--wandb", "disabled",
                "--trainer.default_root_dir", str(work / "run"), "--trainer.max_time", "00:00:02:00",
                "--data.val_size", "2"])
    done = lease(["finish", "60"], dry_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with tarfile.open(out / "results.tar") as tar:
        names = set(tar.getnames())
        use = json.load(tar.extractfile("input_use.json"))
        scores = [json.loads(tar.extractfile(name).read().decode().strip().splitlines()[-1])["bpd"]
                  for name in ("eval_val.json", "eval_val_bounded.json")]
    assert {"grids/superres.png", "grids_bounded/superres.png", "input_use.json"} <= names, names
    assert use["images"] == 2 and use["bpd_own_input"] == pytest.approx(scores[0], abs=1e-4)
    assert scores[1] <= scores[0]  # the bounds only take mass from values the input rules out
    model = tmp_path / "pretrained" / "superres_gpu"
    (lease_1,) = bring_home([out], model)
    # shipped with the bounds: its score, the grid and the config are the bounded model's
    assert lease_1["val_bpd"] == scores[1] and lease_1["val_bpd_without_bounds"] == scores[0]
    assert lease_1["val_bpd_other_input"] == use["bpd_other_image_input"]
    assert json.loads((model / "config.json").read_text())["superres"]["exact_box_means"] is True
    assert sorted(p.name for p in model.iterdir()) == ["README.md", "config.json", "model.safetensors", "superres.png"]
    assert (lineage_folder(model) / "continuation" / "continuation.json").is_file()
    card = (model / "README.md").read_text()
    assert "pipeline_tag: image-to-image" in card and f"**{scores[1]:.3f}** | {use['bpd_other_image_input']:.3f} |" in card
    shape = lease_1["shape"]  # the lease's model's, not the shipped preset's text
    assert f"the GPU\nrecipe's decoder ({shape['n_layers']} layers, d {shape['d_model']}, {shape['n_heads']} heads," in card
