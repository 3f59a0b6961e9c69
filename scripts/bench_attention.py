"""Benchmark one attention layer: 1D local vs 2D local vs full causal, each through the
gathered-block SDPA path and through FlexAttention (docs/model.md §4).

What it measures
----------------
At the paper's CIFAR-10 size (categorical grid 32 rows x 96 columns = 3072 positions,
d_model = 512, 4 heads), ONE ``imagetx.model.attention.SelfAttention(d_model, n_heads, PatternIndex(pattern),
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
* ``flex``: ``torch.compile``d FlexAttention under the pattern's block mask (imagetx/model/attention.py);
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
import sys
import time
from pathlib import Path

from scripts.bench_attention_worker import (BLOCK_2D, BLOCK_LENGTH_1D, D_MODEL, FLANGE_2D, MEMORY_BLOCKS_1D, N_HEADS,
                                            run_worker)
from scripts.common import RESULT_MARKER, fmt, machine_info, run_subprocess

REPO_ROOT = Path(__file__).resolve().parent.parent  # workers run from here, where ``scripts`` imports

VARIANTS = ("local_1d", "local_2d", "full")
KERNELS = ("sdpa", "flex")
PASSES = ("forward", "forward_backward")
TARGET = "1D local at least 2x faster than full causal with no more peak memory (sdpa)"


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


def build_parser() -> argparse.ArgumentParser:
    """The command line: every option of the module docstring, plus the hidden --worker."""
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
    return parser


def flex_on_cpu(args: argparse.Namespace) -> bool:
    """Whether the flex kernel runs on the CPU, where torch has no FlexAttention backward."""
    return args.device == "cpu" and "flex" in args.kernels


def resolve_pass(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Choose the default --pass and reject a pass or warm-up that cannot run (driver and worker alike)."""
    cpu_flex = flex_on_cpu(args)
    if args.pass_ is None:
        args.pass_ = "forward" if cpu_flex else "forward_backward"
    if cpu_flex and args.pass_ == "forward_backward":
        parser.error("FlexAttention has no backward on the CPU (torch 2.15): use --pass forward, or --kernels sdpa")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: the first run builds the block mask and compiles")


def check_driver_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject a CUDA run without CUDA, and fewer than one timed run."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but torch.cuda.is_available() is False")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")


def block_2d_tiles(rows: int, cols: int) -> bool:
    """Whether local_2d's query block tiles the rows x cols grid."""
    return not (rows % BLOCK_2D[0] or cols % BLOCK_2D[1])


def variants_to_run(args: argparse.Namespace) -> list[str]:
    """The --variants, less local_2d where its query block does not tile the grid."""
    variants = list(args.variants)
    if "local_2d" in variants and not block_2d_tiles(args.seq_rows, args.seq_cols):
        variants.remove("local_2d")
    return variants


def print_header(args: argparse.Namespace) -> None:
    """Print the layer, the patterns, the kernels and how each cell is measured."""
    rows, cols = args.seq_rows, args.seq_cols
    print(f"Attention layer benchmark: grid {rows}x{cols} = {rows * cols} positions, d_model={D_MODEL}, "
          f"heads={N_HEADS}, device={args.device}")
    print(f"  local_1d: Local1D(GenerationOrder({rows}, {cols}), block_length={BLOCK_LENGTH_1D}, "
          f"memory_blocks={MEMORY_BLOCKS_1D})")
    if "local_2d" in args.variants:
        if not block_2d_tiles(rows, cols):
            print(f"  local_2d: skipped: block {BLOCK_2D} does not tile the {rows}x{cols} grid")
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
    if flex_on_cpu(args):
        print("  forward only: torch 2.15 has no FlexAttention backward on the CPU")
    if args.device == "cpu":
        print("  peak MiB = peak resident-set growth over the timed runs (ru_maxrss after - RSS before), MiB")
    else:
        print("  peak MiB = torch.cuda.max_memory_allocated growth over the timed runs, MiB")
    print(flush=True)


def print_load(load: tuple[float, float, float] | None) -> None:
    """Print the load average, warning when other work makes the timings noisy."""
    if load:
        print(f"  load average at start: {load[0]:.2f} on {os.cpu_count()} CPUs"
              + ("  (other work is running: timings will be noisy)" if load[0] > 0.5 else ""))


def run_cells(args: argparse.Namespace, variants: list[str]) -> list[dict]:
    """Measure every (dtype, batch, variant, kernel) cell in its own worker process, printing each as it ends."""
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
    return results


def lookup(results: list[dict], variant: str, batch: int, dtype: str, kernel: str = "sdpa") -> dict | None:
    """The successful result of one cell, or None."""
    wanted = (variant, kernel, batch, dtype)
    for r in results:
        if "error" not in r and (r["variant"], r["kernel"], r["batch"], r["dtype"]) == wanted:
            return r
    return None


