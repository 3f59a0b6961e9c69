"""One cell of scripts/bench_attention.py, measured in a worker process of its own
(``python -m scripts.bench_attention --worker ...``): one attention layer of a pattern through
one kernel, at one batch size and dtype (what and how: scripts/bench_attention.py's docstring)."""

from __future__ import annotations

import argparse
import statistics
import time

from scripts.common import PeakMemory, reset_peak_rss, sync, timed

D_MODEL, N_HEADS = 512, 4
BLOCK_LENGTH_1D, MEMORY_BLOCKS_1D = 256, 1
BLOCK_2D, FLANGE_2D = (16, 16), (16, 32)


def build_pattern(variant: str, rows: int, cols: int):
    from imagetx.model.patterns import GenerationOrder
    from imagetx.model.patterns import FullCausal, Local1D, Local2D

    if variant == "local_1d":
        return Local1D(GenerationOrder(rows, cols), block_length=BLOCK_LENGTH_1D, memory_blocks=MEMORY_BLOCKS_1D)
    if variant == "local_2d":
        return Local2D(GenerationOrder(rows, cols, BLOCK_2D), flange=FLANGE_2D)
    if variant == "full":
        return FullCausal(GenerationOrder(rows, cols))
    raise ValueError(f"unknown variant {variant!r}")


def layer_pass(pattern, kernel: str, batch: int, use_autocast: bool, backward: bool, device):
    """One run of the cell: the layer over a random (batch, T, D_MODEL) input, and its backward
    pass where ``backward``."""
    import torch

    from imagetx.model.attention import FLEX_BLOCK_SIZE, SelfAttention, may_use_flex
    from imagetx.model.patterns import PatternIndex

    length = pattern.length
    forms = PatternIndex(pattern, FLEX_BLOCK_SIZE if may_use_flex(kernel, D_MODEL // N_HEADS) else None)
    module = SelfAttention(D_MODEL, N_HEADS, forms, kernel=kernel).to(device)
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

    return step


def warm_up(step, device, runs: int) -> float:
    """Seconds of the first of ``runs`` untimed runs: it builds the pattern's blocks or block mask
    and, for flex, compiles the kernel; the memory figures start after them."""
    t0 = time.perf_counter()
    step()
    sync(device)
    first_run_s = time.perf_counter() - t0
    for _ in range(runs - 1):
        step()
    sync(device)
    return first_run_s


def timed_runs_ms(step, device, repeats: int, max_cell_seconds: float) -> list[float]:
    """``repeats`` timed runs, ms, but no more than ``max_cell_seconds``' worth once 3 are done."""
    times_ms: list[float] = []
    while len(times_ms) < repeats:
        times_ms.append(timed(step, device) * 1000.0)
        if max_cell_seconds and len(times_ms) >= 3 and sum(times_ms) / 1000.0 > max_cell_seconds:
            break
    return times_ms


def layer_memory(memory: PeakMemory, peak_reset: bool) -> dict:
    """The timed runs' peak memory: the growth of CUDA's allocation, or of the resident set."""
    if memory.device.type == "cuda":
        return dict(peak_mib=(memory.cuda_peak_bytes() - memory.cuda_before) / 2**20,
                    memory_metric="cuda max_memory_allocated growth")
    return dict(memory_metric="peak RSS growth over the timed runs (ru_maxrss after - RSS before)",
                peak_reset_before_timed_runs=peak_reset, maxrss_before_mib=memory.maxrss_before / 2**20,
                **memory.rss_figures())


def run_worker(args: argparse.Namespace) -> dict:
    """One (variant, kernel, batch, dtype) measurement in this (fresh) process."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    variant, kernel, batch, dtype = args.variants[0], args.kernels[0], args.batches[0], args.dtypes[0]
    use_autocast = dtype == "bfloat16"
    torch.manual_seed(0)
    pattern = build_pattern(variant, args.seq_rows, args.seq_cols)
    step = layer_pass(pattern, kernel, batch, use_autocast, args.pass_ == "forward_backward", device)
    first_run_s = warm_up(step, device, args.warmup)
    peak_reset = reset_peak_rss()
    memory = PeakMemory(device)
    times_ms = timed_runs_ms(step, device, args.repeats, args.max_cell_seconds)
    return {
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
        **layer_memory(memory, peak_reset),
    }
