"""Benchmark one attention layer: 1D local vs 2D local vs full causal, each through the
gathered-block SDPA path and through FlexAttention (docs/model.md §4).

What it measures
----------------
At the paper's CIFAR-10 size (categorical grid 32 rows x 96 columns = 3072 positions,
d_model = 512, 4 heads), ONE ``imagetx.model.attention.SelfAttention(d_model, n_heads, pattern,
kernel=...)`` layer applied to an input ``x`` of shape (batch, 3072, 512), either

* ``forward_backward``: with ``requires_grad=True``, followed by a backward pass of a
  random-projection loss (``y.backward(g)`` with a fixed random ``g`` of ``y``'s shape;
  equivalent to ``(y * g).sum().backward()``); or
* ``forward``: under ``torch.no_grad()``.

The default is forward_backward, except on the CPU with the flex kernel asked for: torch 2.15
has no FlexAttention backward on the CPU, so there every cell runs the forward only (the
same pass for every kernel, so that they compare). Kernels (``--kernels``):

* ``sdpa``: today's path: blocks gathered for ``scaled_dot_product_attention`` (full causal:
  one fused call with ``is_causal=True``);
* ``flex``: ``torch.compile``d FlexAttention under the pattern's block mask (imagetx/flex.py);
  the block mask and the compilation happen in the untimed warm-up runs.

Patterns:

* ``local_1d``: ``Local1D(GenerationOrder(32, 96), block_length=256, memory_blocks=1)``
* ``local_2d``: ``Local2D(GenerationOrder(32, 96, (16, 16)), flange=(16, 32))`` (the T2T
  default; 16 divides both 32 and 96, so it tiles the categorical grid)
* ``full``:     ``FullCausal(GenerationOrder(32, 96))`` (PyTorch's fused
  ``scaled_dot_product_attention`` with ``is_causal=True``)

for each kernel, batch size and dtype asked for. bfloat16 is run under
``torch.autocast(device, dtype=torch.bfloat16)`` with float32 module weights and a
float32 input (mixed precision, as the model is trained), not by casting the module.

Each (variant, kernel, batch, dtype) runs in a fresh subprocess (this script with the hidden
``--worker`` flag): ``--warmup`` untimed runs (at least one), then ``--repeats`` timed runs;
the median is reported. Peak memory, over the timed runs only (the warm-up's compilation
left out):

* CPU: peak resident-set growth in MiB = ``ru_maxrss`` (resource.getrusage) after the
  timed runs minus the current RSS right before them, the high-water mark reset there
  (``/proc/self/clear_refs``; where that is refused, the mark covers the warm-up too).
* CUDA: ``torch.cuda.max_memory_allocated`` minus ``torch.cuda.memory_allocated``
  before the timed runs; timings are bracketed by ``torch.cuda.synchronize()``.

The table gives the median ms of the pass, peak MiB, the speed-up against full causal
through SDPA (its ms / the cell's ms), flex against the same pattern through SDPA, and the
memory ratio against full causal through SDPA, in the same batch/dtype; and a PASS/FAIL line
per batch/dtype for the target "1D local at least 2x faster than full causal with no more
peak memory" (SDPA). All figures and machine info go to the JSON file.

Run (from the repository root, as a module; the default run takes minutes on a small CPU):

    .venv/bin/python -m scripts.bench_attention

Options: ``--batches 1 4 --dtypes float32 bfloat16 --repeats 5 --warmup 1
--max-cell-seconds 30 --json bench_attention.json --seq-rows 32 --seq-cols 96 --threads N --device cpu|cuda
--variants local_1d local_2d full --kernels sdpa flex --pass forward|forward_backward``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from scripts.common import (RESULT_MARKER, current_rss_bytes, fmt, machine_info, maxrss_bytes, reset_peak_rss,
                            run_subprocess, sync, timed)

REPO_ROOT = Path(__file__).resolve().parent.parent  # workers run from here, where ``scripts`` imports

VARIANTS = ("local_1d", "local_2d", "full")
KERNELS = ("sdpa", "flex")
PASSES = ("forward", "forward_backward")
D_MODEL, N_HEADS = 512, 4
BLOCK_LENGTH_1D, MEMORY_BLOCKS_1D = 256, 1
BLOCK_2D, FLANGE_2D = (16, 16), (16, 32)


def build_pattern(variant: str, rows: int, cols: int):
    from imagetx.model.order import GenerationOrder
    from imagetx.model.patterns import FullCausal, Local1D, Local2D

    if variant == "local_1d":
        return Local1D(GenerationOrder(rows, cols), block_length=BLOCK_LENGTH_1D, memory_blocks=MEMORY_BLOCKS_1D)
    if variant == "local_2d":
        return Local2D(GenerationOrder(rows, cols, BLOCK_2D), flange=FLANGE_2D)
    if variant == "full":
        return FullCausal(GenerationOrder(rows, cols))
    raise ValueError(f"unknown variant {variant!r}")


# ----------------------------------------------------------------------------- worker


def run_worker(args: argparse.Namespace) -> dict:
    """One (variant, kernel, batch, dtype) measurement in this (fresh) process."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = args.dtypes[0]
    batch = args.batches[0]
    variant = args.variants[0]
    kernel = args.kernels[0]
    backward = args.pass_ == "forward_backward"
    use_autocast = dtype == "bfloat16"

    torch.manual_seed(0)
    pattern = build_pattern(variant, args.seq_rows, args.seq_cols)
    length = args.seq_rows * args.seq_cols
    from imagetx.model.attention import SelfAttention

    module = SelfAttention(D_MODEL, N_HEADS, pattern, kernel=kernel).to(device)
    x = torch.randn(batch, length, D_MODEL, device=device, requires_grad=backward)
    out_dtype = torch.bfloat16 if use_autocast else torch.float32
    grad_out = torch.randn(batch, length, D_MODEL, device=device, dtype=out_dtype)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_autocast), \
                torch.set_grad_enabled(backward):
            y = module(x)
        if backward:
            y.backward(grad_out.to(y.dtype))  # random-projection loss: d/dy (y * g).sum() = g
            x.grad = None
            for p in module.parameters():
                p.grad = None

    # Warm-up: the first run builds the pattern's blocks or block mask and, for flex,
    # compiles the kernel; the memory figures start after it.
    t0 = time.perf_counter()
    step()
    sync(device)
    first_run_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    sync(device)
    peak_reset = reset_peak_rss()
    rss_before = current_rss_bytes()
    maxrss_before = maxrss_bytes()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        cuda_alloc_before = torch.cuda.memory_allocated(device)

    # Timed runs: --repeats of them, but no more than --max-cell-seconds' worth once 3 are done.
    times_ms: list[float] = []
    while len(times_ms) < args.repeats:
        times_ms.append(timed(step, device) * 1000.0)
        if args.max_cell_seconds and len(times_ms) >= 3 and sum(times_ms) / 1000.0 > args.max_cell_seconds:
            break

    result = {
        "variant": variant,
        "kernel": kernel,
        "pass": args.pass_,
        "pattern": pattern.describe(),
        "batch": batch,
        "dtype": dtype,
        "precision_mode": "autocast(bfloat16), float32 weights and input" if use_autocast else "float32",
        "repeats": len(times_ms),
        "first_run_s": first_run_s,
        "times_ms": times_ms,
        "median_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "threads": torch.get_num_threads(),
    }
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) - cuda_alloc_before
        result.update(peak_mib=peak / 2**20, memory_metric="cuda max_memory_allocated growth")
    else:
        maxrss_after = maxrss_bytes()
        result.update(
            peak_mib=max(0, maxrss_after - rss_before) / 2**20,
            memory_metric="peak RSS growth over the timed runs (ru_maxrss after - RSS before)",
            peak_reset_before_timed_runs=peak_reset,
            rss_before_mib=rss_before / 2**20,
            maxrss_before_mib=maxrss_before / 2**20,
            maxrss_after_mib=maxrss_after / 2**20,
            # If the high-water mark never moved, the layer's peak hid under an earlier one
            # (e.g. import time) and the growth figure is only a lower bound.
            peak_is_lower_bound=maxrss_after <= maxrss_before,
        )
    return result


