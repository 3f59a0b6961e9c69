"""A schedule that can be continued (imagetx/training/schedule.py, continuation.py, resume.py):
warmup–stable–decay, the continuation checkpoint written just before the decay, a continued run
through the lease's packed format that ends bitwise as the uncut run does, and resuming with a
new budget: refitted before the decay, refused after it (with the way to extend a run)."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from helpers import one_error_line, train_metrics, write_train_config
from imagetx.io.checkpoint import LIGHTNING_PREFIX, model_config_of, model_state_dict
from imagetx.io.errors import CheckpointError
from imagetx.io.older import in_older_order, older_state
from imagetx.model.superres import build_model
from imagetx.train import main
from imagetx.training.budget import BudgetHorizon, Horizon, place_decay
from imagetx.training.continuation import CONTINUE, MANIFEST, continued_moments, pack, slim_moments, unpack
from imagetx.training.module import parameter_groups
from imagetx.training.schedule import warmup_then_decay
from test_budget import CopyLastCheckpoint, fake_run, train_steps
from test_reliability_resume import assert_identical

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

PEAK, WARMUP = 0.003, 2


def test_warmup_stable_decay_holds_the_peak_then_falls_as_one_minus_root():
    horizon = Horizon(decay_start=80, end=100)
    assert warmup_then_decay(1, 4, horizon, "wsd") == 0.25
    assert warmup_then_decay(4, 4, horizon, "wsd") == 1.0
    assert warmup_then_decay(80, 4, horizon, "wsd") == 1.0  # the last update at the peak
    assert warmup_then_decay(85, 4, horizon, "wsd") == pytest.approx(1 - math.sqrt(0.25))
    assert warmup_then_decay(100, 4, horizon, "wsd") == 0.0
    assert warmup_then_decay(85, 4, horizon, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    # a re-warm-up from step 50 over 10 steps (a continuation without the optimiser's moments)
    assert warmup_then_decay(51, 4, horizon, "wsd", rewarmup=(50, 10)) == pytest.approx(0.1)
    assert warmup_then_decay(60, 4, horizon, "wsd", rewarmup=(50, 10)) == 1.0


def test_the_decay_takes_the_last_fraction_of_this_runs_steps():
    assert place_decay(3000, 1, 100) == Horizon(100, 3000)  # the cosine: from the end of warm-up
    assert place_decay(3000, 1, 100, decay_fraction=0.2) == Horizon(2400, 3000)
    # a continuation from step 1,200 with a budget of 1,500 more steps: 20 % of those 1,500
    assert place_decay(2700, 1201, 100, first_step=1200, decay_fraction=0.2) == Horizon(2400, 2700)
    assert place_decay(10, 9, 2, first_step=0, decay_fraction=0.2) == Horizon(9, 10)  # never in the past


def wsd_config(tmp_path, name, data_root, max_steps, decay_fraction, **extra):
    config = write_train_config(tmp_path / f"{name}.yaml", tmp_path / name, data_root, max_steps,
                                model={"dropout": 0.1}, data={"random_flip": True},
                                top={"checkpoint_every_n_steps": 1}, val_check_interval=3, **extra)
    values = yaml.safe_load(config.read_text())
    values["model"].update(optimizer="adamw_wsd", peak_lr=PEAK, warmup_steps=WARMUP, lr_horizon="steps",
                           decay_fraction=decay_fraction)
    config.write_text(yaml.safe_dump(values))
    return config


def train(config, *extra) -> None:
    main(["--config", str(config), "--wandb", "disabled", *extra])


def load(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_a_run_writes_its_continuation_checkpoint_after_its_last_step_at_the_peak(tmp_path, data_root):
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    checkpoints = tmp_path / "first" / "checkpoints"
    continuation, last = load(checkpoints / CONTINUE), load(checkpoints / "last.ckpt")
    assert continuation["global_step"] == 8 and continuation["imagetx"]["continuation"] is True
    assert continuation["imagetx"]["images_seen"] == 16  # 8 steps of 2
    assert last["imagetx"]["lr_horizon"] == {"decay_start": 8, "end": 10} and not last["imagetx"]["continuation"]
    rates = train_metrics(tmp_path / "first", "lr-AdamW")
    for step, rate in rates.items():  # the rate of update step + 1
        assert rate == pytest.approx(PEAK * warmup_then_decay(step + 1, WARMUP, Horizon(8, 10), "wsd")), step
    assert rates[7] == PEAK and 0 < rates[8] < PEAK  # update 8 at the peak, update 9 decayed


def test_a_run_continued_through_the_packed_format_ends_as_the_uncut_run(tmp_path, data_root):
    # Uncut: 14 steps, the decay over the last one (14 - round(0.05 x 14) = 13).
    train(wsd_config(tmp_path, "uncut", data_root, 14, 0.05))
    uncut = load(tmp_path / "uncut" / "checkpoints" / "last.ckpt")
    assert uncut["imagetx"]["lr_horizon"] == {"decay_start": 13, "end": 14}
    # Cut: a first run of 10 steps decays from step 8 and writes its continuation there; packed as a
    # lease packs it (moments in float32 here, so that the continuation is exact); the second run
    # goes on from step 8 to 14 with the decay over its last step (14 - round(0.1 x 6) = 13).
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    packed = tmp_path / "lease"
    manifest = pack(tmp_path / "first" / "checkpoints" / CONTINUE, packed, moments="fp32")
    assert manifest["step"] == 8 and (packed / MANIFEST).is_file()
    train(wsd_config(tmp_path, "second", data_root, 14, 0.1), "--resume", str(packed))
    second = load(tmp_path / "second" / "checkpoints" / "last.ckpt")
    assert second["imagetx"]["lr_horizon"] == {"decay_start": 13, "end": 14}
    assert second["imagetx"]["first_step"] == 8 and second["imagetx"]["images_seen"] == 28
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step"):
        assert_identical(second[key], uncut[key], key)
    assert_identical(second["loops"]["fit_loop"]["state_dict"]["combined_loader"],
                     uncut["loops"]["fit_loop"]["state_dict"]["combined_loader"], "data position")
    # the same losses and learning rates at every step after the cut
    for column in ("train/bpd", "lr-AdamW"):
        after = {step: value for step, value in train_metrics(tmp_path / "uncut", column).items() if step >= 8}
        assert train_metrics(tmp_path / "second", column) == after, column


def in_older_layout(checkpoint: dict) -> dict:
    """``checkpoint`` as continuations were written before the (B, h, T, e) layout: the attention
    projections under their older names, the fused ones' output features (and Adam's moments of
    them) in (head, part, e) order."""
    model = build_model(model_config_of(checkpoint))
    model.load_state_dict(model_state_dict(checkpoint))
    older = {LIGHTNING_PREFIX + name: value for name, value in older_state(model).items()}
    order = [name for group in parameter_groups(model, 1.0, 1.0) for name in names_of(model, group["params"])]
    heads = model.config.attention.n_heads
    optimizer = checkpoint["optimizer_states"][0]
    for index, state in optimizer["state"].items():
        if order[index].endswith(".qkv.weight"):
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = in_older_order(state[key], heads, 3)
    return {**checkpoint, "state_dict": older}


def names_of(model, parameters) -> list[str]:
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [names[id(parameter)] for parameter in parameters]


def test_a_continuation_in_the_older_projection_layout_ends_as_the_uncut_run(tmp_path, data_root):
    """A continuation written before the (B, h, T, e) layout (its fused q/k/v weights and their
    Adam moments in (head, part, e) order, under older names) goes on as today's does: the run
    ends bitwise as the uncut one."""
    train(wsd_config(tmp_path, "uncut", data_root, 14, 0.05))
    uncut = load(tmp_path / "uncut" / "checkpoints" / "last.ckpt")
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    today = load(tmp_path / "first" / "checkpoints" / CONTINUE)
    older = in_older_layout(load(tmp_path / "first" / "checkpoints" / CONTINUE))
    assert "model.layers.0.self_attn.to_qkv.weight" in older["state_dict"]
    moments = [state["exp_avg"] for state in older["optimizer_states"][0]["state"].values()]
    todays = [state["exp_avg"] for state in today["optimizer_states"][0]["state"].values()]
    assert not all(torch.equal(a, b) for a, b in zip(moments, todays))  # some moments reordered
    torch.save(older, tmp_path / "older.ckpt")
    train(wsd_config(tmp_path, "second", data_root, 14, 0.1), "--resume", str(tmp_path / "older.ckpt"))
    second = load(tmp_path / "second" / "checkpoints" / "last.ckpt")
    for key in ("state_dict", "optimizer_states", "global_step"):
        assert_identical(second[key], uncut[key], key)


def test_a_continuation_packed_with_second_moments_only_goes_on_at_the_peak(tmp_path, data_root):
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    packed = tmp_path / "lease"
    pack(tmp_path / "first" / "checkpoints" / CONTINUE, packed, moments="second")
    full = load(tmp_path / "first" / "checkpoints" / CONTINUE)
    train(wsd_config(tmp_path, "second", data_root, 12, 0.2), "--resume", str(packed))
    rates = train_metrics(tmp_path / "second", "lr-AdamW")
    assert min(rates) == 8 and rates[8] == PEAK  # the step after the cut, at the peak (no re-warm-up)
    second = load(tmp_path / "second" / "checkpoints" / "last.ckpt")
    assert second["global_step"] == 12 and second["imagetx"]["lr_horizon"] == {"decay_start": 11, "end": 12}
    # the weights moved on from the continuation's, not from somewhere else
    name = next(iter(full["state_dict"]))
    change = (second["state_dict"][name] - full["state_dict"][name]).abs().max().item()
    assert 0 < change < 0.1


@pytest.mark.parametrize("rewarmup", [None, 4])
def test_a_continuation_without_moments_rewarms_adam_over_rewarmup_steps(tmp_path, data_root, rewarmup):
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    packed = tmp_path / "lease"
    pack(tmp_path / "first" / "checkpoints" / CONTINUE, packed, moments="none")
    extra = [] if rewarmup is None else ["--model.rewarmup_steps", str(rewarmup)]
    train(wsd_config(tmp_path, "second", data_root, 14, 0.2), "--resume", str(packed), *extra)
    rates = train_metrics(tmp_path / "second", "lr-AdamW")
    length = WARMUP if rewarmup is None else rewarmup  # None: the first warm-up's length
    assert min(rates) == 8
    for step in range(8, 8 + length):  # the rate of update step + 1: (step + 1 - 8) / length of the peak
        assert rates[step] == pytest.approx(PEAK * (step + 1 - 8) / length), (step, rates)
    assert rates[8 + length - 1] == PEAK


def test_packing_keeps_the_moments_as_asked_and_restores_them_for_adam():
    state = {"step": torch.tensor(5.0), "exp_avg": torch.randn(3), "exp_avg_sq": torch.rand(3)}
    checkpoint = {"optimizer_states": [{"state": {0: dict(state)}, "param_groups": []}], "imagetx": {}}
    slim_moments(checkpoint, "second")
    kept = checkpoint["optimizer_states"][0]["state"][0]
    assert "exp_avg" not in kept and kept["exp_avg_sq"].dtype == torch.bfloat16
    assert continued_moments(checkpoint) is True
    assert torch.equal(kept["exp_avg"], torch.zeros(3)) and kept["exp_avg_sq"].dtype == torch.float32
    assert torch.allclose(kept["exp_avg_sq"], state["exp_avg_sq"], rtol=2**-8)
    checkpoint["optimizer_states"][0]["state"] = {0: dict(state)}
    slim_moments(checkpoint, "none")
    assert checkpoint["optimizer_states"][0]["state"] == {} and continued_moments(checkpoint) is False
    with pytest.raises(ValueError, match="choose one of"):
        slim_moments(checkpoint, "fp16")


def manifest_bytes(tmp_path) -> int:
    """The size of the first run's continuation packed in one part."""
    return pack(tmp_path / "first" / "checkpoints" / CONTINUE, tmp_path / "one-part")["bytes"]


