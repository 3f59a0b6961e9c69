"""Seconds from a stop signal to the end of a training run, in each phase of the run (issue 126, item 3).

    python -m scripts.signal_latency [--signal TERM|INT|USR1] [--json signal_latency.json] [--repo DIR]

Each phase is a real run of ``python -m imagetx.train`` (one process, or ``--devices N`` gloo processes on
the CPU, the tiny model of ``scripts/cluster_check.py``), signalled from outside (every process) at a
moment a callback marks with a file:

* ``sanity check``: the validation before the first step (each batch slowed to ``VAL_SECONDS``);
* ``validation``: a mid-run validation (the same);
* ``final validation``: the one Lightning runs after ``--trainer.max_time`` ran out;
* ``first step, compiling``: ``model.compile: true``, Inductor's cache cold, the first step's compilation;
* ``checkpoint write``: while ``last.ckpt`` is written (the write slowed to ``WRITE_SECONDS``);
* ``training step``: a step (slowed to ``STEP_SECONDS``), which ends before the stop: the reference.

For each: the seconds from the signal to the process's end, its exit status, its ``stopped:`` line and the
step ``last.ckpt`` holds (read whole: a write is never cut). ``--repo DIR`` runs the imagetx of another
checkout (e.g. ``git worktree add /tmp/before HEAD~1``) with the same phases: the figures before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from scripts.cluster_check import VAL_IMAGES, environment, signal_run, write_run

VAL_BATCHES = VAL_IMAGES  # the run's val images, one a batch
VAL_SECONDS = 3.0  # each validation batch slowed to this: a validation lasts VAL_BATCHES times as long
STEP_SECONDS = 1.0  # a training step slowed to this
WRITE_SECONDS = 3.0  # a write of last.ckpt slowed to this, between its bytes and its rename
SETTLE_SECONDS = 0.5  # the signal comes this long after the phase's mark: inside the phase
MARKS_FOLDER = "marks"  # where the runs' callbacks mark the moments to signal at
DEADLINE = 300.0  # a run still going this long after its signal is killed and reported as such

MARKS = '''
import time
from pathlib import Path

import lightning as L
import torch

from imagetx.io.atomic import atomic_write
from imagetx.training.checkpoint_io import AtomicCheckpointIO


def mark(folder, name):
    (Path(folder) / name).touch()


class Marks(L.Callback):
    """Marks the moments a phase is signalled (a file in FOLDER), and slows validation batches and steps."""

    def __init__(self, folder: str, val_seconds: float = 0.0, step_seconds: float = 0.0) -> None:
        self.folder, self.val_seconds, self.step_seconds = folder, val_seconds, step_seconds

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            mark(self.folder, "sanity")
        elif trainer.should_stop:
            mark(self.folder, "final-validation")
        else:
            mark(self.folder, "validation")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        time.sleep(self.val_seconds)  # in the batch: every callback's start of it has run

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        mark(self.folder, f"step-{trainer.global_step}")
        time.sleep(self.step_seconds)


class SlowWrites(AtomicCheckpointIO):
    """imagetx's atomic checkpoint writer, each last.ckpt write slowed between its bytes and its rename."""

    def __init__(self, folder: str, seconds: float) -> None:
        super().__init__()
        self.folder, self.seconds = folder, seconds

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if Path(path).name != "last.ckpt":
            return super().save_checkpoint(checkpoint, path, storage_options)

        def write(handle) -> None:
            torch.save(checkpoint, handle)
            mark(self.folder, "writing")
            time.sleep(self.seconds)

        atomic_write(path, write)