# ----------------------------------------------------------------------------- driver


def spawn_worker(args: argparse.Namespace, variant: str, kernel: str, batch: int, dtype: str) -> dict:
    cmd = [
        sys.executable, "-m", "scripts.bench_attention", "--worker",
        "--variants", variant, "--kernels", kernel, "--pass", args.pass_, "--batches", str(batch), "--dtypes", dtype,
        "--repeats", str(args.repeats), "--warmup", str(args.warmup),
        "--max-cell-seconds", str(args.max_cell_seconds),
        "--seq-rows", str(args.seq_rows), "--seq-cols", str(args.seq_cols),
        "--device", args.device,
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return run_subprocess(cmd, {"variant": variant, "kernel": kernel, "batch": batch, "dtype": dtype}, cwd=REPO_ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--pass", dest="pass_", choices=PASSES, default=None,
                        help="forward_backward (default), or forward (the default on the CPU with flex, "
                             "which has no CPU backward)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median is reported")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs before the timed ones (at least 1: blocks, block mask, compilation)")
    parser.add_argument("--max-cell-seconds", type=float, default=30.0,
                        help="stop a cell's timed runs (after no fewer than 3) once they have taken longer "
                             "than this; 0 = never")
    parser.add_argument("--json", default="bench_attention.json", help="where to write all figures")
    parser.add_argument("--seq-rows", type=int, default=32)
    parser.add_argument("--seq-cols", type=int, default=96)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    cpu_flex = args.device == "cpu" and "flex" in args.kernels
    if args.pass_ is None:
        args.pass_ = "forward" if cpu_flex else "forward_backward"
    if cpu_flex and args.pass_ == "forward_backward":
        parser.error("FlexAttention has no backward on the CPU (torch 2.15): use --pass forward, or --kernels sdpa")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: the first run builds the block mask and compiles")

    if args.worker:
        result = run_worker(args)
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but torch.cuda.is_available() is False")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    rows, cols = args.seq_rows, args.seq_cols
    length = rows * cols
    variants = list(args.variants)
    print(f"Attention layer benchmark: grid {rows}x{cols} = {length} positions, d_model={D_MODEL}, "
          f"heads={N_HEADS}, device={args.device}")
    print(f"  local_1d: Local1D(GenerationOrder({rows}, {cols}), block_length={BLOCK_LENGTH_1D}, memory_blocks={MEMORY_BLOCKS_1D})")
    if "local_2d" in variants:
        if rows % BLOCK_2D[0] or cols % BLOCK_2D[1]:
            print(f"  local_2d: skipped: block {BLOCK_2D} does not tile the {rows}x{cols} grid")
            variants.remove("local_2d")
        else:
            print(f"  local_2d: Local2D(GenerationOrder({rows}, {cols}, {BLOCK_2D}), flange={FLANGE_2D}) "
                  f"(note: {BLOCK_2D[0]} divides {rows} and {BLOCK_2D[1]} divides {cols}, so the T2T default "
                  f"query block tiles the grid)")
    print(f"  full:     FullCausal(GenerationOrder({rows}, {cols})) (sdpa: one fused call, is_causal=True)")
    print(f"  kernels: {', '.join(args.kernels)} (sdpa: gathered blocks through scaled_dot_product_attention; "
          "flex: compiled FlexAttention under the pattern's block mask)")
    print("  bfloat16 = torch.autocast(bfloat16) around the layer, float32 weights and input")
    print(f"  each cell: fresh subprocess, {args.warmup} warmup + {args.repeats} timed {args.pass_} runs, "
          "median reported" + (f" (fewer, >= 3, once they exceed {args.max_cell_seconds:g} s)"
                               if args.max_cell_seconds else ""))
    if cpu_flex:
        print("  forward only: torch 2.15 has no FlexAttention backward on the CPU")
    if args.device == "cpu":
        print("  peak MiB = peak resident-set growth over the timed runs (ru_maxrss after - RSS before), MiB")
    else:
        print("  peak MiB = torch.cuda.max_memory_allocated growth over the timed runs, MiB")
    print(flush=True)

    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    if load_start:
        print(f"  load average at start: {load_start[0]:.2f} on {os.cpu_count()} CPUs"
              + ("  (other work is running: timings will be noisy)" if load_start[0] > 0.5 else ""))
    t_start = time.perf_counter()
    results = []
    for dtype in args.dtypes:
        for batch in args.batches:
            for variant in variants:
                for kernel in args.kernels:
                    r = spawn_worker(args, variant, kernel, batch, dtype)
                    results.append(r)
                    status = r.get("error") or f"{r['median_ms']:.1f} ms, {r['peak_mib']:.1f} MiB"
                    print(f"  done {variant:9s} {kernel:4s} batch={batch} {dtype:8s}: {status} "
                          f"({r['worker_wall_s']:.1f} s)", flush=True)

    def lookup(variant, batch, dtype, kernel="sdpa"):
        wanted = (variant, kernel, batch, dtype)
        for r in results:
            if "error" not in r and (r["variant"], r["kernel"], r["batch"], r["dtype"]) == wanted:
                return r
        return None

    for r in results:
        full, same_sdpa = lookup("full", r["batch"], r["dtype"]), lookup(r["variant"], r["batch"], r["dtype"])
        ok = "error" not in r
        r["speedup_vs_full"] = full["median_ms"] / r["median_ms"] if ok and full else None
        r["memory_ratio_vs_full"] = (r["peak_mib"] / full["peak_mib"]) if ok and full and full["peak_mib"] > 0 else None
        r["speedup_vs_sdpa"] = same_sdpa["median_ms"] / r["median_ms"] if ok and same_sdpa else None

    header = f"{'variant':10s} {'kernel':6s} {'batch':>5s} {'dtype':9s} {'median ms':>10s} {'min ms':>9s} " \
             f"{'runs':>4s} {'peak MiB':>9s} {'vs full sdpa':>13s} {'vs same sdpa':>13s} {'mem vs full':>12s}"
    print()
    print(f"pass: {args.pass_}")
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['variant']:10s} {r['kernel']:6s} {r['batch']:5d} {r['dtype']:9s} ERROR {r['error']}")
            continue
        flag = "*" if r.get("peak_is_lower_bound") else ""
        print(f"{r['variant']:10s} {r['kernel']:6s} {r['batch']:5d} {r['dtype']:9s} {r['median_ms']:10.1f} "
              f"{r['min_ms']:9.1f} {r['repeats']:4d} {r['peak_mib']:8.1f}{flag or ' '} "
              f"{fmt(r['speedup_vs_full'], '12.2f')}x {fmt(r['speedup_vs_sdpa'], '12.2f')}x "
              f"{fmt(r['memory_ratio_vs_full'], '11.2f')}x")
    if any(r.get("peak_is_lower_bound") for r in results):
        print("* ru_maxrss did not rise during the runs: the figure is a lower bound")

    print()
    print("Target: 1D local at least 2x faster than full causal with no more peak memory (sdpa)")
    verdicts = []
    for dtype in args.dtypes:
        for batch in args.batches:
            local, full = lookup("local_1d", batch, dtype), lookup("full", batch, dtype)
            if local is None or full is None:
                verdict = {"batch": batch, "dtype": dtype, "pass": None, "reason": "missing measurement"}
                print(f"  batch={batch} {dtype:8s}: N/A (missing measurement)")
            else:
                speedup = full["median_ms"] / local["median_ms"]
                fast = speedup >= 2.0
                lean = local["peak_mib"] <= full["peak_mib"]
                verdict = {"batch": batch, "dtype": dtype, "pass": fast and lean, "speedup": speedup,
                           "local_1d_ms": local["median_ms"], "full_ms": full["median_ms"],
                           "local_1d_peak_mib": local["peak_mib"], "full_peak_mib": full["peak_mib"]}
                print(f"  batch={batch} {dtype:8s}: {'PASS' if fast and lean else 'FAIL'}  "
                      f"speed-up {speedup:.2f}x ({local['median_ms']:.1f} vs {full['median_ms']:.1f} ms; "
                      f"{'>=' if fast else '<'} 2x), peak {local['peak_mib']:.1f} vs {full['peak_mib']:.1f} MiB "
                      f"({'<=' if lean else '>'} full)")
            verdicts.append(verdict)

    total_s = time.perf_counter() - t_start
    report = {
        "config": {"rows": rows, "cols": cols, "length": length, "d_model": D_MODEL, "n_heads": N_HEADS,
                   "batches": args.batches, "dtypes": args.dtypes, "variants": variants, "kernels": args.kernels,
                   "pass": args.pass_,
                   "repeats": args.repeats, "warmup": args.warmup, "max_cell_seconds": args.max_cell_seconds,
                   "bf16_mode": "torch.autocast(bfloat16), float32 weights and input",
                   "loss": ("random projection: y.backward(g), g ~ N(0, 1) fixed" if args.pass_ == "forward_backward"
                            else "none: forward under torch.no_grad()"),
                   "local_1d": {"block_length": BLOCK_LENGTH_1D, "memory_blocks": MEMORY_BLOCKS_1D},
                   "local_2d": {"block": BLOCK_2D, "flange": FLANGE_2D}},
        "machine": {**machine_info(args.device, args.threads), "loadavg_start": load_start,
                    "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "results": results,
        "target": {"statement": "1D local at least 2x faster than full causal with no more peak memory (sdpa)",
                   "verdicts": verdicts},
        "total_runtime_s": total_s,
    }
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nTotal runtime {total_s:.1f} s; figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
