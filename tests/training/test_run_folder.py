"""A run folder's checkpoints are its run's own (imagetx/training/run_folder.py, issue 124 item 2):
``--resume auto`` without ``last.ckpt`` goes on from the run's newest whole checkpoint, a new run in a
folder that holds one is refused, and a resumed run's ModelCheckpoint prunes only its own best
checkpoints (callbacks.RunBestCheckpoint). Before, a run folder whose ``last.ckpt`` was gone started
over at step 0 and overwrote, then pruned, the earlier run's ``best-{step}.ckpt``."""

from __future__ import annotations

import csv

import pytest
import torch

from helpers import one_error_line, write_train_config
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def train(tmp_path, run_dir, data_root, max_steps, *extra):
    """``max_steps`` of the tiny model, a validation (and so a best checkpoint) every 2 steps."""
    config = write_train_config(tmp_path / f"{run_dir.name}-{max_steps}.yaml", run_dir, data_root, max_steps)
    main(["--config", str(config), "--wandb", "disabled", *extra])
    return config


def files(run_dir):
    """Every file under ``run_dir`` with its bytes (a link as where it points)."""
    return {path: path.read_bytes() if path.is_file() else str(path.readlink()) if path.is_symlink() else None
            for path in sorted(run_dir.rglob("*"))}


def best_checkpoints(run_dir):
    return sorted((run_dir / "checkpoints").glob("best-*.ckpt"))


@pytest.mark.parametrize("gone", ["deleted", "dangling link"])
def test_resume_auto_without_last_ckpt_goes_on_from_the_runs_newest_checkpoint(tmp_path, data_root, caplog, gone):
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, 4)
    last = run_dir / "checkpoints" / "last.ckpt"
    last.unlink()
    if gone == "dangling link":
        last.symlink_to(tmp_path / "nowhere.ckpt")
    (best,) = best_checkpoints(run_dir)
    best_step = torch.load(best, weights_only=True)["global_step"]
    kept = best.read_bytes()

    train(tmp_path, run_dir, data_root, 6, "--resume", "auto")

    assert torch.load(last, weights_only=True)["global_step"] == 6
    assert best.read_bytes() == kept  # the file it went on from: neither overwritten nor pruned
    with open(run_dir / "csv" / "version_1" / "metrics.csv") as handle:  # the second command's
        steps = [int(row["step"]) for row in csv.DictReader(handle)]
    assert min(steps) >= best_step, (best_step, steps)  # went on from the best's step, not from step 0
    assert f"going on from the run's newest whole checkpoint, {best} (step {best_step})" in caplog.text


def test_resume_auto_refuses_a_folder_at_last_ckpts_place_and_a_run_with_no_whole_checkpoint(tmp_path, data_root,
                                                                                            capsys):
    run_dir = tmp_path / "run"
    config = train(tmp_path, run_dir, data_root, 2)
    last = run_dir / "checkpoints" / "last.ckpt"
    last.unlink()
    last.mkdir()
    capsys.readouterr()
    before = files(run_dir)
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--resume", "auto"])
    assert f"{last} is a folder" in line, line
    assert files(run_dir) == before

    last.rmdir()
    (best,) = best_checkpoints(run_dir)
    best.write_bytes(best.read_bytes()[:1000])  # cut short: no whole checkpoint of the run is left
    before = files(run_dir)
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--resume", "auto"])
    assert f"holds a run ({best.name})" in line and "no whole checkpoint" in line, line
    assert files(run_dir) == before


@pytest.mark.parametrize("how", ["new run", "resume from elsewhere"])
def test_a_new_run_in_a_folder_holding_only_a_best_checkpoint_is_refused(tmp_path, data_root, capsys, how):
    run_dir = tmp_path / "run"
    config = train(tmp_path, run_dir, data_root, 2)
    (run_dir / "checkpoints" / "last.ckpt").unlink()  # what the refusal looked at, gone
    extra = []
    if how == "resume from elsewhere":
        train(tmp_path, tmp_path / "other", data_root, 1)
        extra = ["--resume", str(tmp_path / "other" / "checkpoints" / "last.ckpt")]
    capsys.readouterr()
    before = files(run_dir)
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--trainer.max_steps", "4",
                                         *extra])
    (best,) = best_checkpoints(run_dir)
    assert f"{run_dir} already holds a run ({best})" in line and "--resume auto" in line, line
    assert files(run_dir) == before


@pytest.mark.parametrize("named", ["../precious.ckpt", "continue.ckpt"])
def test_a_resumed_run_prunes_only_its_own_best_checkpoints(tmp_path, data_root, named):
    """The ModelCheckpoint state a resume restores names the best checkpoint to replace: one naming
    another file (outside the folder through ``..``, or another kind of checkpoint in it) leaves it."""
    run_dir = tmp_path / "run"
    config = train(tmp_path, run_dir, data_root, 2)
    folder = run_dir / "checkpoints"
    precious = folder / named
    precious.write_bytes(b"not this run's best checkpoint")
    last = folder / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    (key,) = [key for key in checkpoint["callbacks"] if key.startswith("ModelCheckpoint")]
    state = checkpoint["callbacks"][key]
    worst = torch.tensor(float("inf"))  # any validation beats it: the named file is the one to replace
    state.update(best_k_models={str(precious): worst}, kth_best_model_path=str(precious), kth_value=worst,
                 best_model_path=str(precious), best_model_score=worst)
    torch.save(checkpoint, last)

    main(["--config", str(config), "--wandb", "disabled", "--resume", "last", "--trainer.max_steps", "4"])

    assert precious.read_bytes() == b"not this run's best checkpoint"
    assert [path.name for path in best_checkpoints(run_dir)] == ["best-2.ckpt", "best-4.ckpt"]
