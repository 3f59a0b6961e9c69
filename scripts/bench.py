"""One benchmark for imagetx: training throughput, memory, FLOP utilisation and sampling speed.

Run (from the repository root, as a module):

    .venv/bin/python -m scripts.bench                      # the default plan for this machine
    .venv/bin/python -m scripts.bench --presets quick cifar10_categorical cifar10_dmol cifar10_2d \\
        --image-sizes 32 64 --batch 1 preset --precision bf16 --json bench.json
    .venv/bin/python -m scripts.bench --quick-smoke        # seconds: proves the script runs, numbers meaningless

Default plan: on CPU the ``quick`` preset and the paper categorical preset
(``cifar10_categorical``) at batch 1, fp32, image sizes 32 and 64: minutes on a small
CPU, most of them the paper-size 64x64 full-attention steps, which also need several GB
of RAM (docs/results.md has the measured step times).
On CUDA all four presets (quick, cifar10_categorical, cifar10_dmol, cifar10_2d), at batch
1 and at the preset's own ``data.batch_size``. ``--presets`` takes preset names (files in
configs/) or YAML paths.

What one configuration measures (a training step; sampling), and how memory and FLOPs are
counted: scripts/bench_worker.py, where each configuration runs in a worker process of its own.
The targets and their PASS/FAIL lines at the end: scripts/bench_targets.py.

Precision: ``--precision fp32|bf16`` (bf16 = torch.autocast around the forward pass and
the loss, float32 weights and Adam state, as Lightning's bf16-mixed). On CPUs without
AVX512-BF16/AMX bf16 matmuls are emulated and slower than fp32 (docs/results.md): the
script reports what it measures.

Options: ``--presets``, ``--image-sizes``, ``--batch`` (ints and/or ``preset``),
``--precision``, ``--device cpu|cuda``, ``--warmup``, ``--steps``, ``--max-cell-seconds``,
``--sample-batch``, ``--sample-steps``, ``--uncached-steps``, ``--no-sampling``,
``--no-full``, ``--peak-tflops``, ``--threads``, ``--json`` (default bench.json),
``--quick-smoke`` (1 layer, d=32, image sizes 16 and 32, one warm-up and one timed step,
sampling batch 1: for checking the script, not the model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from scripts.bench_targets import QUICK, add_comparisons, check_targets, rows_of
from scripts.bench_worker import PRESETS, preset_name, preset_path, read_preset, sample_worker, train_worker
from scripts.common import RESULT_MARKER, fmt, machine_info, run_subprocess

REPO_ROOT = Path(__file__).resolve().parent.parent

CPU_DEFAULT_PRESETS = ("quick", "cifar10_categorical")


def spawn(spec: dict) -> dict:
    # A module run from the repository root, as the user runs this script: ``scripts`` imports there.
    cmd = [sys.executable, "-m", "scripts.bench", "--worker", json.dumps(spec)]
    return run_subprocess(cmd, spec, cwd=REPO_ROOT)



# ----------------------------------------------------------------------------- driver

def detect_peak_tflops(args) -> tuple[float | None, str]:
    if args.peak_tflops:
        return args.peak_tflops, "--peak-tflops"
    if args.device != "cuda":
        return None, "none (CPU; give --peak-tflops for an MFU figure)"
    import torch

    from lightning.fabric.utilities.throughput import get_available_flops

    from imagetx.training.throughput import table_peak

    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak = get_available_flops(device, torch.bfloat16) or table_peak(device, torch.bfloat16)
    if peak:
        return peak / 1e12, f"{name}: dense bf16 peak"
    return None, f"{name}: unknown peak; give --peak-tflops"


def batches_for(preset: str, wanted: list[str]) -> list[int]:
    out = []
    for item in wanted:
        value = int(read_preset(preset)["data"]["batch_size"]) if item == "preset" else int(item)
        if value not in out:
            out.append(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line: every option of the module docstring, plus the hidden --worker."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=None,
                        help=f"names in configs/ or YAML paths (CPU default: {' '.join(CPU_DEFAULT_PRESETS)}; "
                             f"CUDA: {' '.join(PRESETS)})")
    parser.add_argument("--image-sizes", type=int, nargs="+", default=None, help="default 32 64")
    parser.add_argument("--batch", nargs="+", default=None,
                        help="batch sizes: integers and/or 'preset' (the preset's data.batch_size); "
                             "default 1 on CPU, 1 and preset on CUDA")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 1 CPU, 3 CUDA)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps, median reported (default 3 CPU, 10 CUDA)")
    parser.add_argument("--max-cell-seconds", type=float, default=None,
                        help="fewer timed steps (>= 1) where they would take longer than this, judged by the last "
                             "warm-up step (default 40 CPU, 60 CUDA); 0 = never")
    parser.add_argument("--sample-batch", type=int, default=None,
                        help="images sampled at once (default 8 CPU, 64 CUDA)")
    parser.add_argument("--sample-steps", type=int, default=64,
                        help="paper presets: cached steps timed and extrapolated; 0 = sample every step")
    parser.add_argument("--uncached-steps", type=int, default=8, help="quick: uncached steps timed and extrapolated")
    parser.add_argument("--no-sampling", action="store_true", help="skip the sampling measurements")
    parser.add_argument("--no-full", action="store_true", help="skip the full-attention comparison")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak for MFU (default on CUDA: the device's dense bf16 peak, e.g. H100/H200 989)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", default="bench.json", help="where to write every figure")
    parser.add_argument("--quick-smoke", action="store_true",
                        help="tiny model (1 layer, d=32), sizes 16 32, 1 step: checks the script, not the model")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def worker_main(spec_json: str) -> int:
    """Measure the one configuration the driver passed with --worker; print its result for the driver."""
    spec = json.loads(spec_json)
    result = train_worker(spec) if spec["kind"] == "train" else sample_worker(spec)
    print(RESULT_MARKER + json.dumps(result), flush=True)
    return 0


def resolve_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill in, on ``args``, the defaults that depend on the device and --quick-smoke; reject bad values."""
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but torch.cuda.is_available() is False")
    cuda = args.device == "cuda"
    args.presets = args.presets or list(PRESETS if cuda else CPU_DEFAULT_PRESETS)
    for name in args.presets:
        preset_path(name)
    smoke = args.quick_smoke
    args.image_sizes = args.image_sizes or ([16, 32] if smoke else [32, 64])
    args.batch = args.batch or (["1"] if not cuda or smoke else ["1", "preset"])
    for item in args.batch:
        if item != "preset" and (not item.isdigit() or int(item) < 1):
            parser.error(f"--batch {item!r}: give positive integers or 'preset'")
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke or not cuda else 3)
    args.steps = args.steps if args.steps is not None else (1 if smoke else (10 if cuda else 3))
    args.sample_batch = args.sample_batch or (1 if smoke else (64 if cuda else 8))
    args.sample_steps = 4 if smoke and args.sample_steps == 64 else args.sample_steps
    args.uncached_steps = 1 if smoke and args.uncached_steps == 8 else args.uncached_steps
    if args.max_cell_seconds is None:
        args.max_cell_seconds = 40.0 if not cuda else 60.0
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")