def test_a_packed_continuation_with_a_bad_part_is_refused(tmp_path, data_root, capsys):
    train(wsd_config(tmp_path, "first", data_root, 10, 0.2))
    packed = tmp_path / "lease"
    manifest = pack(tmp_path / "first" / "checkpoints" / CONTINUE, packed, part_bytes=manifest_bytes(tmp_path) // 3)
    assert len(manifest["parts"]) in (3, 4)  # parts of a third, and what rounding leaves
    with pytest.raises(ValueError, match="part_bytes=0"):
        pack(tmp_path / "first" / "checkpoints" / CONTINUE, tmp_path / "zero", part_bytes=0)
    joined = unpack(packed, tmp_path / "whole.ckpt")
    assert joined.stat().st_size == manifest["bytes"]
    part = packed / manifest["parts"][0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="do not add up"):
        unpack(packed, tmp_path / "joined.ckpt")
    part.unlink()
    line = one_error_line(capsys, main, ["--config", str(wsd_config(tmp_path, "second", data_root, 12, 0.2)),
                                         "--wandb", "disabled", "--resume", str(packed)])
    assert "cannot be read" in line and "every part" in line
    assert not (tmp_path / "second" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize("optimizer", ["adamw_wsd", "adamw_cosine"])
def test_resuming_a_decayed_run_with_a_new_budget_is_refused_with_the_way_to_extend_it(tmp_path, data_root, capsys,
                                                                                       optimizer):
    config = wsd_config(tmp_path, "first", data_root, 10, 0.2)
    train(config, "--model.optimizer", optimizer)
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--model.optimizer",
                                         optimizer, "--trainer.max_steps", "20", "--resume", "last"])
    assert "was decaying since step" in line and CONTINUE in line
    assert load(tmp_path / "first" / "checkpoints" / "last.ckpt")["global_step"] == 10  # nothing trained


