"""Issue 79's figure: val bits/dim against GPU minutes of training, the Image Transformer
(`cifar10_gpu`, a lease at a time) beside PixelCNN++ (`experiments/pixelcnn_pp.py` on a GPU).

    .venv/bin/python -m experiments.pixelcnn_gpu_curves --lineage lineage/cifar10_gpu \\
        --pixelcnn experiments/pixelcnn_gpu_results/lease_*/result.json --out docs/pixelcnn_gpu_val_bpd.png

The Image Transformer's minutes are those on its weights' path: each lease goes on from the last
one's continuation, written ``minutes_to_continuation`` into it, so lease k's curve starts where
the path stood at that continuation (its decay, after it, is a branch off the path). Within a
lease, a val step's minute is read from the lease's ``metrics.csv`` (``train/time``, the run's
training seconds, logged every 50 steps, interpolated). PixelCNN++'s minutes are its own
training clock's (compilation and scoring left out). Each line says its GPU. As the last line
one JSON object: the points of both and, at each PixelCNN++ run's last point, the Image
Transformer's lowest val bits/dim by then.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from experiments.json_result import emit
from scripts.plot_curve import read_rows


def lease_minutes(metrics: Path, steps: list[int], first_step: int, last_step: int,
                  training_minutes: float) -> list[float]:
    """Minutes into a lease's training at the model's ``steps``: ``train/time`` (logged every 50
    steps) interpolated between 0 at the lease's ``first_step`` and its ``training_minutes`` at
    its ``last_step``."""
    logged = [(int(row["step"]), float(row["train/time"]) / 60) for row in read_rows(metrics) if row.get("train/time")]
    at, minutes = zip(*sorted([(first_step, 0.0), *logged, (last_step, training_minutes)]))
    return [float(np.interp(step, at, minutes)) for step in steps]


def transformer_curves(lineage: Path) -> list[dict]:
    """One curve a lease: {"lease", "device", "points": [(path minutes, val bits/dim)]}."""
    curves, offset = [], 0.0
    for lease in json.loads((lineage / "lineage.json").read_text()):
        steps = [step for step, _ in lease["val_curve"]]
        within = lease_minutes(lineage / "leases" / f"lease_{lease['lease']}" / "metrics.csv", steps,
                               lease["first_step"], lease["last_step"], lease["training_minutes"])
        curves.append({"lease": lease["lease"], "device": lease["device"],
                       "points": [(offset + m, bpd) for m, (_, bpd) in zip(within, lease["val_curve"])]})
        offset += lease["minutes_to_continuation"]
    return curves


def pixelcnn_curve(result: Path) -> dict:
    """{"name", "device", "precision", "points": [(minutes, val bits/dim)], the finite ones}."""
    run = json.loads(result.read_text())
    points = [(p["minutes"], p["val_bpd"]) for p in run["curve"] if math.isfinite(p["val_bpd"])]
    return {"name": result.parent.name, "device": run["device"], "precision": run["settings"]["precision"],
            "points": points}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lineage", type=Path, required=True, help="the Image Transformer's lineage folder")
    parser.add_argument("--pixelcnn", type=Path, nargs="+", required=True, help="PixelCNN++ result.json files")
    parser.add_argument("--out", type=Path, required=True, help="the figure (PNG)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transformer = transformer_curves(args.lineage)
    pixelcnn = [pixelcnn_curve(path) for path in args.pixelcnn]
    figure, axes = plt.subplots(figsize=(8, 5))
    for curve in transformer:
        minutes, bpd = zip(*curve["points"])
        axes.plot(minutes, bpd, "o-", color="tab:blue", alpha=0.4 + 0.6 * (curve is transformer[-1]),
                  label=f"Image Transformer, lease {curve['lease']} ({curve['device']})")
    comparisons = []
    for curve in pixelcnn:
        if not curve["points"]:
            print(f"{curve['name']}: no finite val point: left out")
            continue
        minutes, bpd = zip(*curve["points"])
        axes.plot(minutes, bpd, "s-", color="tab:orange", label=f"PixelCNN++, {curve['name']} ({curve['device']}, "
                  f"{curve['precision']})")
        by_then = [value for c in transformer for m, value in c["points"] if m <= minutes[-1]]
        comparisons.append({"pixelcnn": curve["name"], "minutes": minutes[-1], "pixelcnn_val_bpd": bpd[-1],
                            "transformer_val_bpd_by_then": min(by_then) if by_then else None})
        print(f"{curve['name']}: PixelCNN++ {bpd[-1]:.3f} at {minutes[-1]:.2f} min; the Image Transformer by then: "
              + (f"{min(by_then):.3f}" if by_then else "no val point yet"))
    axes.set_xlabel("GPU minutes of training (the Image Transformer: on its weights' path)")
    axes.set_ylabel("val bits/dim")
    axes.set_title("CIFAR-10, the same 45,000 training images, 5,000 val images")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120, bbox_inches="tight")
    emit({"transformer": transformer, "pixelcnn": pixelcnn, "comparisons": comparisons, "figure": str(args.out)},
         None)


if __name__ == "__main__":
    main()
