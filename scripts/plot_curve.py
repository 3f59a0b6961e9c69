"""Plot val/bpd (and train/bpd) of a run against training time, from its metrics.csv.

    .venv/bin/python scripts/plot_curve.py runs/quick/csv/version_0/metrics.csv docs/quick_val_bpd.png \
        --batch 8 [--label "quick"] [--extra OTHER.csv LABEL]

Time is the training time reconstructed from the logged ``train/images_per_sec``
(each value covers the ``window`` optimisation steps before it, see
imagetx/callbacks.py), so it excludes validation and checkpointing pauses.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_curve(path: Path, batch: int, window: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """-> (val points, train points), each (minutes, bpd)."""
    rows = list(csv.DictReader(path.open()))
    minutes_at_step: dict[int, float] = {}
    elapsed, last_step = 0.0, -1
    for row in rows:
        if row.get("train/images_per_sec"):
            step = int(row["step"])
            if step != last_step:
                elapsed += window * batch / float(row["train/images_per_sec"]) / 60.0
                last_step = step
            minutes_at_step[step] = elapsed

    def minutes(step: int) -> float:
        known = [s for s in minutes_at_step if s <= step]
        return minutes_at_step[max(known)] if known else 0.0

    val = [(minutes(int(r["step"])), float(r["val/bpd"])) for r in rows if r.get("val/bpd")]
    train = [(minutes(int(r["step"])), float(r["train/bpd"])) for r in rows if r.get("train/bpd")]
    return val, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, required=True, help="training batch size of the run")
    parser.add_argument("--window", type=int, default=10, help="steps per images/s value (TrainingSpeed.window)")
    parser.add_argument("--label", default="run")
    parser.add_argument("--extra", nargs=2, action="append", default=[], metavar=("CSV", "LABEL"),
                        help="another run (same batch size) to draw beside it")
    parser.add_argument("--target", type=float, default=None, help="draw a horizontal target line")
    args = parser.parse_args()

    fig, ax = plt.subplots(figsize=(6, 4))
    for path, label in [(args.metrics, args.label)] + [(Path(p), l) for p, l in args.extra]:
        val, train = read_curve(path, args.batch, args.window)
        line, = ax.plot(*zip(*val), marker="o", markersize=3, label=f"{label}: val/bpd")
        ax.plot(*zip(*train), alpha=0.25, color=line.get_color(), label=f"{label}: train/bpd")
    if args.target is not None:
        ax.axhline(args.target, color="grey", linestyle="--", linewidth=1, label=f"target {args.target}")
    ax.set_xlabel("training time (minutes, 2-core CPU)")
    ax.set_ylabel("bits/dim")
    ax.set_ylim(top=8.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
