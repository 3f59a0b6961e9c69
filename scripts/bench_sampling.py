"""Cached sampling against uncached full recomputation: images/s, same model, batch, machine, run.

    .venv/bin/python -m scripts.bench_sampling [--config configs/quick.yaml] [--batch 16]
                                               [--uncached-steps 8] [--json bench_sampling.json]

The cached sampler runs every generation step once, through all layers, reading
keys/values from per-layer ring buffers (imagetx/sampler.py loops over the model's
``decode_step``). The uncached one is
what T2T and its PyTorch port do: rerun the whole network over the whole image at
every step. Timing all 1024 or 3072 uncached steps would take hours on a CPU, so it
times ``--uncached-steps`` steps and extrapolates linearly (every uncached step
costs the same full forward pass); the script says so in its output.
Weights are random: speed does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
import yaml

from imagetx import ImageTransformer, ModelConfig
from imagetx.sampler import sample, sample_uncached
from scripts.common import timed


def model_from_preset(path: str) -> ModelConfig:
    values = yaml.safe_load(Path(path).read_text())["model"]["config"]
    return ModelConfig.from_dict(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quick.yaml", help="preset whose model to build")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--uncached-steps", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--json", default="bench_sampling.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = model_from_preset(args.config)
    model = ImageTransformer(config).to(args.device, getattr(torch, args.dtype)).eval()
    labels = torch.arange(args.batch, device=args.device) % config.num_classes if config.num_classes else None
    low_res = None
    if config.encoder_layers:
        side = config.low_res_size
        low_res = torch.randint(0, 256, (args.batch, side, side, 3), dtype=torch.uint8, device=args.device)
    steps = model.order.length

    generator = torch.Generator(device=args.device).manual_seed(0)
    cached_seconds = timed(lambda: sample(model, args.batch, labels, low_res, generator=generator, progress=True),
                           args.device)

    sample_uncached(model, args.batch, labels, low_res, steps=1, generator=generator)  # warm-up
    measured = timed(lambda: sample_uncached(model, args.batch, labels, low_res, steps=args.uncached_steps,
                                             generator=generator), args.device)
    uncached_seconds = measured / args.uncached_steps * steps

    result = {
        "preset": args.config, "batch": args.batch, "device": args.device, "dtype": args.dtype,
        "generation_steps": steps, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cached_seconds": cached_seconds, "cached_images_per_sec": args.batch / cached_seconds,
        "uncached_steps_timed": args.uncached_steps, "uncached_seconds_measured": measured,
        "uncached_seconds_extrapolated": uncached_seconds,
        "uncached_images_per_sec": args.batch / uncached_seconds,
        "speedup": uncached_seconds / cached_seconds,
    }
    print(f"model {args.config}: {steps} generation steps, batch {args.batch}, {args.device} {args.dtype}")
    print(f"cached:   {cached_seconds:8.1f} s for the batch  -> {result['cached_images_per_sec']:.3f} images/s")
    print(f"uncached: {measured:8.1f} s for {args.uncached_steps} steps, extrapolated linearly to {steps} steps: "
          f"{uncached_seconds:.0f} s -> {result['uncached_images_per_sec']:.5f} images/s")
    print(f"speed-up of cached sampling: {result['speedup']:.0f}x (target >= 100x: "
          f"{'PASS' if result['speedup'] >= 100 else 'FAIL'})")
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
