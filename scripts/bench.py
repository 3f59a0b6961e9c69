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

What one configuration measures
-------------------------------
A configuration is (preset, image size, attention, batch, precision). The model is
``imagetx.ImageTransformer(ModelConfig.from_dict(yaml['model']['config']))`` with
``image_size`` and ``attention`` overridden; everything else (dropout included, in
training mode) is the preset's. A training step is exactly::

    with torch.autocast(device, torch.bfloat16, enabled=precision == "bf16"):
        loss = model.bits_per_dim(images, labels).mean()
    optimizer.zero_grad(set_to_none=True); loss.backward(); optimizer.step()

on random uint8 images (labels for class-conditional presets), with the optimiser of
training (``imagetx.training.module.make_optimizer`` with the preset's settings: fused Adam, or AdamW for
``adamw_cosine``). No gradient clipping, no data loading: the model's own cost.
``--warmup`` untimed steps, then ``--steps`` timed steps; the median is reported (fewer
timed steps, at least 1, where they would exceed ``--max-cell-seconds``, default 40 s on
CPU and 60 s on CUDA, judged by the last warm-up step). images/s = batch / median step
time; tokens/s (positions/s) = images/s x positions per image (3072 for the categorical
32x32 grid, 1024 for DMOL).

Every configuration is the preset's attention (local_1d / local_2d) AND the same model
with ``attention: full`` (full causal, PyTorch's fused kernel), each in a fresh
subprocess, so the table shows the speed-up of local over full attention and the
memory ratio, at every image size: ``--image-sizes 32 64`` shows how the two scale
(64x64 categorical: a 64x192 grid, 12,288 positions; the 1D block length stays 256, so
local attention's cost per position stays flat while full attention's doubles).

Peak memory
-----------
* CPU: peak resident-set growth, MiB = ``ru_maxrss`` (resource.getrusage) after the timed
  steps minus the RSS right before the first step (model, optimiser and inputs exist;
  Adam's state, gradients and activations are inside the growth). One fresh process per
  configuration, as in scripts/bench_attention.py (helpers of both in scripts/common.py). ``*`` marks
  a lower bound (the high-water mark never moved).
* CUDA: ``torch.cuda.max_memory_allocated`` over the steps (absolute, weights included);
  the growth over the allocation before the first step is in the JSON too.

FLOPs and model FLOP utilisation (MFU)
--------------------------------------
FLOPs per image for one training step (forward + backward), from
``imagetx.model.flops.count_flops`` on the device the step runs on (the model's real work: linear
layers, and the query-key pairs each attention kernel computes, local blocks or FlexAttention
tiles, never a dense T²; docs/model.md §8)::

    dense     = 3 x projections + 2 x input layers
    attention = 3 x attention
    flops     = dense + attention

``keys_per_query`` = the decoder self-attention's computed pairs per query (attention /
(L x 4 x d x T)). Achieved FLOP/s = flops x images/s. MFU = achieved / peak, with the peak
from ``--peak-tflops`` or, on CUDA, the dense bf16 peak of the device (Lightning's table, then
``imagetx.training.throughput.DENSE_PEAK_FLOPS``: H100 and H200 SXM 989 TFLOP/s, without sparsity).

Sampling
--------
For each preset at its own image size (32; first ``--image-sizes`` value otherwise),
model in eval mode, ``--sample-batch`` images (``--no-sampling`` skips all of it):

* cached sampling, the ``quick`` preset: ``imagetx.model.sampler.sample`` for the whole batch,
  all 1024 steps, timed end to end (after a few warm-up steps of a throw-away decoder);
* cached sampling, paper presets: sampling all 3072 steps of a 12x512 model is slow on a
  CPU, so this times the step loop of ``ImageTransformer.decode_step`` (step, head
  sample, embed, the loop of ``sample``) for ``--sample-steps`` steps after 4 warm-up
  steps, and extrapolates: decoder set-up + T x time per step. Every cached step costs
  the same (fixed-width ring buffers), so the extrapolation is linear and exact up to
  noise; the output says "extrapolated". ``--sample-steps 0`` runs all steps instead;
* uncached recomputation (what T2T does), the ``quick`` preset: ``sample_uncached(...,
  steps=K)`` after one warm-up step, extrapolated linearly to all steps (each step is
  the same full forward pass), as scripts/bench_sampling.py does.

``--precision bf16`` samples with the model cast to bfloat16 (the sampler keeps its cache
in the model's dtype); fp32 otherwise.

Targets (PASS/FAIL lines at the end)
------------------------------------
local_vs_full: cifar10_categorical (12 layers, d=512, 3072 positions), 32x32, batch 1: a training
    step with 1D local attention at least 1.5x faster than with full causal attention,
    with no more peak memory (2 % tolerance for RSS noise).
speedup_grows: local attention's speed-up over full attention is larger at 64x64 than at 32x32
    (each preset and batch measured at both sizes; the categorical batch-1 line first).
cached_sampling: cached sampling with the quick preset at least 100x the images/s of uncached
    recomputation.

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
import statistics
import sys
import time
from pathlib import Path

from scripts.common import (RESULT_MARKER, current_rss_bytes, fmt, machine_info, maxrss_bytes, preset_model_config,
                            run_subprocess, sample_uncached, sync, timed)

REPO_ROOT = Path(__file__).resolve().parent.parent

PRESETS = ("quick", "cifar10_categorical", "cifar10_dmol", "cifar10_2d")
CPU_DEFAULT_PRESETS = ("quick", "cifar10_categorical")
PAPER_CATEGORICAL = "cifar10_categorical"
QUICK = "quick"
SMOKE_MODEL = dict(n_layers=1, d_model=32, n_heads=2, d_filter=64)
SAMPLE_WARMUP_STEPS = 4
MEMORY_TOLERANCE = 1.02  # local_vs_full: "no more peak memory", within RSS noise


# ----------------------------------------------------------------------------- presets

def preset_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = REPO_ROOT / "configs" / f"{name}.yaml"
    if candidate.is_file():
        return candidate
    raise SystemExit(f"error: preset {name!r} not found: give one of {', '.join(PRESETS)} or a YAML path")


def preset_name(name: str) -> str:
    return Path(name).stem


def read_preset(name: str) -> dict:
    import yaml

    return yaml.safe_load(preset_path(name).read_text())


def build_config(spec: dict):
    """The ModelConfig of a configuration: the preset's, with image size, attention (and, for
    the smoke run, the model size) overridden."""
    smoke = SMOKE_MODEL if spec.get("smoke") else {}
    return preset_model_config(preset_path(spec["preset"]), image_size=spec["image_size"],
                               attention=spec["attention"], **smoke)


# ----------------------------------------------------------------------------- FLOPs

def flops_per_image(model, device) -> dict:
    """Training FLOPs (forward + backward) per image on ``device``; see the module docstring."""
    from torch import nn

    from imagetx.model.flops import count_flops, decoder_attention_pairs

    length = model.order.length
    linear = sum(p.numel() for mod in model.modules() if isinstance(mod, nn.Linear) for p in mod.parameters())
    flops = count_flops(model, device)
    return {"linear_params": linear, "keys_per_query": decoder_attention_pairs(model, device) / length,
            "dense_flops": 3.0 * flops.projections + 2.0 * flops.inputs, "attention_flops": 3.0 * flops.attention,
            "flops_per_image": float(flops.training), "counted": True}


# ----------------------------------------------------------------------------- workers

def make_inputs(cfg, batch: int, device, seed: int = 0):
    import torch

    from imagetx.model.inputs import downsample_area

    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, cfg.image_size, cfg.image_size, 3), generator=gen,
                           dtype=torch.uint8).to(device)
    labels = (torch.arange(batch) % cfg.num_classes).to(device) if cfg.num_classes else None
    low_res = downsample_area(images, cfg.low_res_size) if cfg.encoder_layers else None
    return images, labels, low_res


