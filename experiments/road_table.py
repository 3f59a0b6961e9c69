"""The road study's table, plot and projection (experiments/road_runs.py; docs/experiments.md entry 35):

    .venv/bin/python -m experiments.road_table [--plot docs/road_val_epochs.png] [--json OUT]

Every run of the plan that has figures: a finished run's from ``road_results/NAME.json``, an unfinished
one's curve from what its job kept (``NAME.steps.csv.gz``) and this session's metrics, marked as going.
Prints, in markdown: the arms at equal added FLOPs (each ends at the FLOPs the base shape spends from the
branch point to 150 epochs), each arm's val every 10 epochs with the training loss of those 10 epochs,
arm 1's decayed val at 25 to 150 epochs (the curve a lease's end follows), the 2D row, and the
projection of the GPU lineage's leases. The last line is one JSON object.

Per GPU-minute: equal FLOPs are equal GPU minutes where a shape runs at the base shape's MFU, which is
what the grown shapes' images/s are estimated from (``imagetx.model.flops`` at the GPU size with
FlexAttention's 128 x 128 tiles, against lease 4's measured 2,344 images/s): estimated, not measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

from experiments.json_result import emit
from experiments.road_runs import (BRANCH, BY_NAME, EPOCH, PLAN, REPO, RESULTS, Run, flops_per_image,
                                   merged_steps, result, run_steps, window_means)

GPU_IMAGES_PER_S = 2344  # lease 4's median on an H200 (lineage.json, entry 31): the base shape, measured
GPU_SHAPE = dict(d_model=256, d_filter=512, kernel="flex")  # the lineage's model at 14 layers, 8 heads of 32
GPU_LAYERS, GPU_HEADS = 14, 8
LEASE_MINUTES = 7.9  # lease 4's training minutes: what a lease trains (entry 31)
DECAY_SHARE = 0.2  # of a lease's steps: its decay, left behind by the next lease (warmup-stable-decay)
ENTRY_33_RECIPE = (3.939, 3.948)  # entry 33's recipe row, seeds 0 and 1: what the 2D row is set beside
TARGETS = (2.95, 2.90)
LINEAGE = REPO / "lineage" / "cifar10_gpu" / "lineage.json"


@functools.cache
def gpu_images_per_s(layers: int, heads: int) -> float:
    """A shape's GPU images/s: measured for the base shape, estimated for the others at its MFU."""
    base = flops_per_image(GPU_LAYERS, GPU_HEADS, **GPU_SHAPE)
    scale = GPU_LAYERS / 2  # the proxy's 2 layers are the GPU model's 14: growth multiplies both alike
    return GPU_IMAGES_PER_S * base / flops_per_image(round(layers * scale), heads * GPU_HEADS // 4, **GPU_SHAPE)


def curves(run: Run) -> dict | None:
    """A run's figures: its result where it has finished, else its curve so far (``going``)."""
    done = result(run.name)
    if done:
        return {**done, "going": False}
    kept = merged_steps(run)
    if not kept["val"] and not kept["train"]:
        return None
    steps = run_steps(run)
    first = BRANCH if run.kind == "arm" else 0
    return {"name": run.name, "what": run.what, "seed": run.seed, "kind": run.kind, "going": True,
            "first_step": first, "steps": steps, "val_curve": [(s + 1, (s + 1) / EPOCH, v) for s, v in
                                                               sorted(kept["val"].items()) if s + 1 > first],
            "train_windows": [(e, e / EPOCH, m) for e, m in window_means(kept["train"], steps) if e > first],
            "val_bpd": None, "train_bpd_decayed": None, "gap": None, "layers": run.layers, "heads": run.heads}


def compute_axis(figures: dict, base: int) -> list[tuple[float, float]]:
    """(base-shape epochs of FLOPs since step 0, val) of a run: an arm's FLOPs from the branch at its
    own shape's cost."""
    per_image = flops_per_image(figures["layers"], figures["heads"])
    first = figures["first_step"]
    return [(first / EPOCH + (updates - first) * per_image / (base * EPOCH), value)
            for updates, _, value in figures["val_curve"]]


def number(value, form: str = ".3f") -> str:
    return "–" if value is None else format(value, form)


def arms_table(figures: dict[str, dict]) -> list[str]:
    base = figures.get("cont_s0") or {}
    base_s1 = figures.get("cont_s1") or {}
    lines = ["| run | what | ends at epoch (data) | added FLOPs, base epochs | val, decayed (all 5,000) | − arm 1, "
             "same seed | train, decayed | gap | GPU images/s (est.) |", "|---|---|---|---|---|---|---|---|---|"]
    for run in PLAN:
        f = figures.get(run.name)
        if run.kind not in ("arm", "trunk", "scratch") or f is None:
            continue
        reference = base_s1 if f["seed"] == 1 else base
        delta = None if f["val_bpd"] is None or reference.get("val_bpd") is None or run.kind != "arm" \
            else f["val_bpd"] - reference["val_bpd"]
        added = (run_steps(run) - f["first_step"]) * flops_per_image(run.layers, run.heads) / (
            flops_per_image() * EPOCH)
        state = " (going)" if f["going"] else ""
        lines.append(f"| {run.name}{state} | {f['what']} | {run_steps(run) / EPOCH:.0f} | {added:.0f} | "
                     f"{number(f['val_bpd'], '.4f')} | {number(delta, '+.4f')} | {number(f['train_bpd_decayed'])} | "
                     f"{number(f['gap'], '+.3f')} | {gpu_images_per_s(run.layers, run.heads):,.0f} |")
    return lines


def finished_arms(figures: dict[str, dict]) -> dict[str, float]:
    """Each finished arm's decayed val, of the arms ending at equal added FLOPs (not the earlier decays)."""
    return {name: f["val_bpd"] for name, f in figures.items() if f["kind"] == "arm" and f["val_bpd"] is not None
            and BY_NAME[name].end_epochs == 150}


def seed_means(figures: dict[str, dict]) -> dict[str, dict]:
    """Each arm's decayed val over its seeds (runs NAME_s0, NAME_s1, ... ending at equal added FLOPs): the
    mean, the seeds and their spread (largest − smallest), and the mean against arm 1's (``cont``): what
    the decision reads, an arm's lead counting only where it exceeds the seeds' spread."""
    groups: dict[str, list[float]] = {}
    for name, val in finished_arms(figures).items():
        arm, _, seed = name.rpartition("_s")
        if seed.isdigit():
            groups.setdefault(arm, []).append(val)
    means = {arm: {"seeds": len(v), "mean": sum(v) / len(v), "spread": max(v) - min(v)} for arm, v in groups.items()}
    for figures_of_arm in means.values():
        figures_of_arm["against_arm_1"] = figures_of_arm["mean"] - means["cont"]["mean"] if "cont" in means else None
    return means


def curve_table(figures: dict[str, dict]) -> list[str]:
    """Each run's val every 10 epochs (the learning rate at its peak until the decay) / the mean training
    loss of those 10 epochs."""
    epochs = sorted({round(e) for f in figures.values() if f["kind"] != "row" for _, e, _ in f["val_curve"]})
    lines = [f"| run | {' | '.join(str(e) for e in epochs)} |", f"|---{'|---' * len(epochs)}|"]
    for name, f in figures.items():
        if f["kind"] == "row":
            continue
        val = {round(e): v for _, e, v in f["val_curve"]}
        train = {round(e): m for _, e, m in f["train_windows"]}
        cells = [f"{number(val.get(e))} / {number(train.get(e))}" if e in val or e in train else "" for e in epochs]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def decayed_curve(figures: dict[str, dict]) -> list[tuple[float, float]]:
    """Arm 1's decayed val at each end: 25 and 50 epochs from step 0, 75, 100 and 150 from the branch."""
    names = ("trunk_e25", "trunk", "cont_e75_s0", "cont_e100_s0", "cont_s0")
    return [(run_steps(BY_NAME[n]) / EPOCH, figures[n]["val_bpd"]) for n in names
            if n in figures and figures[n]["val_bpd"] is not None]


def per_doubling(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of val against log2(images): bits/dim per doubling."""
    if len(points) < 2:
        return None
    xs, ys = [math.log2(x) for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def lineage_points() -> list[tuple[float, float]]:
    """The GPU lineage's decayed val against the images on its weights' path (120 an update)."""
    return [(lease["last_step"] * 120, lease["val_bpd"]) for lease in json.loads(LINEAGE.read_text())
            if lease.get("val_bpd") is not None]


def projection(figures: dict[str, dict], arm: str) -> dict | None:
    """The leases to each target of the lineage going on as ``arm`` does (projected, not measured): the
    lineage's own slope per doubling of path images (its leases so far), bent by the proxy's: arm 1's
    slope from 25 to 50 epochs against the arm's from 50 to 150 (the trunk's decayed 50 to the arm's
    decayed end), compute against compute. Each lease adds LEASE_MINUTES at lease 4's images/s (in FLOPs of
    the base shape) to the path, less the decay the next lease leaves behind."""
    early = per_doubling([p for p in decayed_curve(figures) if p[0] <= 50])
    trunk, chosen = figures.get("trunk"), figures.get(arm)
    if early is None or trunk is None or chosen is None or chosen["val_bpd"] is None or trunk["val_bpd"] is None:
        return None
    late = (chosen["val_bpd"] - trunk["val_bpd"]) / math.log2(150 / 50)
    points = lineage_points()
    lineage_slope = per_doubling(points)
    images, val = points[-1]
    # the next lease goes on from the newest continuation: the newest lease's decay is left behind
    continued = json.loads(LINEAGE.read_text())[-1]["continuation_step"] * 120
    slope = lineage_slope * late / early
    # in images of the base shape's FLOPs: a grown shape at the base shape's MFU (the estimate) spends as
    # many FLOPs a minute, and the proxy's slopes are per doubling of those FLOPs
    per_lease = LEASE_MINUTES * 60 * GPU_IMAGES_PER_S
    leases = {}
    for target in TARGETS:
        needed = None
        if slope < 0:
            for count in range(1, 200):
                # every lease but the last leaves its decay behind
                path = continued + (count - 1) * (1 - DECAY_SHARE) * per_lease + per_lease
                if val + slope * math.log2(path / images) <= target:
                    needed = count
                    break
        leases[str(target)] = needed
    return {"arm": arm, "lineage_slope_per_doubling": lineage_slope, "proxy_slope_25_50": early,
            "proxy_slope_50_150": late, "projected_slope": slope, "images_per_lease": per_lease, "leases": leases}


def plot(figures: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = flops_per_image()
    figure, (by_epoch, by_flops) = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
    trunk = {updates: value for updates, _, value in figures.get("trunk", {}).get("val_curve", [])}
    # a colour of its own for each of the plan's curves (20 of them; the default cycle has 10)
    palette = plt.get_cmap("tab20").colors
    colour = {run.name: palette[i % len(palette)] for i, run in enumerate(r for r in PLAN if r.kind != "row")}
    for name, f in figures.items():
        if f["kind"] == "row" or not f["val_curve"]:
            continue
        if f["kind"] == "arm" and BRANCH in trunk:  # an arm's line leaves the trunk's at the branch point
            f = {**f, "val_curve": [(BRANCH, BRANCH / EPOCH, trunk[BRANCH]), *f["val_curve"]]}
        style = "--" if f["going"] else "-"
        xs = [e for _, e, _ in f["val_curve"]]
        ys = [v for _, _, v in f["val_curve"]]
        label = f"{name}{' (going)' if f['going'] else ''}"
        line, = by_epoch.plot(xs, ys, style, marker=".", label=label, color=colour[name])
        compute = compute_axis(f, base)
        by_flops.plot([c for c, _ in compute], [v for _, v in compute], style, marker=".", color=line.get_color())
        if f["val_bpd"] is not None:  # the decayed end
            end = run_steps(BY_NAME[name])
            by_epoch.plot([end / EPOCH], [f["val_bpd"]], "*", markersize=11, color=line.get_color())
            flops_end = f["first_step"] / EPOCH + (end - f["first_step"]) * flops_per_image(
                f["layers"], f["heads"]) / (base * EPOCH)
            by_flops.plot([flops_end], [f["val_bpd"]], "*", markersize=11, color=line.get_color())
    by_epoch.set(xlabel="epochs of the 1,720 training images", ylabel="val bits/dim (all 5,000 val images)",
                 title="val every 10 epochs (peak rate); ★ decayed end")
    by_flops.set(xlabel="training FLOPs since step 0, in epochs of the base shape",
                 title="the same against compute (grown arms cost more a step)")
    for axes in (by_epoch, by_flops):
        axes.grid(alpha=0.3)
    by_epoch.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", type=Path, default=None, help="write the plot of val against epochs here")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    figures = {run.name: f for run in PLAN if (f := curves(run)) is not None}
    print("\n".join(arms_table(figures)), "\n")
    print("\n".join(curve_table(figures)), "\n")
    decayed = decayed_curve(figures)
    print("arm 1 decayed (epochs, val):", ", ".join(f"{e:.0f}: {v:.4f}" for e, v in decayed))
    rows = {name: f["val_bpd"] for name, f in figures.items() if f["kind"] == "row"}
    print("2D row:", rows, "beside entry 33's recipe", ENTRY_33_RECIPE)
    arms = finished_arms(figures)
    best = min(arms, key=arms.get) if arms else None
    means = seed_means(figures)
    for arm, m in sorted(means.items(), key=lambda item: item[1]["mean"]):
        print(f"{arm}: mean {m['mean']:.4f} over {m['seeds']} seed(s), spread {m['spread']:.4f}, against arm 1 "
              f"{number(m['against_arm_1'], '+.4f')}")
    projections = {name: projection(figures, name) for name in arms}
    for name, p in projections.items():
        if p:
            print(f"projection as {name}: {p['projected_slope']:+.3f} a doubling, leases to 2.95 / 2.90: "
                  f"{p['leases']['2.95']} / {p['leases']['2.9']}")
    if args.plot:
        plot(figures, args.plot)
    emit({"best_arm": best, "arms": arms, "seed_means": means, "decayed_curve": decayed, "rows": rows, "projections": projections,
          "going": [name for name, f in figures.items() if f["going"]]}, args.json)


if __name__ == "__main__":
    main()
