"""Plot val/bpd (and train/bpd) of a run against training time or images seen, from its metrics.

    .venv/bin/python -m scripts.plot_curve runs/quick docs/quick_val_bpd.png \
        [--label "quick"] [--extra OTHER LABEL] [--x images] [--points LABEL IMAGES:BPD,...]

A run is its folder (``trainer.default_root_dir``), its ``csv/`` folder or one ``metrics.csv``.
A run folder holds a CSV version per start (``csv/version_N``: the first, then one per
``--resume``): they are read in order, as one curve. A resumed run starts at its checkpoint's
step, so the rows an earlier version logged from that step on (steps it took after the checkpoint,
before it stopped) give way to the later version's.

Time is Lightning's ThroughputMonitor's ``train/time``: the seconds spent training up to
the step, validations left out (imagetx/train.py); images seen are its ``train/samples``.
Both count from each version's start: a later version's go on from where the run stood at its
checkpoint. ``--points`` draws figures that have no CSV (e.g. read from a log), against images seen.
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
# The columns that count from a version's start (ThroughputMonitor's, per process).
CUMULATIVE = tuple(column for column, _, _ in AXES.values())


def metrics_files(path: Path) -> list[Path]:
    """The metrics.csv files of a run: ``path`` itself (a file), or every ``version_N/metrics.csv``
    of a run folder (its ``csv/``) or of its ``csv/`` folder, in the order of N."""
    if path.is_file():
        return [path]
    folder = path / "csv" if (path / "csv").is_dir() else path
    files = sorted(folder.glob("version_*/metrics.csv"), key=lambda file: int(file.parent.name.split("_")[1]))
    if not files:
        raise SystemExit(f"{path}: no metrics.csv, nor csv/version_N/metrics.csv: give a run folder "
                         "(trainer.default_root_dir) or a metrics.csv that imagetx.train wrote")
    return files


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a run's metrics, every version in order (``metrics_files``): a version's rows
    replace the earlier versions' from its first step on, and its ``CUMULATIVE`` columns go on from
    the last earlier row's values before that step."""
    rows: list[dict[str, str]] = []
    for file in metrics_files(path):
        with file.open() as handle:
            version = list(csv.DictReader(handle))
        if not version:
            continue
        # Its first row is the step it started from (the first learning rate it logged); not the
        # least step: CSVs written by earlier versions hold validation-throughput rows at steps 1, 2, ...
        start = int(version[0]["step"])
        rows = [row for row in rows if int(row["step"]) < start]
        for column in CUMULATIVE:
            offset = next((float(row[column]) for row in reversed(rows) if row.get(column)), 0.0)
            for row in version:
                if row.get(column):
                    row[column] = str(float(row[column]) + offset)
        rows += version
    return rows


def read_curve(path: Path, x: str = "minutes") -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """-> (val points, train points), each (x, bpd): x in minutes of training or images seen."""
    column, scale, _ = AXES[x]
    rows = read_rows(path)
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
    parser.add_argument("metrics", type=Path, help="a run folder, its csv/ folder or one metrics.csv")
    parser.add_argument("out", type=Path)
    parser.add_argument("--label", default="run")
    parser.add_argument("--extra", nargs=2, action="append", default=[], metavar=("RUN", "LABEL"),
                        help="another run (folder or metrics.csv) to draw beside it")
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
