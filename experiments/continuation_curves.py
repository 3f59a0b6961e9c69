"""Issue 49's figure: val bits/dim (256 val images every 200 steps) against training images seen,
for the runs of experiments/continuation_runs.sh: warmup–stable–decay against the cosine, and the
run cut in two through a packed continuation. Images seen = global step × batch (8): a continued
run's steps go on from its continuation's, so its points sit where its images are. The final
figures over all 5,000 val images are the sweeps' JSON (runs/continuation/*.json).

    .venv/bin/python -m experiments.continuation_curves runs/continuation docs/continuation_val_bpd.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BATCH = 8  # quick.yaml's
CURVES = [  # run folder, label, style
    ("cos_3000_s0", "cosine, 3,000 steps", "-"),
    ("wsd_3000_s0", "warmup–stable–decay, 3,000 steps", "-"),
    ("lease1_1500_s0", "first lease: 1,500 steps, decayed from 1,200", "--"),
    ("lease2_second_s0", "second lease from step 1,200 (packed: 2nd moment bf16)", "--"),
    ("lease2_fp32_s0", "second lease from step 1,200 (packed: moments fp32)", ":"),
    ("lease2_none_s0", "second lease from step 1,200 (packed: no moments, re-warm-up)", ":"),
    ("lease2_none_3000_s0", "second lease from step 1,200 to 3,000, the uncut decay (no moments)", "-."),
    ("wsd_1500_s1", "warmup–stable–decay, 1,500 steps, seed 1", "--"),
]


def val_curve(run: Path) -> list[tuple[int, float]]:
    points = {}
    for metrics in sorted(run.glob("csv/version_*/metrics.csv")):
        for row in csv.DictReader(metrics.open()):
            if row.get("val/bpd"):
                points[(int(row["step"]) + 1) * BATCH] = float(row["val/bpd"])
    return sorted(points.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, label, style in CURVES:
        points = val_curve(args.runs / name)
        if points:
            ax.plot(*zip(*points), style, marker=".", label=label)
    ax.set_xlabel("training images seen")
    ax.set_ylabel("val bits/dim (256 val images)")
    ax.set_ylim(3.8, 5.3)  # the peak-rate phase swings between validations; the ends are what count
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("quick's geometry, batch 8, one CPU thread a run")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