'''


def phases(folder: Path) -> dict[str, tuple[str, dict, dict]]:
    """{phase: (the mark to signal at, trainer settings, other settings: ``model`` and top-level keys)}."""
    def marks(**init_args) -> list[dict]:
        return [{"class_path": "signal_marks.Marks", "init_args": {"folder": str(folder / MARKS_FOLDER), **init_args}}]

    val = {"limit_val_batches": VAL_BATCHES, "callbacks": marks(val_seconds=VAL_SECONDS)}
    slow_writes = {"class_path": "signal_marks.SlowWrites",
                   "init_args": {"folder": str(folder / MARKS_FOLDER), "seconds": WRITE_SECONDS}}
    return {
        "sanity check": ("sanity", {**val, "num_sanity_val_steps": VAL_BATCHES}, {}),
        "validation": ("validation", {**val, "val_check_interval": 3}, {}),
        "final validation": ("final-validation", {**val, "max_steps": -1, "max_time": "00:00:00:10",
                                                  "callbacks": marks(val_seconds=VAL_SECONDS, step_seconds=0.2)}, {}),
        "first step, compiling": ("step-0", {"callbacks": marks()}, {"model": {"compile": True}}),
        "checkpoint write": ("writing", {"callbacks": marks(step_seconds=STEP_SECONDS), "plugins": [slow_writes]},
                             {"checkpoint_every_n_steps": 3}),
        "training step": ("step-4", {"callbacks": marks(step_seconds=STEP_SECONDS)}, {}),
    }


def measure(folder: Path, name: str, at: str, trainer: dict, other: dict, signum: int, env: dict,
            devices: int = 1) -> dict:
    """One run of ``folder``'s config with ``trainer`` and ``other`` settings, signalled at the mark ``at``."""
    base = yaml.safe_load((folder / "run.yaml").read_text())
    base["trainer"] = {**base["trainer"], "val_check_interval": 1000, **trainer}
    base["model"] = {**base["model"], **other.get("model", {})}
    base["data"]["eval_batch_size"] = 1  # VAL_BATCHES batches of the run's val images
    base.update({key: value for key, value in other.items() if key != "model"})
    run_dir = folder / name.replace(" ", "_").replace(",", "")
    config = folder / f"{run_dir.name}.yaml"
    config.write_text(yaml.safe_dump(base))
    marks = folder / MARKS_FOLDER
    shutil.rmtree(marks, ignore_errors=True)  # the last phase's
    marks.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "imagetx.train", "--config", str(config), "--wandb", "disabled",
                                "--trainer.default_root_dir", str(run_dir), "--trainer.devices", str(devices),
                                "--trainer.strategy", "ddp" if devices > 1 else "auto",
                                *(("--trainer.accelerator", "cpu") if devices > 1 else ())],
                               env={**env, "TORCHINDUCTOR_CACHE_DIR": str(run_dir / "inductor")},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder)
    while not (marks / at).exists() and process.poll() is None:
        time.sleep(0.02)
    if process.poll() is not None:
        return {"phase": name, "error": f"the run ended before its mark {at!r}: {process.stderr.read()[-2000:]}"}
    time.sleep(SETTLE_SECONDS)
    if devices > 1:
        signal_run(process.pid, signum)  # every process of the run, as a scheduler signals every task
    else:
        process.send_signal(signum)
    sent = time.monotonic()
    try:
        out, err = process.communicate(timeout=DEADLINE)
        ended = True
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        ended = False
    seconds = time.monotonic() - sent
    # (several processes may write their lines at once, into one line)
    lines = [line for line in err.replace("stopped:", "\nstopped:").splitlines() if line.startswith(("stopped:", "error:"))]
    last = run_dir / "checkpoints" / "last.ckpt"
    held = torch.load(last, map_location="cpu", weights_only=False)["global_step"] if last.exists() else None
    return {"phase": name, "seconds": round(seconds, 2), "ended": ended, "exit": process.returncode,
            "line": lines[-1] if lines else None, "traceback": "Traceback" in err, "last_ckpt_step": held,
            "temporaries_left": len(list(last.parent.glob(".*.tmp"))) if last.parent.exists() else 0}


def main(args: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m scripts.signal_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--signal", choices=["TERM", "INT", "USR1"], default="TERM")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--repo", type=Path, help="the checkout whose imagetx runs (default: this one)")
    parser.add_argument("--phase", action="append", help="only these phases (repeatable)")
    parser.add_argument("--devices", type=int, default=1,
                        help="processes (gloo on the CPU, Lightning's launcher); the signal goes to every one")
    options = parser.parse_args(args)
    signum = signal.Signals[f"SIG{options.signal}"]
    folder = Path(tempfile.mkdtemp(prefix="signal_latency_"))
    try:
        write_run(folder)
        (folder / "signal_marks.py").write_text(MARKS)
        env = environment(folder)
        env["IMAGETX_CONFIG_IMPORTS"] = "slow_steps,signal_marks"  # the marks' module (cli/config_guard.py)
        if options.repo is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(options.repo.resolve()), env["PYTHONPATH"]])
        results = []
        for name, (at, trainer, other) in phases(folder).items():
            if options.phase and name not in options.phase:
                continue
            result = measure(folder, name, at, trainer, other, signum, env, options.devices)
            results.append(result)
            print(json.dumps(result), flush=True)
        print(f"\n{'phase':<24}{'seconds':>9}{'exit':>6}  last.ckpt  line")
        for r in results:
            seconds = f"{r['seconds']:.1f}" if r.get("ended") else f">{DEADLINE:.0f}"
            print(f"{r['phase']:<24}{seconds:>9}{str(r.get('exit')):>6}  {str(r.get('last_ckpt_step')):>9}  "
                  f"{r.get('line') or r.get('error')}")
        if options.json:
            options.json.write_text(json.dumps({"signal": signum.name, "repo": str(options.repo or "."),
                                                "devices": options.devices,
                                                "torch": torch.__version__, "results": results}, indent=1))
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
