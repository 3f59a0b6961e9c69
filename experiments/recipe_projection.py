"""What to expect from configs/cifar10_recipe.yaml in GPU-hours (README, "Reproduce the paper"; issue 110):
the GPU lineage's measured points and a projection to 2.95 and 2.90 bits/dim, with a plot.

    .venv/bin/python -m experiments.recipe_projection [--plot docs/recipe_val_gpu_hours.png] [--json OUT]

Measured: each lease of ``lineage/cifar10_gpu`` (the recipe's model at 14 layers, before any growth) at the
GPU minutes on its weights' path (every earlier lease's minutes up to the continuation the next went on from,
then its own), its decayed val over the 5,000 val images, and its GPU.

Projected, not measured (the road study's method, ``experiments/road_table.projection``, in hours instead of
leases): val falls by a fixed amount per doubling of the compute on the path. The amount is the lineage's own
slope over its leases, bent by the CPU proxy's (docs/experiments.md entry 35): the grown-with-flips arm's slope
from 50 to 150 epochs of compute (the trunk decayed at 50, the arm's two seeds' mean at 150) against arm 1's
from 25 to 50. Compute is counted in images of the 14-layer model's FLOPs, which a grown model spends at the
same rate where it runs at the same MFU (estimated; the 28-layer model's speed on a GPU is not measured), and
turned into hours at the lineage's own pace: 2.72 M images in 23.1 GPU minutes on its path (compilation,
validations and checkpoints included; 1,967 images/s, where lease 5's steps alone ran 2,454 on an H200).
Past 150 epochs' compute (6.75 M images, about 57 minutes at that pace) the proxy measured nothing: the line
there is the same slope carried on.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from experiments.json_result import emit
from experiments.road_table import decayed_curve, per_doubling
from experiments.road_runs import PLAN
from experiments.road_table import curves

REPO = Path(__file__).resolve().parents[1]
LINEAGE = REPO / "lineage" / "cifar10_gpu" / "lineage.json"
IMAGES_PER_UPDATE = 120  # the recipe's batch on one GPU
STUDY_END_IMAGES = 150 * 45_000  # the proxy's horizon: 150 epochs of the 45,000 training images' compute
GROWN_ARM = ("deepreg_s0", "deepreg_s1")  # entry 35's grown-with-flips arm, the recipe's
TARGETS = (2.95, 2.90)
REFERENCES = {"the paper, categorical": 2.90, "the paper, DMOL": 2.92, "PixelCNN++": 2.92}


def measured() -> list[dict]:
    """Each lease: GPU minutes on its weights' path, images on the path, decayed val, the GPU."""
    leases = json.loads(LINEAGE.read_text())
    points, path_minutes = [], 0.0
    for lease in leases:
        points.append({"lease": lease["lease"], "gpu": lease["device"].removeprefix("NVIDIA "),
                       "gpu_minutes": round(path_minutes + lease["training_minutes"], 2),
                       "images": lease["last_step"] * IMAGES_PER_UPDATE, "val_bpd": round(lease["val_bpd"], 4)})
        path_minutes += lease["minutes_to_continuation"]  # the next lease goes on from its continuation
    return points


def proxy_slopes() -> tuple[float, float]:
    """Arm 1's slope from 25 to 50 epochs and the grown-with-flips arm's from 50 to 150, per doubling."""
    figures = {run.name: f for run in PLAN if (f := curves(run)) is not None}
    early = per_doubling([p for p in decayed_curve(figures) if p[0] <= 50])
    grown = sum(figures[name]["val_bpd"] for name in GROWN_ARM) / len(GROWN_ARM)
    late = (grown - figures["trunk"]["val_bpd"]) / math.log2(150 / 50)
    return early, late


def projection() -> dict:
    points = measured()
    slope_lineage = per_doubling([(p["images"], p["val_bpd"]) for p in points])
    early, late = proxy_slopes()
    slope = slope_lineage * late / early
    last = points[-1]
    # images of compute in GPU-hours at the path's own pace (every minute of its leases' training included)
    hours = lambda images: last["gpu_minutes"] / 60 * images / last["images"]  # noqa: E731
    to_target = {}
    for target in TARGETS:
        images = last["images"] * 2 ** ((target - last["val_bpd"]) / slope)
        to_target[str(target)] = {"gpu_hours": round(hours(images), 2), "images": round(images),
                                  "past_the_study": images > STUDY_END_IMAGES}
    return {"measured": points, "lineage_slope_per_doubling": round(slope_lineage, 4),
            "proxy_slope_25_50": round(early, 4), "proxy_grown_slope_50_150": round(late, 4),
            "projected_slope_per_doubling": round(slope, 4),
            "path_images_per_gpu_s": round(last["images"] / (last["gpu_minutes"] * 60)),
            "study_end_gpu_hours": round(hours(STUDY_END_IMAGES), 2), "to_target": to_target}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points, slope = result["measured"], result["projected_slope_per_doubling"]
    last = points[-1]
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for gpu in sorted({p["gpu"] for p in points}):
        mine = [p for p in points if p["gpu"] == gpu]
        axes.plot([p["gpu_minutes"] / 60 for p in mine], [p["val_bpd"] for p in mine], "o", label=f"measured ({gpu})")
    start_hours = last["gpu_minutes"] / 60
    end_hours = max(v["gpu_hours"] for v in result["to_target"].values()) * 1.3
    hours = [start_hours * (end_hours / start_hours) ** (i / 60) for i in range(61)]
    axes.plot(hours, [last["val_bpd"] + slope * math.log2(h / start_hours) for h in hours], "--", color="grey",
              label=f"projected ({slope:+.3f} a doubling of compute)")
    axes.axvline(result["study_end_gpu_hours"], color="grey", linewidth=0.6, linestyle=":")
    axes.text(result["study_end_gpu_hours"], 3.15, " the CPU study's end", fontsize=8, color="grey")
    for (name, value), style in zip(REFERENCES.items(), ("-", "-.", ":")):
        axes.axhline(value, color="black", linewidth=0.7, linestyle=style, label=f"{name}: {value}")
    axes.set_xscale("log")
    axes.set_xlabel("GPU-hours on the weights' path (H200 and H100; projected at the path's pace)")
    axes.set_ylabel("val bits/dim (5,000 images)")
    axes.set_title("configs/cifar10_recipe.yaml: measured and projected")
    axes.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    options = parser.parse_args(argv)
    result = projection()
    print("| lease | GPU | GPU minutes on the path | images | val bits/dim |\n|---|---|---|---|---|")
    for p in result["measured"]:
        print(f"| {p['lease']} | {p['gpu']} | {p['gpu_minutes']} | {p['images']:,} | {p['val_bpd']:.3f} |")
    for target, figures in result["to_target"].items():
        print(f"projected to {target}: {figures['gpu_hours']} GPU-hours ({figures['images']:,} images of compute)")
    if options.plot:
        plot(result, options.plot)
    emit(result, options.json)


if __name__ == "__main__":
    main()
