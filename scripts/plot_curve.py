"""Plot val/bpd (and train/bpd) of a run against training time, from its metrics.csv.

    .venv/bin/python -m scripts.plot_curve runs/quick/csv/version_0/metrics.csv docs/quick_val_bpd.png \
        [--label "quick"] [--extra OTHER.csv LABEL]

Time is Lightning's ThroughputMonitor's ``train/time``: the seconds spent training up to
the step, validations left out (imagetx/train.py).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_curve(path: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """-> (val points, train points), each (minutes, bpd)."""
    rows = list(csv.DictReader(path.open()))
    minutes_at_step = {int(row["step"]): float(row["train/time"]) / 60.0 for row in rows if row.get("train/time")}
    if not minutes_at_step:
        raise SystemExit(f"{path} has no train/time values: plot a run trained by imagetx.train, "
                         "which logs them through Lightning's ThroughputMonitor")

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
    parser.add_argument("--label", default="run")
    parser.add_argument("--extra", nargs=2, action="append", default=[], metavar=("CSV", "LABEL"),
                        help="another run to draw beside it")
    parser.add_argument("--target", type=float, default=None, help="draw a horizontal target line")
    args = parser.parse_args()

    fig, ax = plt.subplots(figsize=(6, 4))
    for path, label in [(args.metrics, args.label)] + [(Path(p), l) for p, l in args.extra]:
        val, train = read_curve(path)
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
