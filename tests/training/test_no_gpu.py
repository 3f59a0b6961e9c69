"""A run set up for GPUs on a machine without one (issue 126): said in one line before anything starts
(imagetx/training/no_gpu.py). The machine's GPUs are what ``gpu_available`` says, set here, so that
each test means the same on a machine with a GPU."""

from __future__ import annotations

import logging

import pytest

from helpers import one_error_line, train_metrics, write_train_config
from imagetx.train import main
from imagetx.training import no_gpu

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


@pytest.fixture
def without_gpu(monkeypatch):
    monkeypatch.setattr(no_gpu, "gpu_available", lambda: False)


def test_the_eight_gpu_recipe_on_a_machine_without_one_is_refused_before_anything_starts(
        tmp_path, data_root, capsys, without_gpu):
    """It fell to the CPU unsaid and started 8 processes of about 3 GB each (one killed, exit 137)."""
    run_dir = tmp_path / "runs" / "recipe"
    line = one_error_line(capsys, main, ["--config", "configs/cifar10_recipe.yaml", "--data.root", str(data_root),
                                         "--trainer.default_root_dir", str(run_dir), "--wandb", "disabled",
                                         "--trainer.devices", "8", "--trainer.strategy", "ddp"])
    assert "set up for GPUs and this machine has none" in line
    assert "--trainer.precision bf16-mixed" in line and "--trainer.devices 8" in line and "compile" in line
    assert "--trainer.accelerator cpu --trainer.precision 32-true --trainer.devices 1" in line
    assert not (tmp_path / "runs").exists()  # nothing written


def test_asking_for_a_gpu_where_there_is_none_is_one_line(tmp_path, data_root, capsys, without_gpu):
    """It was Lightning's 50-line MisconfigurationException."""
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, accelerator="gpu")
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled"])
    assert line.startswith("error: --trainer.accelerator gpu: this machine has no GPU")
    assert not (tmp_path / "run").exists()


def test_gpu_settings_on_a_cpu_asked_for_by_name_run_and_say_what_they_cost(tmp_path, data_root, caplog, without_gpu):
    caplog.set_level(logging.INFO)
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, max_steps=1,
                                precision="bf16-mixed")  # accelerator: cpu, by name
    main(["--config", str(config), "--wandb", "disabled"])
    said = [record.getMessage() for record in caplog.records if record.getMessage().startswith("on the CPU as asked")]
    assert len(said) == 1 and "--trainer.precision bf16-mixed" in said[0], caplog.text[-2000:]
    assert sorted(train_metrics(tmp_path / "run")) == [0]  # and it trained


@pytest.mark.parametrize("accelerator", ["auto", "cpu"])
def test_a_cpu_preset_says_nothing_and_a_machine_with_a_gpu_is_left_to_lightning(accelerator, monkeypatch):
    class Trainer:
        precision, devices = "32-true", 1

    Trainer.accelerator = accelerator
    monkeypatch.setattr(no_gpu, "gpu_available", lambda: False)
    assert no_gpu.check_gpu_settings(Trainer, compiled=True) is None  # quick's settings: fp32, one process
    Trainer.precision, Trainer.devices = "bf16-mixed", 8
    monkeypatch.setattr(no_gpu, "gpu_available", lambda: True)
    assert no_gpu.check_gpu_settings(Trainer, compiled=True) is None
