"""Sampling speed, images/s, same model, batch, machine and run: the cached decoder's step eager
and compiled, and uncached full recomputation.

    .venv/bin/python -m scripts.bench_sampling [--config configs/quick.yaml] [--batch 16]
                                               [--compile-mode default] [--uncached-steps 8]
                                               [--threads N] [--json bench_sampling.json]
                                               [--completion-ckpt pretrained/completion]
                                               [--data-root ../shared/cifar10]

The cached sampler runs every generation step once, through all layers, reading
keys/values from per-layer kv-caches (imagetx/model/sampler.py loops over the model's
``decode_step``). It is timed twice: with the eager step, and with the same step compiled
(``imagetx.model.sampler.compile_decoding``; ``--compile-mode reduce-overhead`` on CUDA also
captures it as a CUDA graph). Each is warmed up first on a throw-away cache (the compiled
step compiles there; that time is reported apart), then one whole ``sample`` call is timed.
The uncached one is what T2T and its PyTorch port do: rerun the whole network over the whole
image at every step. Timing all 1024 or 3072 uncached steps would take hours on a CPU, so it
times ``--uncached-steps`` steps and extrapolates linearly (every uncached step costs the
same full forward pass); the script says so in its output (0 skips it).
Weights are random: speed does not depend on them.

Last, what a user of ``imagetx.demo`` waits for: the shipped completion model completing one
val image (the first of ``--data-root``'s val split) 4 times from its top 16 rows, the demo's
defaults: the seconds of that one ``sample(..., prefix=, given_rows=16)`` call, after a
warm-up step (``--completion-ckpt ''`` skips it).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from imagetx import ImageTransformer, build_model, load_model
from imagetx.data.sources import Reader, tensors
from imagetx.model.sampler import compile_decoding, first_input, sample
from imagetx.training.presets import preset_model_config
from scripts.common import sample_uncached, sync, timed


@torch.no_grad()
def warm_up(model: ImageTransformer, step, batch: int, labels, low_res, device) -> float:
    """Seconds of one decoding step on a throw-away cache (the compiled step compiles here)."""
    sync(device)
    start = time.perf_counter()
    step(first_input(model, batch), model.start_decoding(batch, labels, low_res=low_res))
    sync(device)
    return time.perf_counter() - start


COMPLETION_SAMPLES = 4  # the demo's default: samples of one photo
COMPLETION_ROWS = 16  # the demo's default: the top half kept


def completion_seconds(ckpt: str, data_root: str, device: str, dtype: torch.dtype) -> float:
    """Seconds of sampling COMPLETION_SAMPLES completions of the first val image from its top
    COMPLETION_ROWS rows with the model at ``ckpt``, in one batch (warmed up first)."""
    model = load_model(ckpt, map_location=device).to(dtype)
    image = tensors(Reader("cifar10", data_root, download=False).split("val").part(0, 1))[0]
    prefix = image.repeat(COMPLETION_SAMPLES, 1, 1, 1).to(device)
    warm_up(model, model.decode_step, COMPLETION_SAMPLES, None, None, device)
    generator = torch.Generator(device=device).manual_seed(0)
    return timed(lambda: sample(model, COMPLETION_SAMPLES, prefix=prefix, given_rows=COMPLETION_ROWS,
                                generator=generator), device)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quick.yaml", help="preset whose model to build")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode of the compiled step")
    parser.add_argument("--uncached-steps", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", default="bench_sampling.json")
    parser.add_argument("--completion-ckpt", default="pretrained/completion",
                        help="model of the completion figure ('' skips it)")
    parser.add_argument("--data-root", default="../shared/cifar10", help="CIFAR-10 npz shards: the val image")
    return parser


def random_model(args: argparse.Namespace) -> tuple[ImageTransformer, torch.Tensor | None, torch.Tensor | None]:
    """The preset's model with random weights, in eval mode, and the batch's labels and
    low-resolution inputs where it takes them."""
    torch.manual_seed(0)
    config = preset_model_config(args.config)
    model = build_model(config).to(args.device, getattr(torch, args.dtype)).eval()
    labels = torch.arange(args.batch, device=args.device) % config.num_classes if config.num_classes else None
    low_res = None
    if config.superres:
        side = config.superres.low_res_size
        low_res = torch.randint(0, 256, (args.batch, side, side, 3), dtype=torch.uint8, device=args.device)
    return model, labels, low_res


def cached_figures(args: argparse.Namespace, model: ImageTransformer, labels, low_res) -> dict:
    """One whole ``sample`` call with the eager step and with the compiled one, each warmed up first."""

    def sampled(compiled) -> float:
        generator = torch.Generator(device=args.device).manual_seed(0)
        return timed(lambda: sample(model, args.batch, labels, low_res, generator=generator, progress=True,
                                    compiled=compiled), args.device)

    warm_up(model, model.decode_step, args.batch, labels, low_res, args.device)
    eager_seconds = sampled(False)
    compile_seconds = warm_up(model, compile_decoding(model, args.compile_mode), args.batch, labels, low_res,
                              args.device)
    compiled_seconds = sampled(args.compile_mode)
    result = {
        "preset": args.config, "batch": args.batch, "device": args.device, "dtype": args.dtype,
        "generation_steps": model.order.length, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "eager_seconds": eager_seconds, "eager_images_per_sec": args.batch / eager_seconds,
        "compile_mode": args.compile_mode, "compile_seconds": compile_seconds,
        "compiled_seconds": compiled_seconds, "compiled_images_per_sec": args.batch / compiled_seconds,
        "compiled_speedup": eager_seconds / compiled_seconds,
    }
    print(f"model {args.config}: {model.order.length} generation steps, batch {args.batch}, {args.device} "
          f"{args.dtype}, {result['threads']} threads")
    print(f"cached, eager step:    {eager_seconds:8.2f} s for the batch -> "
          f"{result['eager_images_per_sec']:.3f} images/s")
    print(f"cached, compiled step: {compiled_seconds:8.2f} s for the batch -> {result['compiled_images_per_sec']:.3f} "
          f"images/s ({result['compiled_speedup']:.2f}x the eager step; mode {args.compile_mode}, "
          f"compiled in {compile_seconds:.1f} s beforehand)")
    return result


def uncached_figures(args: argparse.Namespace, model: ImageTransformer, labels, low_res, eager_seconds: float) -> dict:
    """``--uncached-steps`` steps of uncached recomputation, extrapolated to every step, and the
    eager cached sampler's speed-up over it."""
    steps = model.order.length
    generator = torch.Generator(device=args.device).manual_seed(0)
    sample_uncached(model, args.batch, labels, low_res, steps=1, generator=generator)  # warm-up
    measured = timed(lambda: sample_uncached(model, args.batch, labels, low_res, steps=args.uncached_steps,
                                             generator=generator), args.device)
    uncached_seconds = measured / args.uncached_steps * steps
    result = dict(uncached_steps_timed=args.uncached_steps, uncached_seconds_measured=measured,
                  uncached_seconds_extrapolated=uncached_seconds,
                  uncached_images_per_sec=args.batch / uncached_seconds,
                  speedup=uncached_seconds / eager_seconds)
    print(f"uncached: {measured:8.1f} s for {args.uncached_steps} steps, extrapolated linearly to {steps} steps: "
          f"{uncached_seconds:.0f} s -> {result['uncached_images_per_sec']:.5f} images/s")
    print(f"speed-up of cached (eager step) sampling: {result['speedup']:.0f}x (target >= 100x: "
          f"{'PASS' if result['speedup'] >= 100 else 'FAIL'})")
    return result


def completion_figures(args: argparse.Namespace) -> dict:
    seconds = completion_seconds(args.completion_ckpt, args.data_root, args.device, getattr(torch, args.dtype))
    print(f"completion ({args.completion_ckpt}, 1 val image x {COMPLETION_SAMPLES} samples, top "
          f"{COMPLETION_ROWS} rows kept): {seconds:8.2f} s of sampling")
    return dict(completion_ckpt=args.completion_ckpt, completion_samples=COMPLETION_SAMPLES,
                completion_rows=COMPLETION_ROWS, completion_seconds=seconds)


def main() -> None:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, labels, low_res = random_model(args)
    result = cached_figures(args, model, labels, low_res)
    if args.uncached_steps:
        result.update(uncached_figures(args, model, labels, low_res, result["eager_seconds"]))
    if args.completion_ckpt:
        result.update(completion_figures(args))
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
