"""Decoding's CPU cost on each of several trees, side by side: CPU seconds of one thread for 2
images of ``quick``'s model drawn with the eager step and with the compiled step (each after a
warm-up, which compiles), and for 4 completions of the first val image from its top 16 rows with
the tree's shipped completion model (the demo's defaults); and a training step's (``train``: 5
steps of ``quick``'s model on 8 random images, forward, backward and Adam, after 2 untimed). Every measurement is a fresh process,
the trees alternated round by round, so that a drift of the machine falls on all of them.

    .venv/bin/python experiments/decode_side_by_side.py --trees /tmp/old /tmp/base . --rounds 4

Each tree is imported through ``PYTHONPATH`` (a worktree of an older commit). CPU seconds, not
wall seconds: a process that waits for a core is not charged for it, but a machine busy with other
work still slows each one (shared caches), so run it on an idle machine. Prints one line a
measurement, then the medians, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

TASKS = ("eager", "compiled", "completion", "train")

# What one fresh process measures: argv = task, tree, CIFAR-10 root. Written for every tree since
# 1ba98d3 (which has neither build_model nor the config sections' loader in its presets' form).
MEASURE = r"""
import json, sys, time
import numpy as np, torch, yaml
torch.set_num_threads(1)
import imagetx
from imagetx import ModelConfig, load_model
from imagetx.model.sampler import sample
build = getattr(imagetx, "build_model", getattr(imagetx, "ImageTransformer", None))
task, tree, data = sys.argv[1:4]
assert imagetx.__file__.startswith(tree), imagetx.__file__
if task == "completion":
    image = torch.from_numpy(np.load(f"{data}/train-4.npz")["images"][5000:5001]).repeat(4, 1, 1, 1)  # val's first
    model = load_model(f"{tree}/pretrained/completion")
    sample(model, 4, prefix=image, given_rows=31, generator=torch.Generator().manual_seed(0))  # warm-up
    start = time.process_time()
    sample(model, 4, prefix=image, given_rows=16, generator=torch.Generator().manual_seed(0))
else:
    torch.manual_seed(0)
    with open(f"{tree}/configs/quick.yaml") as handle:
        config = ModelConfig.from_dict(yaml.safe_load(handle)["model"]["config"])
    model = build(config).eval()
if task == "train":
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    images = torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    def step():
        loss = model.bits_per_dim(images).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for _ in range(2):
        step()
    start = time.process_time()
    for _ in range(5):
        step()
elif task != "completion":
    compiled = task == "compiled"
    sample(model, 2, generator=torch.Generator().manual_seed(0), compiled=compiled)  # warm-up (compiles)
    start = time.process_time()
    sample(model, 2, generator=torch.Generator().manual_seed(1), compiled=compiled)
print(json.dumps({"seconds": time.process_time() - start}))
"""


def measure(task: str, tree: Path, data_root: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, task, str(tree), str(data_root)], env=env,
                          capture_output=True, text=True, timeout=900, cwd="/")
    if done.returncode:
        raise SystemExit(f"{tree} {task}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=Path, nargs="+", required=True, help="repositories (worktrees) to compare")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--data-root", type=Path, default=Path("../shared/cifar10"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    trees, data_root = [tree.resolve() for tree in args.trees], args.data_root.resolve()
    seconds = {str(tree): {task: [] for task in args.tasks} for tree in trees}
    for round_ in range(1, args.rounds + 1):
        for task in args.tasks:
            for tree in trees:
                taken = measure(task, tree, data_root)
                seconds[str(tree)][task].append(round(taken, 3))
                print(f"round {round_} {task:10s} {tree}: {taken:.3f} s", flush=True)
    for tree, tasks in seconds.items():
        print(f"{tree}: " + ", ".join(f"{task} {statistics.median(values):.3f} s (median)" for task, values in tasks.items()))
    result = {"cpu_seconds": seconds}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
