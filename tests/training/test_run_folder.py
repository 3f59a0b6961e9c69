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
from imagetx.io.errors import CheckpointError
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
def test_resume_auto_without_last_ckpt_goes_on_from_the_runs_newest_checkpoint(tmp_path, data_root, capsys, caplog,
                                                                              gone):
    """(--resume last, which names last.ckpt, says that --resume auto goes on.)"""
    run_dir = tmp_path / "run"
    config = train(tmp_path, run_dir, data_root, 4)
    last = run_dir / "checkpoints" / "last.ckpt"
    last.unlink()
    if gone == "dangling link":
        last.symlink_to(tmp_path / "nowhere.ckpt")
    (best,) = best_checkpoints(run_dir)
    best_step = torch.load(best, weights_only=True)["global_step"]
    kept = best.read_bytes()

    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--resume", "last"])
    assert f"no checkpoint at {last}; --resume auto goes on from the newest whole checkpoint" in line, line
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


@pytest.mark.parametrize("named", ["../precious.ckpt", "continue.ckpt", "best-1.ckpt"])
def test_a_resumed_run_prunes_only_its_own_best_checkpoints(tmp_path, data_root, named):
    """The ModelCheckpoint state a resume restores names the best checkpoint to replace: one naming
    another file (outside the folder through ``..``, or another kind of checkpoint in it) leaves it;
    one naming a best checkpoint of the folder, the run's own, prunes it as Lightning does."""
    run_dir = tmp_path / "run"
    config = train(tmp_path, run_dir, data_root, 2)
    folder = run_dir / "checkpoints"
    named_file = folder / named
    named_file.write_bytes(b"named by the restored state")
    last = folder / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    (key,) = [key for key in checkpoint["callbacks"] if key.startswith("ModelCheckpoint")]
    state = checkpoint["callbacks"][key]
    worst = torch.tensor(float("inf"))  # any validation beats it: the named file is the one to replace
    state.update(best_k_models={str(named_file): worst}, kth_best_model_path=str(named_file), kth_value=worst,
                 best_model_path=str(named_file), best_model_score=worst)
    torch.save(checkpoint, last)

    main(["--config", str(config), "--wandb", "disabled", "--resume", "last", "--trainer.max_steps", "4"])

    own = named.startswith("best-")
    assert named_file.exists() != own
    assert [path.name for path in best_checkpoints(run_dir)] == ["best-2.ckpt", "best-4.ckpt"]


def test_which_resumes_go_on_with_the_run_a_folder_holds(tmp_path):
    """refuse_another_run's rules, file by file: the folder's own checkpoints go on with its run; a
    continuation (its own or another's) starts a new run; a packed continuation's joined file is the
    start of the run that joins it (every process of a run joins it, the first before the others look)."""
    from imagetx.training.continuation import MANIFEST
    from imagetx.training.run_folder import JOINED, refuse_another_run

    root = tmp_path / "run"
    folder = root / "checkpoints"
    folder.mkdir(parents=True)
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / MANIFEST).write_text("{}")
    (folder / JOINED).write_bytes(b"joined")
    for resume in (str(packed), "last", "auto"):
        refuse_another_run(root, resume)
    for resume in (None, str(tmp_path / "other" / "last.ckpt")):
        with pytest.raises(CheckpointError, match=f"already holds a run .*{JOINED}"):
            refuse_another_run(root, resume)
    (folder / "best-4.ckpt").write_bytes(b"best")
    (folder / "continue.ckpt").write_bytes(b"continuation")
    refuse_another_run(root, str(folder / "best-4.ckpt"))  # back to an earlier point of the same run
    for resume in (str(packed), str(folder / "continue.ckpt"), None):
        with pytest.raises(CheckpointError, match="best-4.ckpt"):
            refuse_another_run(root, resume)
