"""What scripts/bench.py measures, each configuration in a worker process of its own
(``python -m scripts.bench --worker SPEC``): a training step (``train_worker``) or a preset's
sampling speed (``sample_worker``), on a model built from a preset (``build_config``).

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
  the same (fixed-width kv-caches), so the extrapolation is linear and exact up to
  noise; the output says "extrapolated". ``--sample-steps 0`` runs all steps instead;
* uncached recomputation (what T2T does), the ``quick`` preset: ``sample_uncached(...,
  steps=K)`` after one warm-up step, extrapolated linearly to all steps (each step is
  the same full forward pass), as scripts/bench_sampling.py does.

``--precision bf16`` samples with the model cast to bfloat16 (the sampler keeps its cache
in the model's dtype); fp32 otherwise.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from pathlib import Path

from scripts.common import PeakMemory, sample_uncached, sync, timed

REPO_ROOT = Path(__file__).resolve().parent.parent

PRESETS = ("quick", "cifar10_categorical", "cifar10_dmol", "cifar10_2d")
SMOKE_MODEL = {"n_layers": 1, "d_model": 32, "attention.n_heads": 2, "d_filter": 64}
SAMPLE_WARMUP_STEPS = 4


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
    from imagetx.training.presets import read_preset as read_file

    return read_file(preset_path(name))


def build_config(spec: dict):
    """The ModelConfig of a configuration: the preset's, with image size, attention (and, for
    the smoke run, the model size) overridden."""
    from imagetx.training.presets import preset_model_config

    smoke = SMOKE_MODEL if spec.get("smoke") else {}
    return preset_model_config(preset_path(spec["preset"]), {"image_size": spec["image_size"],
                                                          "attention.kind": spec["attention"], **smoke})


def set_threads(spec: dict) -> None:
    import torch

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])


def make_inputs(cfg, batch: int, device, seed: int = 0):
    import torch

    from imagetx.model.superres import downsample_area

    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, cfg.image_size, cfg.image_size, 3), generator=gen,
                           dtype=torch.uint8).to(device)
    labels = (torch.arange(batch) % cfg.num_classes).to(device) if cfg.num_classes else None
    low_res = downsample_area(images, cfg.superres.low_res_size) if cfg.superres else None
    return images, labels, low_res


# ----------------------------------------------------------------------------- training

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


def training_step(spec: dict, cfg, device):
    """(model, ``step``: one training step of the configuration, losses: where it appends its loss)."""
    import torch

    from imagetx import ImageTransformer, build_model
    from imagetx.model.attention import FLEX_BLOCK_SIZE
    from imagetx.model.scoring import batch_bits_per_dim
    from imagetx.training.module import make_optimizer, optimizer_settings

    hp = read_preset(spec["preset"])["model"]
    torch.manual_seed(0)
    model = build_model(cfg, spec.get("kernel", "auto"), spec.get("flex_block_size", FLEX_BLOCK_SIZE))
    model = model.to(device).train()
    optimizer = make_optimizer(model, **optimizer_settings(hp))
    images, labels, _ = make_inputs(cfg, spec["batch"], device)  # the low-res input: made from the images
    batch = {"images": images} | ({} if labels is None else {"labels": labels})
    bf16 = spec["precision"] == "bf16"
    losses = []

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = batch_bits_per_dim(model, batch).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    return model, step, losses


def timed_steps(step, device, spec: dict) -> tuple[list[float], list[float]]:
    """(warm-up seconds, timed seconds) of ``step``: the warm-up steps, then the timed ones,
    fewer where they would take longer than max_cell_seconds, judged by the last warm-up step."""
    warmup_times = [timed(step, device) for _ in range(spec["warmup"])]
    steps = spec["steps"]
    if spec["max_cell_seconds"] and warmup_times and warmup_times[-1] * steps > spec["max_cell_seconds"]:
        steps = max(1, int(spec["max_cell_seconds"] / warmup_times[-1]))
    return warmup_times, [timed(step, device) for _ in range(steps)]


def training_memory(memory: PeakMemory) -> dict:
    """The steps' peak memory: absolute on CUDA (the growth beside it), the RSS growth on a CPU."""
    import torch

    if memory.device.type == "cuda":
        peak = memory.cuda_peak_bytes()
        return dict(peak_mib=peak / 2**20, peak_growth_mib=(peak - memory.cuda_before) / 2**20,
                    memory_metric="torch.cuda.max_memory_allocated (absolute)",
                    float32_matmul_precision=torch.get_float32_matmul_precision())
    return dict(memory_metric="peak RSS growth (ru_maxrss after - RSS before the first step)", **memory.rss_figures())


