"""What scripts/bench.py makes of its results: each training result compared with full
attention (``add_comparisons``), and the verdict on each target (``check_targets``).

Targets (PASS/FAIL lines at the end)
------------------------------------
local_vs_full: cifar10_categorical (12 layers, d=512, 3072 positions), 32x32, batch 1: a training
    step with 1D local attention at least 1.5x faster than with full causal attention,
    with no more peak memory (2 % tolerance for RSS noise).
speedup_grows: local attention's speed-up over full attention is larger at 64x64 than at 32x32
    (each preset and batch measured at both sizes; the categorical batch-1 line first).
cached_sampling: cached sampling with the quick preset at least 100x the images/s of uncached
    recomputation.
"""

from __future__ import annotations

import argparse

from scripts.bench_worker import preset_name

PAPER_CATEGORICAL = "cifar10_categorical"
QUICK = "quick"
MEMORY_TOLERANCE = 1.02  # local_vs_full: "no more peak memory", within RSS noise


def find(results, **key):
    for r in results:
        if "error" not in r and all(r.get(k) == v for k, v in key.items()):
            return r
    return None


def add_comparisons(results: list[dict], peak_tflops: float | None) -> None:
    """Add MFU and the speed-up and memory ratio against full attention to each training result."""
    for r in results:
        if r.get("kind") != "train" or "error" in r:
            continue
        r["mfu"] = (r["achieved_tflops"] / peak_tflops if peak_tflops and r.get("achieved_tflops") else None)
        full = None if r["attention"] == "full" else find(results, kind="train", preset=r["preset"], batch=r["batch"],
                                                          image_size=r["image_size"], attention="full")
        r["speedup_vs_full"] = full["median_s"] / r["median_s"] if full else None
        r["memory_ratio_vs_full"] = r["peak_mib"] / full["peak_mib"] if full and full["peak_mib"] > 0 else None


def rows_of(results: list[dict], kind: str) -> list[dict]:
    """The results of one kind of measurement ("train" or "sample"), errors included."""
    return [r for r in results if r.get("kind") == kind]


def verdict(name: str, ok: bool | None, text: str) -> dict:
    """Print a target's SKIP/PASS/FAIL line (``ok`` None/True/False) and return it as a JSON record."""
    word = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    print(f"{word} ({name}) {text}")
    return {"target": name, "verdict": word, "detail": text}


def check_targets(results: list[dict], args: argparse.Namespace) -> list[dict]:
    """Print the verdict on each target of the module docstring and return the verdicts."""
    print("\nTargets" + (" (SMOKE RUN: tiny model, verdicts meaningless)" if args.quick_smoke else ""))
    verdicts = [local_vs_full(results, args.presets)]
    verdicts += speedup_grows(results, args.image_sizes)
    verdicts.append(cached_sampling(results))
    return verdicts


def local_vs_full(results: list[dict], presets: list[str]) -> dict:
    """cifar10_categorical 32x32 batch 1, local_1d at least 1.5x faster than full, no more peak memory."""
    local_a = find(results, kind="train", image_size=32, batch=1, attention="local_1d",
                   preset=next((p for p in presets if preset_name(p) == PAPER_CATEGORICAL), None))
    if local_a and local_a.get("speedup_vs_full") and local_a.get("memory_ratio_vs_full") is not None:
        ok = local_a["speedup_vs_full"] >= 1.5 and local_a["memory_ratio_vs_full"] <= MEMORY_TOLERANCE
        return verdict("local_vs_full", ok,
                       f"cifar10_categorical 32x32 batch 1: local_1d step {local_a['speedup_vs_full']:.2f}x "
                       f"faster than full (target >= 1.5x), peak memory {local_a['memory_ratio_vs_full']:.2f}x "
                       f"full's (target <= 1, {100 * (MEMORY_TOLERANCE - 1):.0f} % tolerance)")
    return verdict("local_vs_full", None,
                   "not measured: needs --presets cifar10_categorical --image-sizes 32 --batch 1 (and full)")


def speedup_grows(results: list[dict], sizes: list[int]) -> list[dict]:
    """Local attention's speed-up over full grows from the smallest to the largest image size."""
    pairs = []  # (smallest size, largest size) of every preset and batch; 32 -> 64 by default
    small_size, big_size = min(sizes), max(sizes)
    for r in rows_of(results, "train"):
        if "error" in r or r["attention"] == "full" or r["image_size"] != small_size or small_size == big_size:
            continue
        big = find(results, kind="train", preset=r["preset"], batch=r["batch"], attention=r["attention"],
                   image_size=big_size)
        if big and r.get("speedup_vs_full") and big.get("speedup_vs_full"):
            pairs.append((preset_name(r["preset"]) != PAPER_CATEGORICAL or r["batch"] != 1, r, big))
    if not pairs:
        return [verdict("speedup_grows", None,
                        "not measured: needs --image-sizes 32 64 with the full-attention comparison")]
    return [verdict("speedup_grows", big["speedup_vs_full"] > small["speedup_vs_full"],
                    f"{preset_name(small['preset'])} batch {small['batch']}: local vs full speed-up "
                    f"{small['speedup_vs_full']:.2f}x at {small_size}x{small_size} -> {big['speedup_vs_full']:.2f}x "
                    f"at {big_size}x{big_size} (target: it grows)")
            for _, small, big in sorted(pairs, key=lambda p: p[0])]


def cached_sampling(results: list[dict]) -> dict:
    """Cached sampling with the quick preset at least 100x the images/s of uncached recomputation."""
    quick = next((r for r in rows_of(results, "sample") if preset_name(r["preset"]) == QUICK
                  and "cached_speedup" in r), None)
    if quick:
        return verdict("cached_sampling", quick["cached_speedup"] >= 100,
                       f"quick, batch {quick['sample_batch']}: cached {quick['cached_images_per_sec']:.3g} images/s vs "
                       f"uncached {quick['uncached_images_per_sec']:.3g} images/s (extrapolated from "
                       f"{quick['uncached_steps_timed']} steps) = {quick['cached_speedup']:.0f}x (target >= 100x)")
    return verdict("cached_sampling", None, "not measured: needs the quick preset with sampling")
