"""Train preset variants for fixed step budgets, several at once, and score each on the
whole validation split: how the quick presets (docs/model.md §8, shrunk) were chosen.

    .venv/bin/python -m experiments.budget_sweep --plan experiments/quick_presets_plan.txt \
        --data.root DIR [--parallel 8] [--out runs/sweep] [--json sweep.json] [--val_size 5000]

A plan holds one run per line, ``NAME CONFIG STEPS [OVERRIDES...]`` (``#`` starts a
comment); OVERRIDES are ``python -m imagetx.train`` arguments, e.g.
``--model.config.n_layers 2 --model.peak_lr 0.003``. Each run trains exactly STEPS
optimiser steps (``max_time`` off, so the cosine ends at STEPS, W&B off), then
``python -m imagetx.evaluate --split val`` scores its last checkpoint.

Made for a GPU: a small model at batch 8 leaves most of one idle, so 8 runs share it and
a sweep of what 20 minutes of the 2-core CPU buys each variant (its CPU step count, from
the variant's measured seconds per step) takes minutes. Runs that fail are reported with
the tail of their log; the others still count. Prints a table and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from experiments.json_result import emit

LOG_TAIL = 1500  # characters of a failed run's log shown in the table's error column


@dataclass
class Run:
    name: str
    config: str
    steps: int
    overrides: list[str]


def read_plan(path: Path) -> list[Run]:
    """Runs of a plan file, or a SystemExit naming the bad line."""
    runs, names = [], set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        where = f"{path}:{number}"
        try:
            words = shlex.split(line, comments=True)
        except ValueError as error:  # an unclosed quote
            sys.exit(f"{where}: {error}")
        if not words:
            continue
        if len(words) < 3 or not words[2].isdigit() or int(words[2]) < 1:
            sys.exit(f"{where}: expected 'NAME CONFIG STEPS [OVERRIDES...]' with STEPS a positive integer")
        if words[0] in names:
            sys.exit(f"{where}: run name {words[0]!r} is used twice; names pick output folders")
        names.add(words[0])
        runs.append(Run(words[0], words[1], int(words[2]), words[3:]))
    if not runs:
        sys.exit(f"{path} holds no runs")
    return runs


def train_and_score(run: Run, root: str, val_size: int, out: Path) -> dict:
    folder = out / run.name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "sweep.log"
    train = [sys.executable, "-m", "imagetx.train", "--config", run.config, "--data.root", root,
             "--data.val_size", str(val_size), "--wandb", "disabled",
             "--trainer.max_time", "null", "--trainer.max_steps", str(run.steps),
             "--trainer.default_root_dir", str(folder), *run.overrides]
    score = [sys.executable, "-m", "imagetx.evaluate", "--ckpt", str(folder / "checkpoints" / "last.ckpt"),
             "--data.root", root, "--val_size", str(val_size), "--split", "val"]
    result = {"name": run.name, "config": run.config, "steps": run.steps, "overrides": " ".join(run.overrides)}
    with open(log, "w") as f:
        for what, command in (("train", train), ("evaluate", score)):
            f.write(f"$ {shlex.join(command)}\n")
            f.flush()
            start = time.time()
            done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT)
            result[f"{what}_seconds"] = round(time.time() - start, 1)
            if done.returncode:
                result["error"] = f"{what} exited {done.returncode}: {log.read_text()[-LOG_TAIL:]}"
                return result
    # evaluate's last line is its JSON summary
    result["bpd"] = json.loads(log.read_text().strip().splitlines()[-1])["bpd"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", type=Path, required=True, help="one run per line: NAME CONFIG STEPS [OVERRIDES...]")
    parser.add_argument("--data.root", dest="root", required=True, help="CIFAR-10 folder (npz shards or torchvision)")
    parser.add_argument("--val_size", type=int, default=5000, help="the last N training images are val (default 5000)")
    parser.add_argument("--parallel", type=int, default=8, help="runs at once (default 8)")
    parser.add_argument("--out", type=Path, default=Path("runs/sweep"), help="one folder per run in here")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if not args.plan.is_file():
        sys.exit(f"--plan {args.plan}: no such file")
    if args.parallel < 1:
        sys.exit(f"--parallel {args.parallel}: must be 1 or more")
    runs = read_plan(args.plan)
    # A second training run in the same folder would leave the first one's last.ckpt to be scored.
    taken = [str(args.out / run.name) for run in runs if (args.out / run.name / "checkpoints").exists()]
    if taken:
        sys.exit(f"{', '.join(taken)} already hold checkpoints: remove them or pass another --out")
    print(f"{len(runs)} runs, {args.parallel} at a time; logs in {args.out}/NAME/sweep.log", file=sys.stderr)
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(train_and_score, run, args.root, args.val_size, args.out) for run in runs]
        for done, future in enumerate(as_completed(futures), start=1):  # progress, in finishing order
            r = future.result()
            print(f"[{done}/{len(runs)}] {r['name']}: {r.get('bpd', 'failed')}", file=sys.stderr, flush=True)
        results = [future.result() for future in futures]
    for r in results:
        score = f"{r['bpd']:.3f}" if "bpd" in r else "failed"
        print(f"{r['name']:24s} {r['steps']:6d} steps  val bpd {score:>7s}  {r['overrides']}")
        if "error" in r:
            print(f"    {r['error']}")
    summary = {"plan": str(args.plan), "runs": results}
    emit(summary, args.json)
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