def train_worker(spec: dict) -> dict:
    """One training configuration, in this (fresh) process."""
    import torch

    set_threads(spec)
    device = torch.device(spec["device"])
    cfg = build_config(spec)
    model, step, losses = training_step(spec, cfg, device)
    sync(device)
    memory = PeakMemory(device)
    warmup_times, times = timed_steps(step, device, spec)
    median = statistics.median(times)
    length = model.order.length
    flops = flops_per_image(model, device)
    images_per_sec = spec["batch"] / median
    return {
        **spec, "kind": "train", "positions": length, "grid": list(cfg.grid_shape),
        "params": sum(p.numel() for p in model.parameters()),
        "warmup_s": warmup_times, "times_s": times, "timed_steps": len(times), "median_s": median,
        "images_per_sec": images_per_sec, "tokens_per_sec": images_per_sec * length,
        "final_loss_bpd": float(losses[-1].float()), "threads": torch.get_num_threads(),
        **flops,
        "achieved_tflops": flops["flops_per_image"] * images_per_sec / 1e12 if flops["counted"] else None,
        **training_memory(memory),
    }


# ----------------------------------------------------------------------------- sampling

def decode_loop_seconds(model, batch: int, labels, low_res, generator, device, n: int,
                        warm: int) -> tuple[float, float]:
    """(decoder set-up seconds, seconds per step over steps warm..n-1) of sample()'s loop."""
    import torch

    from imagetx.model.heads import params_and_bounds
    from imagetx.model.sampler import first_input

    with torch.no_grad():
        sync(device)
        t0 = time.perf_counter()
        cache = model.start_decoding(batch, labels, low_res=low_res)
        sync(device)
        setup = time.perf_counter() - t0
        value, t1 = first_input(model, batch), time.perf_counter()
        for t in range(n):
            if t == warm:
                sync(device)
                t1 = time.perf_counter()
            params, bounds = params_and_bounds(model.decode_step(value, cache))  # bounds: exact_box_means
            value = model.head.sample(params[:, None], 1.0, generator,
                                      None if bounds is None else bounds[:, None])[:, 0]
        sync(device)
        return setup, (time.perf_counter() - t1) / max(1, n - warm)


def cached_figures(model, spec: dict, labels, low_res, generator, device) -> dict:
    """Cached sampling of the batch: every step, timed end to end, or (``sample_steps``) the
    decoding loop's steps timed and extrapolated; see the module docstring."""
    from imagetx.model.sampler import sample

    batch, length, k = spec["sample_batch"], model.order.length, spec["sample_steps"]
    loop_seconds = partial(decode_loop_seconds, model, batch, labels, low_res, generator, device)
    if k == 0 or k + SAMPLE_WARMUP_STEPS >= length:  # every step, end to end
        loop_seconds(min(SAMPLE_WARMUP_STEPS, length), 0)  # warm-up on a throw-away decoder
        seconds = timed(lambda: sample(model, batch, labels, low_res, generator=generator), device)
        figures = dict(cached_seconds=seconds, cached_extrapolated=False, cached_steps_timed=length,
                       cached_how=f"sample(), all {length} steps, timed")
    else:
        setup, per_step = loop_seconds(SAMPLE_WARMUP_STEPS + k, SAMPLE_WARMUP_STEPS)
        seconds = setup + per_step * length
        figures = dict(cached_seconds=seconds, cached_extrapolated=True, cached_steps_timed=k,
                       cached_setup_s=setup, cached_step_s=per_step,
                       cached_how=f"decode_step loop: {k} steps timed, extrapolated to {length}")
    return {**figures, "cached_images_per_sec": batch / seconds}


def uncached_figures(model, spec: dict, labels, low_res, generator, device, cached_seconds: float) -> dict:
    """Uncached recomputation: ``uncached_steps`` steps timed (after one warm-up step) and
    extrapolated to every step, and cached sampling's speed-up over it."""
    batch, length, u = spec["sample_batch"], model.order.length, spec["uncached_steps"]
    sample_uncached(model, batch, labels, low_res, steps=1, generator=generator)  # warm-up
    measured = timed(lambda: sample_uncached(model, batch, labels, low_res, steps=u, generator=generator), device)
    uncached = measured / u * length
    return dict(uncached_steps_timed=u, uncached_seconds_measured=measured,
                uncached_seconds=uncached, uncached_images_per_sec=batch / uncached,
                uncached_how=f"sample_uncached: {u} steps timed, extrapolated to {length}",
                cached_speedup=uncached / cached_seconds)


def sample_worker(spec: dict) -> dict:
    """Cached (and, if asked, uncached) sampling speed of one preset, in this process."""
    import torch

    from imagetx import ImageTransformer, build_model

    set_threads(spec)
    device = torch.device(spec["device"])
    cfg = build_config(spec)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).eval()
    if spec["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    _, labels, low_res = make_inputs(cfg, spec["sample_batch"], device)
    generator = torch.Generator(device=device).manual_seed(0)
    result = {**spec, "kind": "sample", "positions": model.order.length, "threads": torch.get_num_threads()}
    result.update(cached_figures(model, spec, labels, low_res, generator, device))
    if spec["uncached_steps"]:
        result.update(uncached_figures(model, spec, labels, low_res, generator, device, result["cached_seconds"]))
    return result