def add_comparisons(results: list[dict]) -> None:
    """Add each cell's speed-up and memory ratio against full causal (sdpa), and its speed-up against sdpa."""
    for r in results:
        full = lookup(results, "full", r["batch"], r["dtype"])
        same_sdpa = lookup(results, r["variant"], r["batch"], r["dtype"])
        ok = "error" not in r
        r["speedup_vs_full"] = full["median_ms"] / r["median_ms"] if ok and full else None
        r["memory_ratio_vs_full"] = (r["peak_mib"] / full["peak_mib"]) if ok and full and full["peak_mib"] > 0 else None
        r["speedup_vs_sdpa"] = same_sdpa["median_ms"] / r["median_ms"] if ok and same_sdpa else None


def print_table(results: list[dict], pass_: str) -> None:
    """Print the table of every cell."""
    header = f"{'variant':10s} {'kernel':6s} {'batch':>5s} {'dtype':9s} {'median ms':>10s} {'min ms':>9s} " \
             f"{'runs':>4s} {'peak MiB':>9s} {'vs full sdpa':>13s} {'vs same sdpa':>13s} {'mem vs full':>12s}"
    print()
    print(f"pass: {pass_}")
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


def check_target(results: list[dict], args: argparse.Namespace) -> list[dict]:
    """Print the PASS/FAIL line of the target for each batch and dtype, and return the verdicts."""
    print()
    print(f"Target: {TARGET}")
    verdicts = []
    for dtype in args.dtypes:
        for batch in args.batches:
            verdicts.append(target_verdict(results, batch, dtype))
    return verdicts


def target_verdict(results: list[dict], batch: int, dtype: str) -> dict:
    """Print and return the target's verdict for one batch and dtype (N/A without both sdpa cells)."""
    local, full = lookup(results, "local_1d", batch, dtype), lookup(results, "full", batch, dtype)
    if local is None or full is None:
        print(f"  batch={batch} {dtype:8s}: N/A (missing measurement)")
        return {"batch": batch, "dtype": dtype, "pass": None, "reason": "missing measurement"}
    speedup = full["median_ms"] / local["median_ms"]
    fast = speedup >= 2.0
    lean = local["peak_mib"] <= full["peak_mib"]
    print(f"  batch={batch} {dtype:8s}: {'PASS' if fast and lean else 'FAIL'}  "
          f"speed-up {speedup:.2f}x ({local['median_ms']:.1f} vs {full['median_ms']:.1f} ms; "
          f"{'>=' if fast else '<'} 2x), peak {local['peak_mib']:.1f} vs {full['peak_mib']:.1f} MiB "
          f"({'<=' if lean else '>'} full)")
    return {"batch": batch, "dtype": dtype, "pass": fast and lean, "speedup": speedup,
            "local_1d_ms": local["median_ms"], "full_ms": full["median_ms"],
            "local_1d_peak_mib": local["peak_mib"], "full_peak_mib": full["peak_mib"]}


def config_record(args: argparse.Namespace, variants: list[str]) -> dict:
    """The run's configuration, for the JSON report."""
    rows, cols = args.seq_rows, args.seq_cols
    return {"rows": rows, "cols": cols, "length": rows * cols, "d_model": D_MODEL, "n_heads": N_HEADS,
            "batches": args.batches, "dtypes": args.dtypes, "variants": variants, "kernels": args.kernels,
            "pass": args.pass_,
            "repeats": args.repeats, "warmup": args.warmup, "max_cell_seconds": args.max_cell_seconds,
            "bf16_mode": "torch.autocast(bfloat16), float32 weights and input",
            "loss": ("random projection: y.backward(g), g ~ N(0, 1) fixed" if args.pass_ == "forward_backward"
                     else "none: forward under torch.no_grad()"),
            "local_1d": {"block_length": BLOCK_LENGTH_1D, "memory_blocks": MEMORY_BLOCKS_1D},
            "local_2d": {"block": BLOCK_2D, "flange": FLANGE_2D}}


def main(argv: list[str] | None = None) -> int:
    """Run every cell (or, with the hidden --worker, one), print the table and the target, write the JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_pass(parser, args)
    if args.worker:
        print(RESULT_MARKER + json.dumps(run_worker(args)), flush=True)
        return 0
    check_driver_args(parser, args)

    variants = variants_to_run(args)
    print_header(args)
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    print_load(load_start)
    t_start = time.perf_counter()
    results = run_cells(args, variants)
    add_comparisons(results)
    print_table(results, args.pass_)
    verdicts = check_target(results, args)
    total_s = time.perf_counter() - t_start

    report = {
        "config": config_record(args, variants),
        "machine": {**machine_info(args.device, args.threads), "loadavg_start": load_start,
                    "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "results": results,
        "target": {"statement": TARGET, "verdicts": verdicts},
        "total_runtime_s": total_s,
    }
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nTotal runtime {total_s:.1f} s; figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
