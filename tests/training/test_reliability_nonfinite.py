"""Non-finite training: a NaN/inf loss (or gradient) is caught on the device at the step it
happens, and that step's update is skipped there; the host reads it at the next logging step
or checkpoint (here every step, unless a test says otherwise), where the run stops with one
line naming the step and the last good checkpoint, which is never overwritten by NaN weights
or by a checkpoint taken after the step; ``--model.max_nonfinite_skips N`` skips up to N such
steps.
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers import write_train_config
from imagetx.training.module import ImageTransformerModule
from imagetx.training.nonfinite import NonFiniteLossError, NonFiniteSteps, step_kind
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def inject(monkeypatch, bad_batches, how="loss"):
    """Make the training batches numbered in ``bad_batches`` (1-based) non-finite."""
    original = ImageTransformerModule.shared_step
    seen = {"train": 0}

    class InfiniteGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    def shared_step(self, batch, split):
        loss = original(self, batch, split)
        if split != "train":
            return loss
        seen["train"] += 1
        if seen["train"] in bad_batches:
            return loss * float("nan") if how == "loss" else InfiniteGradient.apply(loss)
        return loss

    monkeypatch.setattr(ImageTransformerModule, "shared_step", shared_step)
    return seen


def run(tmp_path, data_root, *extra, max_steps=6, checkpoint_every_n_steps=1, **trainer):
    run_dir = tmp_path / "run"
    trainer = {"val_check_interval": 4, **trainer}
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps,
                                top={"checkpoint_every_n_steps": checkpoint_every_n_steps}, **trainer)
    main(["--config", str(config), "--wandb", "disabled", *extra])
    return run_dir / "checkpoints" / "last.ckpt"


def error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], lines
    return lines[-1]


def assert_good_checkpoint(last, step):
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == step
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


def test_nan_loss_stops_at_that_step_and_names_the_last_good_checkpoint(tmp_path, data_root, monkeypatch, capsys):
    inject(monkeypatch, {3})
    with pytest.raises(SystemExit) as info:
        run(tmp_path, data_root)
    assert info.value.code == 2
    line = error_line(capsys)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "training loss is nan at step 3" in line, line
    assert f"the last good checkpoint is {last} (after step 2)" in line and "--resume last" in line, line
    assert_good_checkpoint(last, 2)


def test_nonfinite_gradients_with_a_finite_loss_are_caught_too(tmp_path, data_root, monkeypatch, capsys):
    inject(monkeypatch, {2}, how="gradient")
    with pytest.raises(SystemExit) as info:
        run(tmp_path, data_root)
    assert info.value.code == 2
    line = error_line(capsys)
    assert "gradients are not finite" in line and "at step 2" in line, line
    assert_good_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", 1)


def test_max_nonfinite_skips_skips_that_many_steps(tmp_path, data_root, monkeypatch, capsys):
    seen = inject(monkeypatch, {2, 4}, how="loss")
    with pytest.warns(UserWarning, match="step skipped"):
        last = run(tmp_path, data_root, "--model.max_nonfinite_skips", "2")
    assert seen["train"] == 6
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["imagetx"]["nonfinite_skips"] == 2
    assert_good_checkpoint(last, 6)
    # the skipped steps left the optimiser alone: Adam took 4 steps in 6 batches
    assert {int(s["step"]) for s in checkpoint["optimizer_states"][0]["state"].values()} == {4}


def test_more_nonfinite_steps_than_allowed_stop_the_run(tmp_path, data_root, monkeypatch, capsys):
    inject(monkeypatch, {2, 3, 5}, how="gradient")
    with pytest.raises(SystemExit), pytest.warns(UserWarning, match="step skipped"):
        run(tmp_path, data_root, "--model.max_nonfinite_skips", "2")
    line = error_line(capsys)
    assert "at step 5" in line and "2 such steps were skipped already" in line, line
    assert_good_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", 4)


def test_nan_weights_are_never_written_over_the_last_good_checkpoint(tmp_path, data_root, monkeypatch, capsys):
    """Weights that became NaN without a NaN loss first (here: poisoned after step 2's update)."""
    original = ImageTransformerModule.optimizer_step
    calls = {"n": 0}

    def optimizer_step(self, *args, **kwargs):
        original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:
            with torch.no_grad():
                next(self.parameters()).fill_(float("nan"))

    monkeypatch.setattr(ImageTransformerModule, "optimizer_step", optimizer_step)
    with pytest.raises(SystemExit) as info:
        run(tmp_path, data_root)
    assert info.value.code == 2
    line = error_line(capsys)
    assert "weights are not finite after step 2" in line and "not written" in line, line
    assert "(after step 1)" in line
    assert_good_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", 1)


@pytest.mark.parametrize("checkpoint_every, stops_at, last_good", [(2, 4, 2), (0, 5, None)])
def test_between_reads_a_nonfinite_step_is_skipped_and_the_next_read_stops_the_run(
        tmp_path, data_root, monkeypatch, capsys, checkpoint_every, stops_at, last_good):
    """Read every 5 steps (log_every_n_steps) and before every checkpoint: a NaN loss at step 3
    stops the run at the next read, the checkpoint at step 4 or the logging step 5, naming step
    3; no checkpoint is written after step 3."""
    seen = inject(monkeypatch, {3})
    with pytest.raises(SystemExit) as info:
        run(tmp_path, data_root, max_steps=8, checkpoint_every_n_steps=checkpoint_every, log_every_n_steps=5,
            val_check_interval=100)
    assert info.value.code == 2
    assert seen["train"] == stops_at
    line = error_line(capsys)
    assert "training loss is nan at step 3; training stopped" in line, line
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    if last_good is None:
        assert "no checkpoint was written yet" in line and not last.exists(), line
    else:
        assert f"(after step {last_good})" in line, line
        assert_good_checkpoint(last, last_good)


def test_steps_skipped_between_reads_are_counted_at_the_next(tmp_path, data_root, monkeypatch):
    seen = inject(monkeypatch, {2, 3})
    warning = "training loss is nan at step 2 and 1 more non-finite step(s) after it: steps skipped (2 of "
    with pytest.warns(UserWarning, match=re.escape(warning)):
        last = run(tmp_path, data_root, "--model.max_nonfinite_skips", "2", checkpoint_every_n_steps=0,
                   log_every_n_steps=5, val_check_interval=100)
    assert seen["train"] == 6
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["imagetx"]["nonfinite_skips"] == 2
    assert_good_checkpoint(last, 6)
    assert {int(s["step"]) for s in checkpoint["optimizer_states"][0]["state"].values()} == {4}


def test_the_step_that_goes_past_the_limit_is_named_even_within_one_read():
    """Counted on the device between reads: with 1 skip allowed, steps 2 and 3 non-finite and
    step 4 finite, the read names step 3, whose loss was inf."""
    steps = NonFiniteSteps(limit=1)
    for step, loss in ((1, 0.5), (2, float("nan")), (3, float("inf")), (4, 0.25)):
        loss = torch.tensor(loss)
        steps.note(~torch.isfinite(loss), step, step_kind(loss))
    with pytest.raises(NonFiniteLossError, match=re.escape("training loss is inf at step 3; training stopped (1 such")):
        steps.read()
    assert steps.read() is None  # read and started afresh
    allowed = NonFiniteSteps(limit=2, skipped=1)  # one skipped before (a resumed run)
    allowed.note(torch.tensor(True), 7, step_kind(torch.tensor(1.0)))  # finite loss: the gradients
    assert allowed.read() == "gradients are not finite at step 7: step skipped (2 of model.max_nonfinite_skips=2)"