def print_run_header(args: argparse.Namespace, info: dict, load: tuple[float, float, float] | None) -> None:
    """Print what runs on what, and the warnings that qualify the figures (smoke run, emulated bf16, busy CPU)."""
    cuda = args.device == "cuda"
    print(f"imagetx benchmark on {args.device} ({info.get('cuda_device') or info.get('cpu_model', '?')}), "
          f"torch {info['torch_version']}, precision {args.precision}")
    if args.quick_smoke:
        print("SMOKE RUN (--quick-smoke): tiny model, one step: the figures say nothing about the real models")
    if not cuda and args.precision == "bf16" and not info.get("cpu_bf16_support"):
        print("note: this CPU has no AVX512-BF16/AMX: bf16 matmuls are emulated, slower than fp32")
    print(f"presets {' '.join(map(preset_name, args.presets))}; image sizes {args.image_sizes}; "
          f"batch {' '.join(args.batch)}; "
          f"{args.warmup} warm-up + {args.steps} timed steps (median; fewer where > {args.max_cell_seconds:g} s); "
          f"each configuration in a fresh process")
    if load and not cuda and load[0] > 0.5 * (os.cpu_count() or 1):
        print(f"note: load average {load[0]:.2f} on {os.cpu_count()} CPUs: other work is running, timings are noisy")


