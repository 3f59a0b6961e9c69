"""Plot val/bpd (and train/bpd) of a run against training time or images seen, from its metrics.csv.

    .venv/bin/python -m scripts.plot_curve runs/quick/csv/version_0/metrics.csv docs/quick_val_bpd.png \
        [--label "quick"] [--extra OTHER.csv LABEL] [--x images] [--points LABEL IMAGES:BPD,...]

Time is Lightning's ThroughputMonitor's ``train/time``: the seconds spent training up to
the step, validations left out (imagetx/train.py); images seen are its ``train/samples``.
``--points`` draws figures that have no CSV (e.g. read from a log), against images seen.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


AXES = {"minutes": ("train/time", 1 / 60.0, "training time (minutes, 2-core CPU)"),
        "images": ("train/samples", 1.0, "training images seen")}  # column, scale, label


def read_curve(path: Path, x: str = "minutes") -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """-> (val points, train points), each (x, bpd): x in minutes of training or images seen."""
    column, scale, _ = AXES[x]
    rows = list(csv.DictReader(path.open()))
    x_at_step = {int(row["step"]): float(row[column]) * scale for row in rows if row.get(column)}
    if not x_at_step:
        raise SystemExit(f"{path} has no {column} values: plot a run trained by imagetx.train, "
                         "which logs them through Lightning's ThroughputMonitor")

    def at(step: int) -> float:
        known = [s for s in x_at_step if s <= step]
        return x_at_step[max(known)] if known else 0.0

    val = [(at(int(r["step"])), float(r["val/bpd"])) for r in rows if r.get("val/bpd")]
    train = [(at(int(r["step"])), float(r["train/bpd"])) for r in rows if r.get("train/bpd")]
    return val, train


def read_points(text: str) -> list[tuple[float, float]]:
    """"300000:4.661,600000:4.19" -> [(300000.0, 4.661), (600000.0, 4.19)]."""
    try:
        return [(float(x), float(y)) for x, y in (pair.split(":") for pair in text.split(","))]
    except ValueError:
        raise SystemExit(f"--points {text!r}: give IMAGES:BPD pairs joined by commas, e.g. 300000:4.661,600000:4.19")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--label", default="run")
    parser.add_argument("--extra", nargs=2, action="append", default=[], metavar=("CSV", "LABEL"),
                        help="another run to draw beside it")
    parser.add_argument("--target", type=float, default=None, help="draw a horizontal target line")
    parser.add_argument("--x", choices=sorted(AXES), default="minutes", help="the horizontal axis")
    parser.add_argument("--points", nargs=2, action="append", default=[], metavar=("LABEL", "IMAGES:BPD,..."),
                        help="val figures without a CSV, against images seen (with --x images)")
    args = parser.parse_args()
    if args.points and args.x != "images":
        parser.error("--points are against images seen: add --x images")

    fig, ax = plt.subplots(figsize=(6, 4))
    for path, label in [(args.metrics, args.label)] + [(Path(p), l) for p, l in args.extra]:
        val, train = read_curve(path, args.x)
        line, = ax.plot(*zip(*val), marker="o", markersize=3, label=f"{label}: val/bpd")
        ax.plot(*zip(*train), alpha=0.25, color=line.get_color(), label=f"{label}: train/bpd")
    for label, text in args.points:
        ax.plot(*zip(*read_points(text)), marker="s", markersize=4, linestyle="--", label=f"{label}: val/bpd")
    if args.target is not None:
        ax.axhline(args.target, color="grey", linestyle="--", linewidth=1, label=f"target {args.target}")
    if args.x == "images":
        ax.set_xscale("log")  # a CPU run's thousands of images beside a GPU run's hundreds of thousands
    ax.set_xlabel(AXES[args.x][2])
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
