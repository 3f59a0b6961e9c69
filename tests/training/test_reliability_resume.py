"""Crash and resume: a run killed with SIGKILL and continued with ``--resume last`` ends in
exactly the state of a run that was never interrupted (bitwise, on CPU).

What makes it exact: the training order and its flips are drawn from (seed, epoch) and
resumed mid-epoch from the checkpoint's loader state (imagetx/data/datamodule.py), and every training
step seeds torch's RNG from (seed, step, batch) (imagetx/training/module.py), so dropout and random
flips do not depend on what ran before (a sanity check, validations, the killed process). The runs below use
dropout 0.1 and random flips, and cross epoch boundaries (5 batches per epoch, 12 steps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import train_metrics, weights_checkpoint, write_train_config
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
# Dropout and flips on, so the RNG matters; validation every 3 steps and last.ckpt every step.
SETTINGS = dict(model={"dropout": 0.1}, data={"random_flip": True}, top={"checkpoint_every_n_steps": 1},
                val_check_interval=3)


class SlowSteps(L.Callback):
    """Used by the killed run only (through its YAML): makes each step last long enough to be
    killed in the middle of the run rather than after it."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.seconds)


def train(tmp_path, run_dir, data_root, max_steps=STEPS, extra=(), **settings):
    config = write_train_config(tmp_path / f"{run_dir.name}-{max_steps}.yaml", run_dir, data_root, max_steps,
                                **{**SETTINGS, **settings})
    main(["--config", str(config), "--wandb", "disabled", *extra])
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def assert_identical(a, b, where="checkpoint"):
    """Bitwise equality of nested checkpoint contents (tensors with torch.equal)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs (max |diff| {(a.double() - b.double()).abs().max().item()})"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_identical(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_training_state(resumed, uninterrupted):
    assert resumed["global_step"] == uninterrupted["global_step"] == STEPS
    assert resumed["epoch"] == uninterrupted["epoch"]
    assert_identical(resumed["state_dict"], uninterrupted["state_dict"], "state_dict")
    assert_identical(resumed["optimizer_states"], uninterrupted["optimizer_states"], "optimizer_states")
    assert_identical(resumed["lr_schedulers"], uninterrupted["lr_schedulers"], "lr_schedulers")
    # where the training order stands (epoch, batches of it consumed)
    assert_identical(resumed["loops"]["fit_loop"]["state_dict"]["combined_loader"],
                     uninterrupted["loops"]["fit_loop"]["state_dict"]["combined_loader"], "loader state")
    assert resumed["imagetx"] == uninterrupted["imagetx"]


@pytest.fixture
def uninterrupted(tmp_path, data_root):
    run_dir = tmp_path / "straight"
    checkpoint = train(tmp_path, run_dir, data_root)
    return checkpoint, train_metrics(run_dir)


@pytest.mark.slow
def test_sigkill_then_resume_last_matches_an_uninterrupted_run(tmp_path, data_root, uninterrupted):
    run_dir = tmp_path / "killed"
    config = write_train_config(
        tmp_path / "killed.yaml", run_dir, data_root, STEPS, **SETTINGS,
        callbacks=[{"class_path": "test_reliability_resume.SlowSteps", "init_args": {"seconds": 0.3}}])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "tests"), str(REPO)]),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # the in-process runs use one thread too
    process = subprocess.Popen([sys.executable, "-m", "imagetx.train", "--config", str(config), "--wandb", "disabled"],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    last = run_dir / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 240
        while not last.exists():
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        time.sleep(1.0)  # a few more steps: the kill lands in the middle of a later epoch, maybe mid-write
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    killed_at = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert 1 <= killed_at < STEPS, killed_at

    resumed = train(tmp_path, run_dir, data_root, extra=["--resume", "last"])

    straight, straight_losses = uninterrupted
    assert_same_training_state(resumed, straight)
    # and the steps after the crash saw the same losses
    losses = train_metrics(run_dir)
    after = [step for step in straight_losses if step >= killed_at]
    assert after and all(losses[step] == straight_losses[step] for step in after), (killed_at, losses, straight_losses)
    assert not list(last.parent.glob(".*.tmp"))  # a write cut short by the kill was cleaned up


@pytest.mark.parametrize("first_steps", [7, 10], ids=["mid-epoch", "at-an-epoch-end"])
def test_finished_run_extended_with_resume_matches_an_uninterrupted_run(tmp_path, data_root, uninterrupted,
                                                                       first_steps):
    # 7 steps end mid-epoch (epoch 1, batch 2); the second run continues the order from there.
    # 10 end at epoch 1's last batch: Lightning resumes at the start of epoch 2, which must
    # start afresh (imagetx.data.datamodule.TrainLoader), as in the uninterrupted run.
    run_dir = tmp_path / "extended"
    first = train(tmp_path, run_dir, data_root, max_steps=first_steps)
    assert first["global_step"] == first_steps
    resumed = train(tmp_path, run_dir, data_root, extra=["--resume", "last"])
    assert_same_training_state(resumed, uninterrupted[0])


@pytest.mark.parametrize("schedule", ["wsd", "noam", "noam-max_time"])
def test_resume_last_of_a_finished_run_says_so_and_writes_nothing(tmp_path, data_root, capsys, schedule):
    """--resume last with the budget the run has spent would end at once (exit 0, "Time limit
    reached"), leaving a new csv version and a W&B run behind: refused before the loggers start, in
    one line that says how to train on: its continuation, where it has one, else a larger budget."""
    from test_continuation import wsd_config

    run_dir = tmp_path / "first"
    timed = {"max_time": "00:00:00:01"} if schedule == "noam-max_time" else {}
    config = (wsd_config(tmp_path, "first", data_root, 5, 0.4) if schedule == "wsd"
              else write_train_config(tmp_path / "first.yaml", run_dir, data_root, -1 if timed else 5,
                                      **SETTINGS, **timed))
    main(["--config", str(config), "--wandb", "disabled"])
    capsys.readouterr()
    before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")}
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "offline", "--resume", "last"])
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    last, continuation = run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "continue.ckpt"
    assert len(lines) == 1 and lines[0].startswith(f"error: --resume last: {last} is a finished run"), lines
    assert ("max_time 1 s" if timed else "max_steps 5") in lines[0], lines
    if schedule == "wsd":
        assert f"--resume {continuation}" in lines[0] and "--trainer.default_root_dir NEW" in lines[0], lines
    else:
        assert not continuation.exists() and "a larger --trainer.max_" in lines[0], lines
    assert {path: path.stat().st_mtime_ns for path in run_dir.rglob("*")} == before  # nothing new, nothing touched
    if schedule != "wsd":  # the way on that the line names works (noam never decays to a horizon)
        step = torch.load(last, weights_only=True)["global_step"]
        larger = ["--trainer.max_time", "00:00:00:03"] if timed else ["--trainer.max_steps", "6"]
        main(["--config", str(config), "--wandb", "disabled", "--resume", "last", *larger])
        assert torch.load(last, weights_only=True)["global_step"] > step


def test_training_order_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch():
    from imagetx.data.datamodule import TrainOrder

    def indices(order):
        return [index for index, _ in order]

    dataset = list(range(10))
    order = TrainOrder(dataset, seed=0)
    epochs = []
    for epoch in range(3):
        order.set_epoch(epoch)
        epochs.append(indices(order))
    assert all(sorted(e) == dataset for e in epochs) and len({tuple(e) for e in epochs}) == 3
    assert order.state_dict() == {"epoch": 2, "samples": 10, "replicas": 1, "finished": True}
    again = TrainOrder(dataset, seed=0)
    again.set_epoch(1)
    assert indices(again) == epochs[1]
    again.load_state_dict({"epoch": 2, "samples": 4})  # resume epoch 2 after 4 samples
    again.set_epoch(1)
    assert indices(again) == epochs[1]  # another epoch ignores it ...
    again.load_state_dict({"epoch": 2, "samples": 4})
    again.set_epoch(2)
    assert indices(again) == epochs[2][4:]  # ... this one continues
    assert indices(again) == epochs[2]  # only once
    other = TrainOrder(dataset, seed=1)
    assert indices(other) != epochs[0]
    # flips (when on) come with the order: a function of (seed, epoch) too, about half of the images
    flips = [TrainOrder(dataset, seed=0, random_flip=True) for _ in range(2)]
    assert list(flips[0]) == list(flips[1]) and 0 < sum(flip for _, flip in flips[0]) < 10
    assert not any(flip for _, flip in order)
    # two processes share an epoch without overlap
    halves = [TrainOrder(dataset, seed=0, num_replicas=2, rank=r) for r in (0, 1)]
    assert sorted(indices(halves[0]) + indices(halves[1])) == dataset


def test_resume_with_another_model_configuration_is_a_clear_error(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, max_steps=1)
    capsys.readouterr()
    config = write_train_config(tmp_path / "other.yaml", run_dir, data_root, 2, model={"d_model": 32})
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "last"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --resume") and "d_model=16 there, 32 here" in err[-1], err
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("missing", ["attention.relative_positions", "dropout"])
def test_resume_from_a_checkpoint_written_before_a_field_existed(tmp_path, data_root, capsys, missing):
    """A checkpoint lacks a field added to ModelConfig since it was written (a continuation written
    before a field existed must resume): it trained with the field's default.
    attention.relative_positions: this run uses the default too, so it resumes. dropout: this run's
    0.1 is not the default 0.3, so it is refused as another model (the control)."""
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, max_steps=1)
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    *section, name = missing.split(".")
    stored = checkpoint["imagetx"]["model_config"]
    del (stored[section[0]] if section else stored)[name]
    torch.save(checkpoint, last)
    capsys.readouterr()
    if missing == "attention.relative_positions":
        resumed = train(tmp_path, run_dir, data_root, max_steps=2, extra=("--resume", "last"))
        assert resumed["global_step"] == 2
        return
    config = write_train_config(tmp_path / "again.yaml", run_dir, data_root, 2, **SETTINGS)
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "last"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --resume") and "dropout=0.3 there, 0.1 here" in err[-1], err


def test_resume_with_another_batch_size_is_a_clear_error(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, max_steps=1)
    capsys.readouterr()
    settings = {**SETTINGS, "data": {**SETTINGS["data"], "batch_size": 3}}  # only the batch size differs
    config = write_train_config(tmp_path / "other.yaml", run_dir, data_root, 2, **settings)
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "last"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "data.batch_size=2" in err[-1] and "same batch size" in err[-1], err


@pytest.mark.parametrize("damage", ["truncated", "not imagetx", "weights only"])
def test_resume_from_a_bad_checkpoint_is_a_clear_error(tmp_path, data_root, capsys, damage):
    from imagetx.io.checkpoint import imagetx_metadata
    from imagetx import build_model
    from imagetx.model.config import ModelConfig
    from helpers import TINY_TRAIN_MODEL

    bad = tmp_path / "bad.ckpt"
    if damage == "weights only":  # the model's configuration and weights, no optimiser or loop state
        model = build_model(ModelConfig(**TINY_TRAIN_MODEL))
        torch.save(weights_checkpoint(model), bad)
    else:
        torch.save({"state_dict": {}} if damage == "not imagetx" else {"x": torch.zeros(1000)}, bad)
        if damage == "truncated":
            bad.write_bytes(bad.read_bytes()[:500])
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2)
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", str(bad)])
    assert info.value.code == 2
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("error:") and "bad.ckpt" in last and "Traceback" not in captured.err


def test_a_super_resolution_checkpoint_under_the_subclass_names_resumes_as_the_uninterrupted_run(tmp_path, data_root):
    """A super-resolution run's checkpoint written while the model was the decoder itself (its
    decoder's tensors without ``decoder.``: every such checkpoint before the composition) resumes as
    today's: the names read as today's, Adam's state matched by order, and the run ends bitwise as
    one never interrupted."""
    superres = {"superres": dict(encoder_layers=1, low_res_size=8, low_res_reading="cross_attention")}
    straight = train(tmp_path, tmp_path / "straight-superres", data_root, STEPS, model={**SETTINGS["model"], **superres})
    run_dir = tmp_path / "cut-superres"
    train(tmp_path, run_dir, data_root, 7, model={**SETTINGS["model"], **superres})
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    today = checkpoint["state_dict"]
    assert "model.decoder.layers.0.cross_attn.q.weight" in today
    checkpoint["state_dict"] = {name.replace("model.decoder.", "model.", 1): value for name, value in today.items()}
    assert "model.layers.0.cross_attn.q.weight" in checkpoint["state_dict"]  # the subclass' names
    torch.save(checkpoint, last)
    resumed = train(tmp_path, run_dir, data_root, STEPS, extra=["--resume", "last"],
                    model={**SETTINGS["model"], **superres})
    assert_same_training_state(resumed, straight)