def train_worker(spec: dict) -> dict:
    """One training configuration, in this (fresh) process."""
    import torch

    from imagetx import ImageTransformer
    from imagetx.training.module import make_optimizer, optimizer_settings

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    cfg = build_config(spec)
    hp = read_preset(spec["preset"])["model"]
    torch.manual_seed(0)
    model = ImageTransformer(cfg).to(device).train()
    optimizer = make_optimizer(model, **optimizer_settings(hp))
    images, labels, low_res = make_inputs(cfg, spec["batch"], device)
    bf16 = spec["precision"] == "bf16"
    losses = []

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model.bits_per_dim(images, labels, low_res).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    sync(device)
    rss_before, maxrss_before = current_rss_bytes(), maxrss_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device)

    warmup_times = [timed(step, device) for _ in range(spec["warmup"])]
    steps = spec["steps"]
    if spec["max_cell_seconds"] and warmup_times and warmup_times[-1] * steps > spec["max_cell_seconds"]:
        steps = max(1, int(spec["max_cell_seconds"] / warmup_times[-1]))
    times = [timed(step, device) for _ in range(steps)]

    median = statistics.median(times)
    length = model.order.length
    flops = flops_per_image(model, device)
    images_per_sec = spec["batch"] / median
    result = {
        **spec, "kind": "train", "positions": length, "grid": list(cfg.grid_shape),
        "params": sum(p.numel() for p in model.parameters()),
        "warmup_s": warmup_times, "times_s": times, "timed_steps": steps, "median_s": median,
        "images_per_sec": images_per_sec, "tokens_per_sec": images_per_sec * length,
        "final_loss_bpd": float(losses[-1].float()), "threads": torch.get_num_threads(),
        **flops,
        "achieved_tflops": flops["flops_per_image"] * images_per_sec / 1e12 if flops["counted"] else None,
    }
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        result.update(peak_mib=peak / 2**20, peak_growth_mib=(peak - cuda_before) / 2**20,
                      memory_metric="torch.cuda.max_memory_allocated (absolute)",
                      float32_matmul_precision=torch.get_float32_matmul_precision())
    else:
        maxrss_after = maxrss_bytes()
        result.update(peak_mib=max(0, maxrss_after - rss_before) / 2**20,
                      memory_metric="peak RSS growth (ru_maxrss after - RSS before the first step)",
                      rss_before_mib=rss_before / 2**20, maxrss_after_mib=maxrss_after / 2**20,
                      peak_is_lower_bound=maxrss_after <= maxrss_before)
    return result


