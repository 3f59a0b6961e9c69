"""What a cluster does to a training run, done to a real one: 2 gloo processes on the CPU, started
by Lightning's launcher (``--trainer.devices 2 --trainer.strategy ddp``) or by torchrun.

    python -m scripts.cluster_check sigterm --launcher lightning --trials 10 --json sigterm_lightning.json
    python -m scripts.cluster_check sigterm --launcher torchrun --trials 10 --json sigterm_torchrun.json
    python -m scripts.cluster_check hung --launcher lightning --timeout 10 --json hung.json

``sigterm``: each trial starts the run, waits a random time into training, sends SIGTERM to every
process of it (the command, and every process it started: what SLURM or a pod's end does), and checks: the
command ended by itself (no deadlock, within ``DEADLINE``), with exit status 143 (torchrun's own: 1), a ``stopped:``
line naming step N, and ``last.ckpt`` at step N; then the same command again, which must end where
an uninterrupted run ends, bitwise (weights, optimiser, schedule, loader state). ``hung``: stops one
process with SIGSTOP mid-run and times how long the job takes to end, with what line.
Prints a line a trial and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

STEPS = 40  # steps of a run: 2 epochs of the data below (20 steps each)
TRAIN_IMAGES, VAL_IMAGES = 80, 4  # 80 / (2 processes x batch 2): 20 steps an epoch
STEP_SECONDS = 0.15  # each step slowed to this (SlowSteps below), so that a signal lands mid-run
DEADLINE = 120.0  # seconds a stopped run may take to end before it counts as deadlocked

SLOW_STEPS = '''
import time
import lightning as L

class SlowSteps(L.Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args) -> None:
        time.sleep(self.seconds)
'''


def write_run(folder: Path) -> Path:
    """Data (npz shards), the callback module and the run's YAML under ``folder``; returns the YAML."""
    rng = np.random.default_rng(0)
    data = folder / "data"
    data.mkdir(parents=True)
    images = rng.integers(0, 256, size=(TRAIN_IMAGES + VAL_IMAGES, 32, 32, 3), dtype=np.uint8)
    np.savez(data / "train-0.npz", images=images, labels=np.zeros(len(images), dtype=np.uint8))
    (folder / "slow_steps.py").write_text(SLOW_STEPS)
    config = {
        "seed_everything": 0,
        "trainer": {"max_steps": STEPS, "val_check_interval": 25, "check_val_every_n_epoch": None,
                    "limit_val_batches": 1, "num_sanity_val_steps": 0, "enable_progress_bar": False,
                    "enable_model_summary": False, "log_every_n_steps": 5,
                    "callbacks": [{"class_path": "slow_steps.SlowSteps", "init_args": {"seconds": STEP_SECONDS}}]},
        "model": {"config": {"image_size": 32, "head": "dmol", "mixture_components": 2, "n_layers": 1,
                             "d_model": 16, "d_filter": 32, "dropout": 0.1, "position_encoding": "learned",
                             "attention": {"n_heads": 2, "kind": "local_1d", "query_block_length": 256}},
                  "optimizer": "adam_noam", "peak_lr": 0.003, "warmup_steps": 5},
        "data": {"root": str(data), "batch_size": 2, "eval_batch_size": 2, "val_size": VAL_IMAGES,
                 "random_flip": True},
        "checkpoint_every_n_steps": 0,  # last.ckpt only where the run stops (and at validations)
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def command(launcher: str, config: Path, run_dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
    train = ["--config", str(config), "--trainer.default_root_dir", str(run_dir), "--resume", "auto",
             "--wandb", "disabled", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
             "--trainer.strategy", "ddp", *extra]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(free_port()), "-m", "imagetx.train", *train]
    return [sys.executable, "-m", "imagetx.train", *train]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(folder: Path) -> dict[str, str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
           "IMAGETX_CONFIG_IMPORTS": "slow_steps"}  # the run's own callback module (imagetx/cli/config_guard.py)
    env.pop("MASTER_PORT", None)
    return env


def state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)


def same_training_state(a: dict, b: dict) -> bool:
    """Weights, optimiser, schedule and loader state equal, bitwise."""
    def equal(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(equal, x, y))
        return x == y

    loader = lambda c: c["loops"]["fit_loop"]["state_dict"]["combined_loader"]  # noqa: E731
    return (a["global_step"] == b["global_step"] and all(equal(a[k], b[k]) for k in
            ("state_dict", "optimizer_states", "lr_schedulers")) and equal(loader(a), loader(b)))


def expected_exit(launcher: str) -> int:
    """The command's exit status at a SIGTERM: the run's own, 143 (128 + SIGTERM), or torchrun's, which
    was sent it too and ends with 1 whatever its workers' (each ends 143, its stopped: line says so)."""
    return 143 if launcher == "lightning" else 1