def build_plan(args: argparse.Namespace) -> list[dict]:
    """The worker specs, in run order: per preset, every size x batch x attention, then its sampling."""
    from imagetx.training.presets import preset_model_config

    sizes = args.image_sizes
    common = dict(device=args.device, precision=args.precision, threads=args.threads, smoke=args.quick_smoke)
    plan = []
    for preset in args.presets:
        base_attention = preset_model_config(preset_path(preset)).attention.kind
        attentions = [base_attention] + ([] if args.no_full or base_attention == "full" else ["full"])
        for size in sizes:
            for batch in batches_for(preset, args.batch):
                for attention in attentions:
                    plan.append(dict(kind="train", preset=preset, image_size=size, attention=attention, batch=batch,
                                     warmup=args.warmup, steps=args.steps, max_cell_seconds=args.max_cell_seconds,
                                     **common))
        if not args.no_sampling:
            is_quick = preset_name(preset) == QUICK
            plan.append(dict(kind="sample", preset=preset, image_size=32 if 32 in sizes else sizes[0],
                             attention=base_attention, sample_batch=args.sample_batch,
                             sample_steps=0 if is_quick else args.sample_steps,
                             uncached_steps=args.uncached_steps if is_quick else 0, **common))
    return plan


def run_plan(plan: list[dict]) -> list[dict]:
    """Run every spec in its own worker process, printing a progress line as each one ends."""
    results = []
    for i, spec in enumerate(plan, 1):
        r = spawn(spec)
        results.append(r)
        print(progress_line(i, len(plan), spec, r), flush=True)
    return results


def progress_line(i: int, total: int, spec: dict, r: dict) -> str:
    """The line that says which configuration ``r`` is and what it measured (or its error)."""
    name = preset_name(r["preset"])
    if "error" in r:
        status = f"ERROR {r['error']}"
    elif r["kind"] == "train":
        status = f"{r['median_s'] * 1000:.0f} ms/step, {r['images_per_sec']:.3g} images/s, {r['peak_mib']:.0f} MiB"
    else:
        status = f"cached {r['cached_images_per_sec']:.3g} images/s" + (
            f", uncached {r['uncached_images_per_sec']:.3g} images/s" if "uncached_images_per_sec" in r else "")
    what = (f"train {r['attention']:8s} {r['image_size']}x{r['image_size']} batch {r['batch']}"
            if spec["kind"] == "train" else f"sample batch {spec['sample_batch']}")
    return f"  [{i}/{total}] {name:20s} {what}: {status} ({r['worker_wall_s']:.0f} s)"


def print_training_table(train_rows: list[dict], args: argparse.Namespace, peak_tflops: float | None,
                         peak_source: str) -> None:
    """Print the training-step table and the notes on its columns."""
    cuda = args.device == "cuda"
    header = (f"{'preset':20s} {'size':>5s} {'attention':9s} {'batch':>5s} {'positions':>9s} {'ms/step':>9s} "
              f"{'images/s':>9s} {'tokens/s':>9s} {'peak MiB':>9s} {'TFLOP/s':>8s} {'MFU':>6s} "
              f"{'vs full':>8s} {'mem/full':>8s}")
    print(f"\nTraining step (forward + backward + Adam), {args.precision}, {args.device}")
    print(header)
    print("-" * len(header))
    for r in train_rows:
        if "error" in r:
            print(f"{preset_name(r['preset']):20s} {r['image_size']:5d} {r['attention']:9s} {r['batch']:5d} "
                  f"ERROR {r['error']}")
            continue
        star = "*" if r.get("peak_is_lower_bound") else ""
        print(f"{preset_name(r['preset']):20s} {r['image_size']:5d} {r['attention']:9s} {r['batch']:5d} "
              f"{r['positions']:9d} {r['median_s'] * 1000:9.1f} {r['images_per_sec']:9.3g} "
              f"{r['tokens_per_sec']:9.3g} {r['peak_mib']:8.0f}{star or ' '} {fmt(r['achieved_tflops'], '8.3f')} "
              f"{fmt(None if r['mfu'] is None else 100 * r['mfu'], '5.1f')}{' ' if r['mfu'] is None else '%'} "
              f"{fmt(r['speedup_vs_full'], '7.2f')}{' ' if r['speedup_vs_full'] is None else 'x'} "
              f"{fmt(r['memory_ratio_vs_full'], '8.2f')}")
    print(f"  TFLOP/s: analytic FLOPs per image (scripts/bench_worker.py) x images/s; MFU against {peak_source}"
          + (f" = {peak_tflops:g} TFLOP/s" if peak_tflops else ""))
    print("  vs full = full-attention ms / this ms (same model, size, batch); mem/full = peak MiB / full's peak MiB")
    print(f"  peak MiB: {'torch.cuda.max_memory_allocated' if cuda else 'peak RSS growth over the steps'}"
          + ("" if cuda else "; * = lower bound"))


