"""Checkpoint writes: a kill or a failure while writing never leaves a corrupt ``last.ckpt``.

Every checkpoint, Lightning's ``last.ckpt`` included, is written by
``checkpoint.atomic_torch_save``: a temporary file beside the target, fsync, rename.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import imagetx.training.checkpoint_io as checkpoint_io
from helpers import write_train_config
from imagetx import load_model
from imagetx.io.atomic import check_writable, remove_stale_temporaries
from imagetx.io.checkpoint import atomic_torch_save
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]


def train(tmp_path, run_dir, data_root, max_steps, *extra, **settings):
    config = write_train_config(tmp_path / f"config-{max_steps}.yaml", run_dir, data_root, max_steps, **settings)
    main(["--config", str(config), "--wandb", "disabled", *extra])


def partial_then_fail(obj, handle, *args, **kwargs):
    """A torch.save that dies half-way: some bytes written, then the disk is full."""
    handle.write(b"PK\x03\x04 half a checkpoint")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_failed_write_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "checkpoints" / "last.ckpt"
    atomic_torch_save({"step": 1, "w": torch.arange(4.0)}, target)
    before = target.read_bytes()
    monkeypatch.setattr(torch, "save", partial_then_fail)
    with pytest.raises(OSError):
        atomic_torch_save({"step": 2}, target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask  # the usual permissions, not mkstemp's 0600


def test_disk_full_during_training_keeps_last_ckpt_and_says_so(tmp_path, data_root, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, 2)
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    capsys.readouterr()
    monkeypatch.setattr(torch, "save", partial_then_fail)
    with pytest.raises(SystemExit) as info:
        train(tmp_path, run_dir, data_root, 4, "--resume", "last", top={"checkpoint_every_n_steps": 1})
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot write checkpoint") and "No space left on device" in err[-1], err
    assert "--resume" in err[-1]
    monkeypatch.undo()
    assert last.read_bytes() == before  # untouched, and loadable
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2
    assert not list(last.parent.glob(".*"))  # no temporary left behind


def test_every_checkpoint_file_goes_through_the_atomic_writer(tmp_path, data_root, monkeypatch):
    """Lightning's ModelCheckpoint must not bypass it: no save_last='link' symlink, no copy."""
    written = []

    def spy(obj, path):
        written.append(Path(path).name)
        atomic_torch_save(obj, path)

    monkeypatch.setattr(checkpoint_io, "atomic_torch_save", spy)
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, 5, top={"checkpoint_every_n_steps": 2})
    files = sorted((run_dir / "checkpoints").iterdir())  # best-N.ckpt, last.ckpt
    assert len(files) == 2 and files[0].name.startswith("best-") and files[1].name == "last.ckpt", files
    for file in files:
        assert file.is_file() and not file.is_symlink()
        assert file.name in written
    # last.ckpt at steps 2 and 4 (step and validation checkpoints) and at the final step 5
    assert written.count("last.ckpt") >= 3
    assert torch.load(files[1], map_location="cpu", weights_only=False)["global_step"] == 5


def test_sigkill_in_the_middle_of_writing_last_ckpt(tmp_path, data_root):
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, 2)
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    # A process that dies by SIGKILL while torch.save is half-way through last.ckpt.
    script = textwrap.dedent(f"""
        import os, signal, torch
        from imagetx.io.checkpoint import atomic_torch_save

        def die_mid_write(obj, handle, *args, **kwargs):
            handle.write(b"PK\\x03\\x04" + bytes(10000))
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = die_mid_write
        atomic_torch_save({{"global_step": 99}}, {str(last)!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert last.read_bytes() == before
    load_model(last)  # still a whole, loadable checkpoint
    leftovers = list(last.parent.glob(".last.ckpt.*.tmp"))
    assert len(leftovers) == 1  # the killed write's temporary (no code ran to remove it) ...
    train(tmp_path, run_dir, data_root, 3, "--resume", "last")
    assert not leftovers[0].exists()  # ... removed when the next run starts
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3


def test_remove_stale_temporaries_only_touches_temporaries(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / ".last.ckpt.abc123.tmp").write_bytes(b"half")
    (directory / "last.ckpt").write_bytes(b"whole")
    (directory / "notes.tmp").write_bytes(b"not ours: no leading dot")
    removed = remove_stale_temporaries(directory)
    assert [p.name for p in removed] == [".last.ckpt.abc123.tmp"]
    assert sorted(p.name for p in directory.iterdir()) == ["last.ckpt", "notes.tmp"]
    assert remove_stale_temporaries(tmp_path / "missing") == []
    # written_before: a temporary written since (a write still running beside the caller) stays
    old, new = directory / ".a.npz.x1.tmp", directory / ".b.npz.x2.tmp"
    for path in (old, new):
        path.write_bytes(b"half")
    os.utime(old, (1, 1))
    assert remove_stale_temporaries(directory, written_before=1000) == [old]
    assert new.exists()


def test_a_continued_run_rewrites_last_ckpt_in_place(tmp_path, data_root):
    """No last-v1.ckpt: --resume last must find the newest state. (A new run in the folder, without
    --resume, is refused: tests/training/test_train.py.)"""
    run_dir = tmp_path / "run"
    train(tmp_path, run_dir, data_root, 2)
    train(tmp_path, run_dir, data_root, 3, "--resume", "last", top={"checkpoint_every_n_steps": 1})
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "last-v1.ckpt" not in names and "last.ckpt" in names
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == 3


def test_commands_checking_one_folder_at_once_never_refuse_each_other(tmp_path):
    """check_writable's probe is its own: a lease's two sample grids check one folder at the same
    time (with one fixed probe name, one removed the other's and was refused: 'No such file')."""
    refused = []

    def check_many() -> None:
        for _ in range(500):
            try:
                check_writable(tmp_path / "grids", "--out")
            except OSError as error:
                refused.append(error)

    threads = [threading.Thread(target=check_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert refused == [] and list((tmp_path / "grids").iterdir()) == []  # no probe left behind
