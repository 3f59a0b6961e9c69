"""The README's sampling commands under each torch thread setting, interleaved: what chose the
thread count of decoding (imagetx/model/sampler.py, ``DECODING_THREADS``).

    .venv/bin/python -m scripts.bench_threads [--rounds 3] [--settings default 1 2]
                                              [--json bench_threads.json]

Each round runs every (command, setting) once, in a fresh process, in turn, so that a machine
whose load changes (other jobs starting, stopping) changes every setting's figures alike.
A setting: ``default`` (no variable set: what a user gets), or N (``OMP_NUM_THREADS=N``,
which imagetx leaves alone: it decodes with what the user asked for). Reported per command and
setting: the median over rounds of the command's own ``seconds`` (load, prepare, sample,
write) and ``sampling_seconds``, and the wall time of the process (imports included).
Say, with the figures, what else the machine was running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHOTO = ROOT / "imagetx" / "demo" / "examples" / "bird_45006.png"
# The README's two "Try it without training" commands with a bundled picture, and generation
# of a larger batch (where threads have more work per step to share).
COMMANDS = {
    "complete 4": ["--ckpt", "pretrained/completion", "--task", "complete", "--rows", "16", "--images", str(PHOTO),
                   "--samples", "4"],
    "superres 3": ["--ckpt", "pretrained/superres", "--task", "superres", "--images", str(PHOTO)],
    "generate 64": ["--ckpt", "pretrained/completion", "--task", "generate", "--count", "64"],
}


def run_once(command: list[str], setting: str, out: str) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if setting != "default":
        env["OMP_NUM_THREADS"] = setting
    started = time.perf_counter()
    process = subprocess.run([sys.executable, "-m", "imagetx.sample", *command, "--out", out], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    summary = json.loads(process.stdout.strip().splitlines()[-1])
    return {"seconds": summary["seconds"], "sampling_seconds": summary["sampling_seconds"], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["default", "1", "2"])
    parser.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--json", default="bench_threads.json")
    args = parser.parse_args()
    runs: dict[tuple[str, str], list[dict]] = {(c, s): [] for c in args.commands for s in args.settings}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(args.rounds):
            for command in args.commands:
                for setting in args.settings:
                    runs[command, setting].append(run_once(COMMANDS[command], setting, out))
    rows = []
    print(f"{'command':<12} {'threads':<8} {'seconds':>8} {'sampling':>9} {'wall':>6}   (medians of {args.rounds})")
    for (command, setting), results in runs.items():
        medians = {key: statistics.median(r[key] for r in results) for key in ("seconds", "sampling_seconds", "wall")}
        rows.append({"command": command, "threads": setting, **medians, "runs": results})
        print(f"{command:<12} {setting:<8} {medians['seconds']:>8.2f} {medians['sampling_seconds']:>9.2f} "
              f"{medians['wall']:>6.1f}")
    Path(args.json).write_text(json.dumps({"cpu_count": os.cpu_count(), "load": os.getloadavg(), "rows": rows},
                                          indent=2))


if __name__ == "__main__":
    main()