def sample_worker(spec: dict) -> dict:
    """Cached (and, if asked, uncached) sampling speed of one preset, in this process."""
    import torch

    from imagetx import ImageTransformer
    from imagetx.model.sampler import first_input, sample

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    cfg = build_config(spec)
    torch.manual_seed(0)
    model = ImageTransformer(cfg).to(device).eval()
    if spec["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    batch, length = spec["sample_batch"], model.order.length
    _, labels, low_res = make_inputs(cfg, batch, device)
    generator = torch.Generator(device=device).manual_seed(0)

    @torch.no_grad()
    def cached_steps(n: int, warm: int) -> tuple[float, float]:
        """(decoder set-up seconds, seconds per step over steps warm..n-1) of sample()'s loop."""
        sync(device)
        t0 = time.perf_counter()
        cache = model.start_decoding(batch, labels, low_res)
        sync(device)
        setup = time.perf_counter() - t0
        value, t1 = first_input(model, batch), time.perf_counter()
        for t in range(n):
            if t == warm:
                sync(device)
                t1 = time.perf_counter()
            params = model.decode_step(value, cache)
            value = model.head.sample(params[:, None], 1.0, generator)[:, 0]
        sync(device)
        return setup, (time.perf_counter() - t1) / max(1, n - warm)

    result = {**spec, "kind": "sample", "positions": length, "threads": torch.get_num_threads()}
    k = spec["sample_steps"]
    if k == 0 or k + SAMPLE_WARMUP_STEPS >= length:  # every step, end to end
        cached_steps(min(SAMPLE_WARMUP_STEPS, length), 0)  # warm-up on a throw-away decoder
        sync(device)
        t0 = time.perf_counter()
        sample(model, batch, labels, low_res, generator=generator)
        sync(device)
        seconds = time.perf_counter() - t0
        result.update(cached_seconds=seconds, cached_extrapolated=False, cached_steps_timed=length,
                      cached_how=f"sample(), all {length} steps, timed")
    else:
        setup, per_step = cached_steps(SAMPLE_WARMUP_STEPS + k, SAMPLE_WARMUP_STEPS)
        seconds = setup + per_step * length
        result.update(cached_seconds=seconds, cached_extrapolated=True, cached_steps_timed=k,
                      cached_setup_s=setup, cached_step_s=per_step,
                      cached_how=f"decode_step loop: {k} steps timed, extrapolated to {length}")
    result["cached_images_per_sec"] = batch / seconds
    u = spec["uncached_steps"]
    if u:
        sample_uncached(model, batch, labels, low_res, steps=1, generator=generator)  # warm-up
        sync(device)
        t0 = time.perf_counter()
        sample_uncached(model, batch, labels, low_res, steps=u, generator=generator)
        sync(device)
        measured = time.perf_counter() - t0
        uncached = measured / u * length
        result.update(uncached_steps_timed=u, uncached_seconds_measured=measured,
                      uncached_seconds=uncached, uncached_images_per_sec=batch / uncached,
                      uncached_how=f"sample_uncached: {u} steps timed, extrapolated to {length}",
                      cached_speedup=uncached / seconds)
    return result


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


def find(results, **key):
    for r in results:
        if "error" not in r and all(r.get(k) == v for k, v in key.items()):
            return r
    return None


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
    sizes = args.image_sizes
    common = dict(device=args.device, precision=args.precision, threads=args.threads, smoke=args.quick_smoke)
    plan = []
    for preset in args.presets:
        base_attention = read_preset(preset)["model"]["config"].get("attention", "local_1d")
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
    print(f"  TFLOP/s: analytic FLOPs per image (module docstring) x images/s; MFU against {peak_source}"
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