def test_resuming_before_the_decay_with_a_new_budget_fits_the_schedule_to_it(tmp_path, data_root):
    copy = tmp_path / "after-4.ckpt"
    config = wsd_config(tmp_path, "first", data_root, 10, 0.2, callbacks=[
        {"class_path": "test_budget.CopyLastCheckpoint", "init_args": {"after_step": 4, "to": str(copy)}}])
    train(config)
    assert load(copy)["global_step"] == 4 and CopyLastCheckpoint
    train(wsd_config(tmp_path, "longer", data_root, 20, 0.2), "--resume", str(copy))
    longer = load(tmp_path / "longer" / "checkpoints" / "last.ckpt")
    assert longer["global_step"] == 20 and longer["imagetx"]["lr_horizon"] == {"decay_start": 16, "end": 20}
    rates = train_metrics(tmp_path / "longer", "lr-AdamW")
    assert rates[4] == rates[15] == PEAK and rates[19] < PEAK


def test_a_continued_run_fixes_its_horizon_from_its_own_steps_not_its_first():
    # A continuation from step 1,000 with a time budget: its first step compiles the model (slow)
    # and must not be timed, and fix_by counts the run's own steps, not the lineage's.
    trainer, module = fake_run(max_steps=-1)
    module.first_step = trainer.global_step = 1000
    callback = BudgetHorizon(fix_by_step=5)
    train_steps(callback, trainer, module, [1000], seconds=0.3)  # compilation
    train_steps(callback, trainer, module, range(1001, 1006))
    assert module.horizon is None, "fixed before the run's own fix_by_step"
    train_steps(callback, trainer, module, [1006])
    # 100 s left at ~0.01 s a step: thousands of steps, not the ~600 a timed compilation would leave
    assert module.horizon.end - 1006 > 3000, module.horizon
