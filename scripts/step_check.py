"""The speed check of a preset's training step, as a GPU lease's first call runs it
(ops/README.md, "A lease, call by call"): the step compiled as training compiles it, on random
images, with the figures that say what changed since the last lease.

    python -m scripts.step_check --preset configs/cifar10_dmol_25min.yaml --json step.json
    python -m scripts.step_check --preset configs/cifar10_dmol_25min.yaml --name heads64 \\
        --set attention.n_heads=4 --batch 240          # a candidate: ModelConfig fields, another batch
    python -m scripts.step_check --name blocks32 --flex-block-size 32      # how attention runs

One training step is scripts/bench_worker.py's ``training_step`` (the preset's optimiser; bf16
autocast where the preset trains in bf16), with the network compiled by ``COMPILE_OPTIONS`` of the training module
after its attention patterns are built, as a run does. Reported: images/s (median step), MFU
against the device's dense peak (FLOPs counted by ``imagetx.model.flops``, as the throughput
monitor counts them), peak memory, the compiled graphs and graph breaks (torch._dynamo's
counters), the compilation's seconds, and the costliest kernels of a short profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from scripts.bench_worker import flops_per_image, preset_path, read_preset, training_memory, training_step
from scripts.common import PeakMemory, timed

TOP_KERNELS = 10  # rows of the profile kept: enough to see attention, matmuls and the elementwise tail


def model_overrides(pairs: list[str]) -> dict:
    """``--set key=value`` pairs as ModelConfig fields (a section's dotted: attention.n_heads); values
    read as JSON where they parse (4, true, [16, 16])."""
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --set {pair!r}: expected KEY=VALUE, e.g. attention.n_heads=4")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value  # a plain word: local_1d, rotary
    return fields


def top_kernels(step, device, steps: int = 3) -> list[dict]:
    """The kernels (CUDA) or operators (CPU) that took the most time over ``steps`` steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    cuda = device.type == "cuda"
    events = [e for e in prof.key_averages() if (e.device_time_total if cuda else e.self_cpu_time_total) > 0]
    events.sort(key=lambda e: e.device_time_total if cuda else e.self_cpu_time_total, reverse=True)
    return [{"name": e.key[:120], "calls": e.count,
             "ms_per_step": (e.device_time_total if cuda else e.self_cpu_time_total) / 1e3 / steps}
            for e in events[:TOP_KERNELS]]


def check(preset: str, overrides: dict, batch: int | None, device_name: str, warmup: int, steps: int,
          compile_model: bool, run_options: dict) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from imagetx.model.attention import FLEX_BLOCK_SIZE
    from imagetx.training.module import COMPILE_OPTIONS
    from imagetx.training.presets import preset_model_config
    from imagetx.training.throughput import table_peak

    values = read_preset(preset)
    cfg = preset_model_config(preset_path(preset), overrides)
    batch = batch or values["data"]["batch_size"]
    bf16 = str(values.get("trainer", {}).get("precision", "32")).startswith("bf16")
    device = torch.device(device_name)
    # how attention runs: the preset's model options, then the variant's
    attention = {"kernel": values["model"].get("attention_kernel", "auto"),
                 "flex_block_size": values["model"].get("flex_block_size", FLEX_BLOCK_SIZE)}
    attention.update({key: value for key, value in run_options.items() if value is not None})
    spec = {"preset": preset, "batch": batch, "precision": "bf16" if bf16 else "fp32", **attention}
    model, step, losses = training_step(spec, cfg, device)
    if compile_model:
        model.compile(**COMPILE_OPTIONS)  # in place: ``step`` calls the compiled network

    memory = PeakMemory(device)
    started = time.perf_counter()
    warmup_seconds = [timed(step, device) for _ in range(warmup)]  # the first compiles
    times = [timed(step, device) for _ in range(steps)]
    median = statistics.median(times)
    flops = flops_per_image(model, device)["flops_per_image"]
    peak = table_peak(device, torch.bfloat16 if bf16 else torch.float32)
    result = {
        "preset": preset, "overrides": overrides, **attention, "batch": batch, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "bf16": bf16, "compiled": compile_model,
        "params": sum(p.numel() for p in model.parameters()),
        "first_step_s": warmup_seconds[0] if warmup_seconds else None,
        "warmup_and_steps_s": time.perf_counter() - started, "median_step_s": median,
        "images_per_s": batch / median, "flops_per_image": flops,
        "mfu": None if peak is None else flops * batch / median / peak,
        "compiled_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values()),
        "final_loss_bpd": float(losses[-1].float()),
        **training_memory(memory),
    }
    result["top_kernels"] = top_kernels(step, device)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="configs/cifar10_dmol_25min.yaml", help="a training preset (YAML)")
    parser.add_argument("--name", default="recipe", help="what this variant is called in the JSON")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a ModelConfig field of the variant (repeatable)")
    parser.add_argument("--batch", type=int, default=None, help="images a step (default: the preset's)")
    parser.add_argument("--attention-kernel", default=None, choices=("auto", "flex", "sdpa"),
                        help="how attention runs (default: the preset's model.attention_kernel)")
    parser.add_argument("--flex-block-size", type=int, default=None,
                        help="FlexAttention's tiles: 16, 32, 64 or 128 (default: the preset's)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps, the compiling one first")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (the median is reported)")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="eager, for a quick CPU check")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if not Path(args.preset).is_file():
        raise SystemExit(f"error: --preset {args.preset}: no such file")
    run_options = {"kernel": args.attention_kernel, "flex_block_size": args.flex_block_size}
    result = {"name": args.name, **check(args.preset, model_overrides(args.set), args.batch, args.device,
                                          args.warmup, args.steps, args.compile, run_options)}
    line = (f"{args.name}: {result['images_per_s']:,.0f} images/s at batch {result['batch']}, "
            f"MFU {'-' if result['mfu'] is None else format(result['mfu'], '.1%')}, "
            f"{result['compiled_graphs']} compiled graphs, {result['graph_breaks']} graph breaks, "
            f"first step {result['first_step_s']:.1f} s")
    print(line)
    for kernel in result["top_kernels"]:
        print(f"  {kernel['ms_per_step']:8.2f} ms/step  {kernel['calls']:5d} calls  {kernel['name']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