def print_sampling_table(sample_rows: list[dict], precision: str) -> None:
    """Print the sampling table (nothing when sampling was not measured)."""
    if not sample_rows:
        return
    print(f"\nSampling (model in eval mode, {precision})")
    header = f"{'preset':20s} {'batch':>5s} {'steps':>6s} {'cached s':>9s} {'images/s':>9s} " \
             f"{'uncached s':>11s} {'images/s':>9s} {'speed-up':>9s}  how"
    print(header)
    print("-" * len(header))
    for r in sample_rows:
        if "error" in r:
            print(f"{preset_name(r['preset']):20s} {r['sample_batch']:5d} ERROR {r['error']}")
            continue
        how = r["cached_how"] + ("; " + r["uncached_how"] if "uncached_how" in r else "")
        print(f"{preset_name(r['preset']):20s} {r['sample_batch']:5d} {r['positions']:6d} "
              f"{r['cached_seconds']:9.2f} {r['cached_images_per_sec']:9.3g} "
              f"{fmt(r.get('uncached_seconds'), '11.1f')} {fmt(r.get('uncached_images_per_sec'), '9.3g')} "
              f"{fmt(r.get('cached_speedup'), '8.0f')}{'x' if r.get('cached_speedup') else ' '}  {how}")


def settings_record(args: argparse.Namespace, peak_tflops: float | None, peak_source: str) -> dict:
    """The resolved settings of this run, for the JSON report."""
    return {"presets": args.presets, "image_sizes": args.image_sizes, "batches": args.batch,
            "precision": args.precision, "device": args.device, "warmup": args.warmup, "steps": args.steps,
            "max_cell_seconds": args.max_cell_seconds, "sample_batch": args.sample_batch,
            "sample_steps": args.sample_steps, "uncached_steps": args.uncached_steps, "smoke": args.quick_smoke,
            "peak_tflops": peak_tflops, "peak_source": peak_source,
            "flops_formula": "imagetx.model.flops.count_flops(model, device).training per image (fwd+bwd)"}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (module docstring): the plan's workers, the tables, the targets, the JSON report."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    resolve_defaults(parser, args)
    peak_tflops, peak_source = detect_peak_tflops(args)
    info = machine_info(args.device, args.threads)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print_run_header(args, info, load)

    started = time.perf_counter()
    results = run_plan(build_plan(args))
    add_comparisons(results, peak_tflops)
    print_training_table(rows_of(results, "train"), args, peak_tflops, peak_source)
    print_sampling_table(rows_of(results, "sample"), args.precision)
    verdicts = check_targets(results, args)
    total = time.perf_counter() - started

    report = {
        "command": sys.argv,
        "settings": settings_record(args, peak_tflops, peak_source),
        "machine": {**info, "loadavg_start": load,
                    "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "results": results,
        "targets": verdicts,
        "total_runtime_s": total,
    }
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nTotal {total:.0f} s; every figure in {args.json}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
