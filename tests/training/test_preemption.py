"""Training that survives a cluster (training/interrupt.py, training/distributed.py, training/resume.py):
a stop signal keeps every step and exits non-zero, ``--resume auto`` is the one command that starts
or resumes, a hung process ends the job, start-up file work is safe with every process doing it,
and a resume with another number of processes mid-epoch is refused.

The runs of several processes (2 gloo processes on the CPU, under Lightning's launcher and torchrun)
are ``scripts/cluster_check.py``'s trials, one each here; the script runs ten of each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import lightning as L
import pytest
import torch

from helpers import assert_goes_on_as_the_whole_run, write_train_config
from imagetx.data.datamodule import ImageDataset, TrainOrder, check_processes
from imagetx.data.sources import DataError
from imagetx.train import clean_up_checkpoints, main
from imagetx.training.continuation import pack, unpack
from scripts import cluster_check

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


class SignalAt(L.Callback):
    """Sends this process ``signum`` at the end of the given step (what a scheduler does, mid-run)."""

    def __init__(self, step: int, signum: int = int(signal.SIGTERM)) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            signal.raise_signal(self.signum)


class LastSteps(L.Callback):
    """Records, at the start of every step, the step that last.ckpt holds (None: none yet)."""

    seen: list = []

    def on_train_batch_start(self, trainer, *args) -> None:
        path = os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
        held = torch.load(path, weights_only=False)["global_step"] if os.path.exists(path) else None
        LastSteps.seen.append(held)


def config_with(tmp_path, run_dir, data_root, callbacks=(), name="c.yaml", **settings):
    return write_train_config(tmp_path / name, run_dir, data_root, max_steps=8, val_check_interval=4,
                              model={"dropout": 0.1}, data={"random_flip": True},
                              top={"checkpoint_every_n_steps": 0},
                              callbacks=[{"class_path": f"test_preemption.{cls}", "init_args": args}
                                         for cls, args in callbacks], **settings)


def test_sigterm_keeps_the_step_exits_143_and_the_same_command_goes_on(tmp_path, data_root, capsys):
    """SIGTERM at step 3 (with last.ckpt written only at validations, step 4 the first): last.ckpt
    at step 3, one line, 143; the same command with --resume auto ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    stopped = config_with(tmp_path, run_dir, data_root, [("SignalAt", {"step": 3})], name="stopped.yaml")
    with pytest.raises(SystemExit) as info:
        main(["--config", str(stopped), "--wandb", "disabled", "--resume", "auto"])
    assert info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)  # as it was before the run
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert lines[-1] == (f"stopped: training preempted (SIGTERM) after step 3; {last} holds step 3: rerun the "
                         "same command to go on; evaluate it with: python -m imagetx.evaluate --ckpt "
                         f"{last} --data.root {data_root} --val_size 2 --split val"), lines  # issue 126: how to score it
    assert torch.load(last, weights_only=False)["global_step"] == 3
    plain = config_with(tmp_path, run_dir, data_root, name="plain.yaml")
    assert_goes_on_as_the_whole_run(tmp_path, run_dir, plain, steps=8)


def test_sigusr1_under_slurm_keeps_the_step_and_requeues_the_job(tmp_path, data_root, capsys, monkeypatch):
    """SLURM's warning signal (SIGUSR1, Lightning's SLURMEnvironment's requeue signal): the step kept,
    then ``scontrol requeue JOB`` (a stand-in here records its arguments), exit 138."""
    bin_dir, called = tmp_path / "bin", tmp_path / "scontrol.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {called}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                        "SLURM_NODEID": "0", "SLURM_JOB_NAME": "imagetx", "SLURM_NTASKS_PER_NODE": "1"}.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("SignalAt", {"step": 3, "signum": int(signal.SIGUSR1)})])
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "auto"])
    assert info.value.code == 128 + signal.SIGUSR1
    line = [line for line in capsys.readouterr().err.splitlines() if line.strip()][-1]
    assert "preempted (SIGUSR1) after step 3" in line and "SLURM job 4242 requeued" in line, line
    assert called.read_text().split() == ["requeue", "4242"]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3


def test_resume_auto_starts_a_run_resumes_it_and_says_when_it_is_finished(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root)
    main(["--config", str(config), "--wandb", "disabled", "--resume", "auto"])  # nothing there: starts
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 8
    capsys.readouterr()
    main(["--config", str(config), "--wandb", "disabled", "--resume", "auto"])  # finished: exit 0, one line
    out = capsys.readouterr().out.strip().splitlines()
    last = run_dir / "checkpoints" / "last.ckpt"
    assert out[-1] == (f"finished: {last} is a finished run (it has taken its max_steps 8); "
                       "nothing is left to train (--resume auto); evaluate it with: python -m imagetx.evaluate "
                       f"--ckpt {last} --data.root {data_root} --val_size 2 --split val"), out  # issue 126: and how to score it
    versions = list(run_dir.glob("csv/version_*"))
    assert len(versions) == 1  # nothing started for the finished run
    # another data set in the same folder is another run: refused in one line, exit 2
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "auto", "--trainer.max_steps", "10",
              "--data.random_flip", "false"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --resume auto: ") and "data.random_flip=True there, False here" in err[-1]
    # --resume last goes on with the changed settings where the user says so
    main(["--config", str(config), "--wandb", "disabled", "--resume", "last", "--trainer.max_steps", "10",
          "--data.random_flip", "false"])
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 10


