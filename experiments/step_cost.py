"""Seconds per training step of preset variants, to turn step budgets into time budgets.

    .venv/bin/python -m experiments.step_cost --config configs/quick.yaml \
        --variant base --variant "rows4 model.config.attention.query_block_length=128" [--steps 40] [--json out.json]

Each ``--variant`` is a name followed by ``key=value`` overrides of the YAML (dotted keys,
values read as YAML). A step is what training does: forward, loss, backward, gradient
clipping and the preset's optimiser update (a super-resolution model reads the 8×8 box mean
of each image), at the preset's ``data.batch_size``, on random images (the
cost does not depend on the pixels). Variants are timed in turns (round-robin, after a
warm-up), so a change in the machine's speed spreads over all of them; the median is
reported. Meant for an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import yaml

from experiments.json_result import emit
from imagetx import build_model, ModelConfig
from imagetx.model.scoring import batch_bits_per_dim
from imagetx.training.module import make_optimizer, optimizer_settings
from imagetx.training.presets import read_preset, set_dotted


def build(preset: dict, overrides: list[str]):
    preset = yaml.safe_load(yaml.safe_dump(preset))  # a deep copy
    for item in overrides:
        key, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"override {item!r} is not key=value")
        set_dotted(preset, key, yaml.safe_load(value))
    model = build_model(ModelConfig.from_dict(preset["model"]["config"]))
    settings = preset["model"]
    optimizer = make_optimizer(model, **optimizer_settings(settings))
    batch = preset["data"]["batch_size"]
    return model, optimizer, batch


def one_step(model, optimizer, images) -> None:
    optimizer.zero_grad(set_to_none=True)
    batch_bits_per_dim(model, {"images": images}).mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a training preset (YAML)")
    parser.add_argument("--variant", action="append", required=True, help="'NAME key=value ...'")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    preset = read_preset(args.config)
    variants = {}
    for text in args.variant:
        name, *overrides = text.split()
        try:
            variants[name] = build(preset, overrides)
        except (ValueError, TypeError) as error:
            parser.error(f"--variant {name!r}: {error}")
    gen = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.warmup + args.steps):
        for name, (model, optimizer, batch) in variants.items():
            size = model.config.image_size
            images = torch.randint(0, 256, (batch, size, size, 3), generator=gen, dtype=torch.uint8)
            start = time.perf_counter()
            one_step(model, optimizer, images)
            if round_ >= args.warmup:
                times[name].append(time.perf_counter() - start)
    results = {name: {"seconds_per_step": statistics.median(t), "batch": variants[name][2],
                      "threads": torch.get_num_threads()} for name, t in times.items()}
    base = next(iter(results.values()))["seconds_per_step"]
    for name, r in results.items():
        print(f"{name:24s} {1000 * r['seconds_per_step']:8.1f} ms/step  {r['seconds_per_step'] / base:5.2f}x")
    emit({"config": args.config, "variants": results}, args.json)


if __name__ == "__main__":
    main()
