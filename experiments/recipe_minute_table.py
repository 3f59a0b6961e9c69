"""The recipe per GPU-minute (docs/experiments.md entry 33): the fixed-step CPU runs of
experiments/recipe_minute_runs.sh combined with the training step's images/s measured on a GPU.

    .venv/bin/python -m experiments.recipe_minute_table runs/recipe_minute [--json table.json]

Per variant: val bits/dim on all 5,000 val images after 16,000 training images (each seed, and
the difference from the recipe of the same seed), the GPU's images/s relative to the recipe's,
and the projected difference per GPU-minute: at equal minutes a variant sees ``speed`` times the
recipe's images, worth ``SLOPE_PER_DOUBLING · log2(speed)`` bits/dim on this proxy's learning
curve. For the runs in miniature (a 1,000-image subset), val on 1,024 images and the mean
training loss of each 250 steps, epoch by epoch.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from experiments.json_result import emit

# The shrunk recipe's learning curve, measured: 2 layers of d 128 at batch 8 decayed to 4.073 /
# 4.047 after 12,000 images and to 3.826 / 3.828 after 24,000 (seeds 0 / 1; docs/experiments.md
# entry 32): -0.233 bits/dim for each doubling of the images seen.
SLOPE_PER_DOUBLING = round(((3.826 + 3.828) - (4.073 + 4.047)) / 2, 4)

# Training step images/s on one H200 (bf16, compiled, random images; issue "Four times the model
# per GPU lease", measured before this entry): the recipe at batch 120 and each variant's kind.
GPU_IMAGES_PER_S = {"recipe, batch 120": 2381, "batch 480": 2856, "4 heads of 64, batch 240": 2755,
                    "full causal (Flash), batch 120": 2160, "d 512, filter 1,024, batch 120": 1219}

# variant -> (the GPU measurement standing for it, what it changes); None: not measured on a GPU
VARIANTS = {
    "base": ("recipe, batch 120", "the recipe: one-row blocks over the row above, heads of 32, batch 8"),
    "full": ("full causal (Flash), batch 120", "full causal attention"),
    "rows4": (None, "4-row query blocks over the 4 rows above"),
    "heads64": ("4 heads of 64, batch 240", "heads of 64 (same width; on the GPU at batch 240)"),
    "batch32": ("batch 480", "batch 32 at a quarter of the steps, same peak"),
    "wide": ("d 512, filter 1,024, batch 120", "twice the width (d 256, filter 512), peak halved"),
}


def final_bpd(run: Path) -> float | None:
    """All-val bits/dim of a run: the sweep's evaluate (last JSON line of sweep.log or eval.log)."""
    for name in ("sweep.log", "eval.log"):
        path = run / name
        if not path.exists():
            continue
        for line in reversed(path.read_text().splitlines()):
            if line.startswith("{") and '"bpd"' in line:
                return json.loads(line)["bpd"]
    return None


def epochs(run: Path, steps_per_epoch: int) -> list[dict]:
    """Per validation: the step, val bits/dim (its 1,024 images) and the mean training loss since
    the last one."""
    rows = list(csv.DictReader(open(run / "csv" / "version_0" / "metrics.csv")))
    out, train = [], []
    for row in rows:
        if row.get("train/bpd"):
            train.append(float(row["train/bpd"]))
        if row.get("val/bpd"):
            step = int(row["step"]) + 1
            out.append({"epoch": step / steps_per_epoch, "val": float(row["val/bpd"]),
                        "train": sum(train) / len(train) if train else None})
            train = []
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, help="experiments/recipe_minute_runs.sh's OUT folder")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"slope_per_doubling": SLOPE_PER_DOUBLING, "variants": {}, "subset": {}}
    base = {seed: final_bpd(args.runs / f"base_s{seed}") for seed in (0, 1)}
    print(f"{'variant':8s} {'seed 0':>7s} {'seed 1':>7s} {'Δ s0':>7s} {'Δ s1':>7s} {'Δ mean':>7s} "
          f"{'speed':>6s} {'per GPU-min':>11s}  what")
    for name, (gpu, what) in VARIANTS.items():
        scores = {seed: final_bpd(args.runs / f"{name}_s{seed}") for seed in (0, 1)}
        deltas = {s: scores[s] - base[s] for s in (0, 1) if scores[s] is not None and base[s] is not None}
        mean = sum(deltas.values()) / len(deltas) if deltas else None
        speed = GPU_IMAGES_PER_S[gpu] / GPU_IMAGES_PER_S["recipe, batch 120"] if gpu else None
        per_minute = None if mean is None or speed is None else mean + SLOPE_PER_DOUBLING * math.log2(speed)
        result["variants"][name] = {"what": what, "bpd": scores, "delta": deltas, "delta_mean": mean,
                                    "gpu_speed": speed, "gpu_measurement": gpu, "projected_per_gpu_minute": per_minute}
        fmt = lambda v, f="+.3f": "-" if v is None else format(v, f)  # noqa: E731
        print(f"{name:8s} {fmt(scores[0], '.3f'):>7s} {fmt(scores[1], '.3f'):>7s} "
              f"{fmt(deltas.get(0)):>7s} {fmt(deltas.get(1)):>7s} "
              f"{fmt(mean):>7s} {fmt(speed, '.2f'):>6s} {fmt(per_minute):>11s}  {what}")
    for name in ("subset_drop0", "subset_drop01", "subset_flip"):
        run = args.runs / name
        if not (run / "csv").exists():
            continue
        curve = epochs(run, steps_per_epoch=1000 // 8)
        result["subset"][name] = {"bpd": final_bpd(run), "curve": curve}
        print(f"\n{name}: all-val {final_bpd(run)}")
        for point in curve:
            train = "-" if point["train"] is None else f"{point['train']:.3f}"
            print(f"  epoch {point['epoch']:5.1f}  val(1,024) {point['val']:.3f}  train {train}")
    emit(result, args.json)


if __name__ == "__main__":
    main()