def run_to_end(launcher: str, config: Path, run_dir: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(command(launcher, config, run_dir), env=env, capture_output=True, text=True,
                          timeout=600, cwd=config.parent)


def sigterm_trial(launcher: str, config: Path, run_dir: Path, env: dict, reference: dict, wait: float) -> dict:
    """One stop by SIGTERM to every process after ``wait`` seconds of training, then the same command."""
    process = subprocess.Popen(command(launcher, config, run_dir), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=config.parent)
    marker = run_dir / "csv"  # written once training has begun logging
    started = time.monotonic()
    while not marker.exists() and process.poll() is None and time.monotonic() - started < DEADLINE:
        time.sleep(0.05)
    time.sleep(wait)
    if process.poll() is not None:  # the run ended before the signal: a trial of nothing
        raise SystemExit(f"error: the run ended within {wait:.1f} s, before its SIGTERM: slow its steps")
    signal_run(process.pid, signal.SIGTERM)
    sent = time.monotonic()
    try:
        out, err = process.communicate(timeout=DEADLINE)
        deadlocked = False
    except subprocess.TimeoutExpired:
        signal_run(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        deadlocked = True
    ended_in = time.monotonic() - sent
    lines = [line for line in err.splitlines() if line.startswith("stopped:")]
    said = re.search(r"after step (\d+)", lines[-1]) if lines else None
    saved = state(run_dir)["global_step"] if (run_dir / "checkpoints" / "last.ckpt").exists() else None
    resumed = run_to_end(launcher, config, run_dir, env)
    final = state(run_dir)
    return {"wait_s": round(wait, 2), "deadlocked": deadlocked, "ended_in_s": round(ended_in, 2),
            "exit": process.returncode, "stopped_line": lines[-1] if lines else None,
            "stop_step": int(said.group(1)) if said else None, "last_ckpt_step": saved,
            "rerun_exit": resumed.returncode, "rerun_equal": same_training_state(final, reference),
            "ok": (not deadlocked and process.returncode == expected_exit(launcher) and said is not None
                   and saved == int(said.group(1)) and resumed.returncode == 0
                   and same_training_state(final, reference))}


def hung_trial(launcher: str, config: Path, run_dir: Path, env: dict, timeout: float, wait: float) -> dict:
    """SIGSTOP to the second process after ``wait`` seconds: how long the job takes to end, and its line."""
    process = subprocess.Popen(command(launcher, config, run_dir, ("--collective_timeout", str(timeout))),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, cwd=config.parent)
    marker = run_dir / "csv"
    while not marker.exists() and process.poll() is None:
        time.sleep(0.05)
    time.sleep(wait)
    workers = run_pids(process.pid)
    victim = max(workers) if launcher == "lightning" else max(p for p in workers if p != process.pid)
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        out, err = process.communicate(timeout=timeout + DEADLINE)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
        out, err = "", ""
    ended_in = time.monotonic() - stopped
    time.sleep(1.0)  # the killed take a moment to go
    left = [pid for pid in workers if alive(pid)]  # what the job left, stopped for ever or still waiting
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    return {"timeout_s": timeout, "ended": ended, "ended_in_s": round(ended_in, 2), "exit": process.returncode,
            "error_line": errors[-1] if errors else None, "left_behind": len(left),
            "ok": ended and process.returncode not in (0, None) and bool(errors) and not left}


def run_pids(root: int) -> list[int]:
    """The live processes of a run: ``root`` and its descendants (torchrun starts its workers in
    sessions of their own, so a session does not hold them all)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # state, ppid, ...
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, grew = {root} if root in parents else set(), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def signal_run(root: int, signum: int) -> None:
    """``signum`` to every process of the run, as a scheduler sends it to every task."""
    for pid in run_pids(root):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main(args: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m scripts.cluster_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("check", choices=["sigterm", "hung"])
    parser.add_argument("--launcher", choices=["lightning", "torchrun"], default="lightning")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=10.0, help="hung: the run's --collective_timeout")
    parser.add_argument("--seed", type=int, default=0, help="the trials' random stop times")
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(args)
    folder = Path(tempfile.mkdtemp(prefix="cluster_check_"))
    try:
        config, env = write_run(folder), environment(folder)
        draw = random.Random(options.seed)
        trials = []
        if options.check == "sigterm":
            whole = run_to_end(options.launcher, config, folder / "whole", env)
            if whole.returncode != 0:
                raise SystemExit(f"error: the uninterrupted run failed:\n{whole.stderr[-3000:]}")
            reference = state(folder / "whole")
            for trial in range(options.trials):
                wait = draw.uniform(0.3, 0.7 * STEPS * STEP_SECONDS)  # the logs begin a few steps in
                result = sigterm_trial(options.launcher, config, folder / f"run{trial}", env, reference, wait)
                trials.append(result)
                print(json.dumps(result), flush=True)
        else:
            for trial in range(options.trials):
                result = hung_trial(options.launcher, config, folder / f"run{trial}", env, options.timeout,
                                    draw.uniform(0.5, 3.0))
                trials.append(result)
                print(json.dumps(result), flush=True)
        summary = {"check": options.check, "launcher": options.launcher, "processes": 2, "backend": "gloo",
                   "trials": len(trials), "ok": sum(t["ok"] for t in trials), "torch": torch.__version__,
                   "results": trials}
        if options.check == "sigterm":
            summary["deadlocks"] = sum(t["deadlocked"] for t in trials)
        print(f"{options.check} under {options.launcher}: {summary['ok']} of {len(trials)} trials as they must be")
        if options.json:
            options.json.write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