def test_last_ckpt_is_written_on_the_clock(tmp_path, data_root, monkeypatch):
    """--checkpoint_every_minutes: with the clock running 10 minutes a step, last.ckpt holds the step
    before at every step; without it (0), nothing until the run's first validation (step 4)."""
    import imagetx.training.callbacks as callbacks

    ticks = iter(range(0, 10**6, 600))
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: float(next(ticks)))
    for minutes, expected in ((10, [None, 1, 2, 3, 4, 5, 6, 7]), (0, [None, None, None, None, 4, 4, 4, 4])):
        LastSteps.seen = []
        run_dir = tmp_path / f"every{minutes}"
        config = config_with(tmp_path, run_dir, data_root, [("LastSteps", {})], name=f"{minutes}.yaml")
        main(["--config", str(config), "--wandb", "disabled", "--checkpoint_every_minutes", str(minutes)])
        assert LastSteps.seen == expected, (minutes, LastSteps.seen)


def test_every_process_joins_a_packed_continuation_and_none_removes_another_s_file(tmp_path):
    """All the processes of a run start at once: each cleans up checkpoints/ and joins the packed
    continuation it resumes. None fails and the file is whole (a later one deleted an earlier one's
    half-written file: FileNotFoundError); a killed write's temporary is removed."""
    checkpoint = {"imagetx": {"continuation": True, "model_config": {}}, "global_step": 3,
                  "optimizer_states": [{"state": {}}], "state_dict": {"w": torch.arange(2**18, dtype=torch.float32)}}
    torch.save(checkpoint, tmp_path / "continue.ckpt")
    pack(tmp_path / "continue.ckpt", tmp_path / "packed", part_bytes=2**16)
    target, errors = tmp_path / "run" / "checkpoints" / "continued-from.ckpt", []
    target.parent.mkdir(parents=True)
    killed = target.parent / ".last.ckpt.def.tmp"
    killed.write_bytes(b"a killed write")

    def start() -> None:  # what each process does at its start, in train.py's order
        try:
            clean_up_checkpoints(target.parent)
            unpack(tmp_path / "packed", target)
        except Exception as error:  # noqa: BLE001 - every failure is the test's
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert torch.equal(torch.load(target, weights_only=False)["state_dict"]["w"], checkpoint["state_dict"]["w"])
    assert not killed.exists() and not list(target.parent.glob(".*.tmp"))


def test_a_resume_mid_epoch_with_another_process_count_is_refused_at_an_epoch_end_it_goes_on():
    dataset = ImageDataset(torch.zeros(10, 4, 4, 3, dtype=torch.uint8), None)
    two = TrainOrder(dataset, seed=0, num_replicas=2, rank=0)
    taken = iter(two)
    next(taken), next(taken)
    one = TrainOrder(dataset, seed=0, num_replicas=1, rank=0)
    with pytest.raises(DataError, match="a run of 2 processes in the middle of an epoch, this run has 1: resume with 2"):
        one.load_state_dict(two.state_dict())
    for _ in taken:  # the epoch's end: each process's 5
        pass
    one.load_state_dict(two.state_dict())
    assert one.epoch == 1 and len(list(one)) == 10  # the next epoch, whole, for the one process


def test_a_requeue_on_another_process_count_mid_epoch_is_refused_in_one_line_before_any_process_starts(
        tmp_path, data_root, capsys):
    """Issue 126: a 1-process checkpoint resumed with 2 processes printed the refusal inside a 413-line
    traceback (Lightning's teardown of the loader that refused it), exit 1. Now: one line, exit 2, and
    no process of the two was started."""
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=3, val_check_interval=100)
    main(["--config", str(config), "--wandb", "disabled"])  # 3 of an epoch's 5 steps
    capsys.readouterr()
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.run([sys.executable, "-m", "imagetx.train", "--config", str(config), "--wandb", "disabled",
                           "--trainer.max_steps", "6", "--trainer.devices", "2", "--trainer.strategy", "ddp",
                           "--resume", "last"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Initializing distributed" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [proc.stderr.strip().splitlines()[-1]], proc.stderr[-3000:]
    assert "a run of 1 processes in the middle of an epoch, this run has 2: resume with 1" in errors[0]
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    check_processes(checkpoint, 1)  # the same count goes on
    with pytest.raises(DataError, match="this run has 2"):
        check_processes(checkpoint, 2)


@pytest.mark.slow
def test_sigterm_to_every_process_of_two_keeps_the_step_and_the_same_command_goes_on(tmp_path):
    """One trial under Lightning's launcher (the suite's time on 2 cores); torchrun's ten are
    scripts/cluster_check.py's (docs/experiments.md entry 37)."""
    summary = cluster_check.main(["sigterm", "--launcher", "lightning", "--trials", "1", "--seed", "3",
                                  "--json", str(tmp_path / "sigterm.json")])
    assert summary["ok"] == summary["trials"] == 1, summary["results"]


@pytest.mark.slow
def test_a_hung_process_ends_the_job_within_the_collective_timeout_in_one_line(tmp_path):
    started = time.monotonic()
    summary = cluster_check.main(["hung", "--launcher", "lightning", "--trials", "1", "--timeout", "30"])
    result = summary["results"][0]
    assert summary["ok"] == 1, result
    assert result["ended_in_s"] < 30 + 20 and "waited for the others at a collective" in result["error_line"]
    print(f"hung process: the job ended {result['ended_in_s']} s after it stopped ({time.monotonic() - started:.0f} s)")
