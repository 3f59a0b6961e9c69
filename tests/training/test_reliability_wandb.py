"""W&B trouble never costs a run: without a key, offline, with a failing ``wandb.init`` or a
failing logging call, training goes on, CSV metrics and checkpoints are still written, and
the problem is said once on stderr."""

from __future__ import annotations

import pytest
import torch

import imagetx.training.tracking as tracking_module
from helpers import train_metrics, write_train_config
from imagetx.train import main
from imagetx.training.tracking import SafeWandbLogger

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


@pytest.fixture(autouse=True)
def finish_wandb():
    yield
    import wandb

    if wandb.run is not None:
        wandb.finish()


@pytest.fixture
def started_runs(monkeypatch):
    """The W&B runs ``wandb.init`` starts during the test, in order."""
    import wandb

    runs = []
    init = wandb.init

    def recorded(*args, **kwargs):
        runs.append(init(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", recorded)
    return runs


def train(tmp_path, data_root, wandb_mode):
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, 3)
    main(["--config", str(config), "--wandb", wandb_mode])
    return run_dir


def assert_run_complete(run_dir):
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3
    assert sorted(train_metrics(run_dir)) == [0, 1, 2]  # train/bpd of all three steps in the CSV


def test_failing_log_metrics_turns_wandb_off_once_and_training_goes_on(tmp_path, data_root, monkeypatch, capsys):
    from lightning.pytorch.loggers import WandbLogger

    calls = []

    def broken(self, *args, **kwargs):
        calls.append(args)
        raise RuntimeError("wandb.log: connection reset by peer")

    monkeypatch.setattr(WandbLogger, "log_metrics", broken)
    run_dir = train(tmp_path, data_root, "offline")
    assert_run_complete(run_dir)
    err = capsys.readouterr().err
    assert err.count("W&B: log_metrics failed (RuntimeError: wandb.log: connection reset by peer)") == 1, err
    assert "W&B logging is off for the rest of this run" in err
    assert len(calls) == 1  # not tried again after the first failure


def test_failing_wandb_init_does_not_stop_training(tmp_path, data_root, monkeypatch, capsys):
    import wandb

    def no_network(*args, **kwargs):
        raise wandb.errors.CommError("failed to reach api.wandb.ai: network is unreachable")

    monkeypatch.setattr(wandb, "init", no_network)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # "online with a key", but no network
    run_dir = train(tmp_path, data_root, "auto")
    assert_run_complete(run_dir)
    err = capsys.readouterr().err
    assert err.count("W&B:") == 1 and "network is unreachable" in err, err


def test_wandb_logger_that_cannot_be_created_is_left_out(tmp_path, data_root, monkeypatch, capsys):
    def missing(*args, **kwargs):
        raise ModuleNotFoundError("wandb is not installed")

    monkeypatch.setattr(tracking_module, "SafeWandbLogger", missing)
    run_dir = train(tmp_path, data_root, "offline")
    assert_run_complete(run_dir)
    assert "W&B: cannot start (ModuleNotFoundError: wandb is not installed)" in capsys.readouterr().err


def test_safe_logger_guards_every_logging_call():
    from lightning.pytorch.loggers import WandbLogger

    for name in ("log_metrics", "log_hyperparams", "log_image", "log_table", "log_text", "finalize",
                 "after_save_checkpoint"):
        assert getattr(SafeWandbLogger, name) is not getattr(WandbLogger, name), name
    logger = SafeWandbLogger(project="p", offline=True)
    logger.wandb_failed = "earlier failure"
    assert logger.log_metrics({"a": 1.0}, step=0) is None  # a no-op once failed: no W&B run is started
    assert logger._experiment is None


def test_a_resumed_run_logs_on_to_the_same_wandb_run(tmp_path, data_root, started_runs):
    """Issue 111: each resume started a new W&B run. The run's id is kept in the checkpoint and a
    resume (--resume last, or auto as a requeued job reruns the command) continues it, also after a
    part trained with W&B disabled."""
    import wandb

    from imagetx.training.tracking import WANDB_RUN_KEY

    run_dir = tmp_path / "run"
    config = str(write_train_config(tmp_path / "c.yaml", run_dir, data_root, 2))
    last = run_dir / "checkpoints" / "last.ckpt"
    main(["--config", config, "--wandb", "offline"])
    wandb.finish()  # as a new process would have it: no W&B run still open to be taken up again
    assert len(started_runs) == 1
    first = started_runs[0].id
    assert torch.load(last, map_location="cpu", weights_only=True)[WANDB_RUN_KEY] == first
    main(["--config", config, "--wandb", "disabled", "--resume", "last", "--trainer.max_steps", "3"])
    assert torch.load(last, map_location="cpu", weights_only=True)[WANDB_RUN_KEY] == first  # carried over
    main(["--config", config, "--wandb", "offline", "--resume", "auto", "--trainer.max_steps", "4"])
    assert [run.id for run in started_runs] == [first, first]
    assert torch.load(last, map_location="cpu", weights_only=True)[WANDB_RUN_KEY] == first


def test_the_mode_asked_for_holds_after_wandb_set_itself_up_in_another_mode(tmp_path, data_root, monkeypatch,
                                                                           started_runs):
    """W&B reads WANDB_MODE once per process, when it first sets itself up: a run asked to log
    offline after W&B had set itself up online (an earlier run in the same notebook, or test
    process, with a key) tried the network ("Failed to get resume status") and logged nothing."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "online")
    wandb.teardown()  # whatever set-up an earlier test left behind goes; the next one reads "online"
    assert wandb.setup().settings.mode == "online"  # an earlier run's set-up, whose mode W&B keeps
    train(tmp_path, data_root, "offline")
    assert [run.settings.mode for run in started_runs] == ["offline"]
    wandb.finish()
    wandb.teardown()  # later tests set W&B up afresh
