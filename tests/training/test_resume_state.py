"""A damaged or edited checkpoint's training state is refused in one line on ``--resume``
(imagetx/training/resume_state.py, issue 124 item 8): Lightning failed deep in its fit loop with a
28–69-line traceback for a tensor of the wrong shape, junk optimiser state or a string ``global_step``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import one_error_line, write_train_config
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def wrong_weight_shape(checkpoint):
    name = next(name for name, value in checkpoint["state_dict"].items() if value.dim() == 2)
    checkpoint["state_dict"][name] = torch.zeros(3, 5)
    return name


def junk_optimizer_state(checkpoint):
    checkpoint["optimizer_states"] = ["junk"]
    return "optimiser state without its state and param_groups"


def moment_of_another_shape(checkpoint):
    state = checkpoint["optimizer_states"][0]["state"]
    state[0]["exp_avg"] = torch.zeros(7)
    return "exp_avg (7,)"


def another_group_size(checkpoint):
    group = checkpoint["optimizer_states"][0]["param_groups"][0]
    group["params"] = group["params"][:-1]
    return "parameter groups of"


def string_global_step(checkpoint):
    checkpoint["global_step"] = str(checkpoint["global_step"])
    return "its global_step is '2', not a count of steps"


def junk_scheduler_state(checkpoint):
    checkpoint["lr_schedulers"] = [{"last_epoch": "x"}]
    return "scheduler state"


def junk_horizon(checkpoint):
    checkpoint["imagetx"]["lr_horizon"] = {"decay_start": "soon", "end": 9}
    return "learning-rate horizon"


@pytest.mark.parametrize("damage", [wrong_weight_shape, junk_optimizer_state, moment_of_another_shape,
                                    another_group_size, string_global_step, junk_scheduler_state, junk_horizon],
                         ids=lambda damage: damage.__name__)
@pytest.mark.parametrize("resume", ["auto", "last"])
def test_a_checkpoint_whose_training_state_does_not_fit_is_refused_in_one_line(tmp_path, data_root, capsys,
                                                                              damage, resume):
    run_dir = tmp_path / "run"
    config = str(write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=2))
    main(["--config", config, "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    said = damage(checkpoint)
    torch.save(checkpoint, last)
    damaged = last.read_bytes()
    capsys.readouterr()
    line = one_error_line(capsys, main, ["--config", config, "--wandb", "disabled", "--resume", resume,
                                         "--trainer.max_steps", "4"])
    assert str(last) in line and said in line and "--init_from" in line, line
    assert last.read_bytes() == damaged
    assert sorted(path.name for path in last.parent.iterdir()) == ["best-2.ckpt", "last.ckpt"]


def test_the_horizon_fields_checked_are_the_horizons_own():
    from imagetx.training.budget import Horizon
    from imagetx.training.resume_state import HORIZON_FIELDS

    assert HORIZON_FIELDS == tuple(field.name for field in dataclasses.fields(Horizon))
