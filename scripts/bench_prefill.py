"""Decode start of a completion: the time and memory of ``ImageTransformer.prefill`` over every
image row but the last (docs/model.md §7), beside a full pass, at each image size, each size in a
fresh process.

    .venv/bin/python -m scripts.bench_prefill [--config configs/imagenet64.yaml] [--sizes 32 64]
                                              [--layers N] [--threads 1] [--json bench_prefill.json]

Each size's model is the preset's (imagenet64: categorical, 1D blocks of 256 sub-pixels and one
memory block) at that image size, random weights, float32, batch 1, on the CPU; ``--layers``
makes it shallower (attention's memory is one layer's at a time, whatever the depth). In its
worker process a full teacher-forced pass runs first (warm: the pattern's blocks built, the
allocator's pools grown); then a full pass and decode start (``start_decoding`` + ``prefill`` of
the given rows) run once each, timed, the resident-set high-water mark reset to the RSS before
each (``scripts.common.reset_peak_rss``): peak RSS growth = ru_maxrss after − RSS before, MiB,
what each adds to the process, as the allocator happens to hand memory back. Then each runs
once more under torch's profiler (``profiled_memory``): the peak of the tensor memory it holds at
once and its largest single allocation, the same from run to run. The full pass is the scale of
what a prefill of almost as many steps must hold (activations linear in the steps); a dense
(t, cache + t) bool mask over a prefill's t steps would be t·(cache + t) bytes, for a kv-cache of
``cache`` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scripts.common import (RESULT_MARKER, PeakMemory, machine_info, reset_peak_rss,
                            run_subprocess, timed)

REPO_ROOT = Path(__file__).resolve().parent.parent


def profiled_memory(run) -> dict:
    """MiB, from torch's profiler over one ``run()``: the peak of the tensor memory allocated during
    it and held at once, and its largest single allocation. Every allocation counts, those an
    operation frees before it returns too (torch's memory timeline, ``torch.profiler._memory_profiler``:
    no public API gives them), and none of the allocator's pools: the same from run to run, where
    the RSS is not."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        run()
    held = peak = largest = 0
    for _, action, _, size in MemoryProfileTimeline(prof._memory_profile()).timeline:  # in time order
        if action == Action.CREATE:
            held, largest = held + size, max(largest, size)
        elif action == Action.DESTROY:
            held -= size
        peak = max(peak, held)
    return {"peak_tensor_mib": peak / 2**20, "largest_allocation_mib": largest / 2**20}


def timed_rss(run) -> tuple[float, dict]:
    """Seconds of ``run()`` and the process's peak RSS growth over it (``PeakMemory.rss_figures``),
    the high-water mark reset first."""
    peak_reset = reset_peak_rss()
    memory = PeakMemory("cpu")
    seconds = timed(run, "cpu")
    return seconds, {**memory.rss_figures(), "peak_reset": peak_reset}


def worker(spec: dict) -> dict:
    """One image size (``spec``): a warm full pass, then a full pass and decode start measured."""
    import torch

    from imagetx import build_model
    from imagetx.model.scoring import full_pass
    from imagetx.training.presets import preset_model_config

    torch.set_num_threads(spec["threads"])
    overrides = {"image_size": spec["size"], **({"n_layers": spec["layers"]} if spec["layers"] else {})}
    config = preset_model_config(spec["config"], overrides)
    torch.manual_seed(0)
    model = build_model(config).eval()
    images = torch.randint(0, 256, (1, spec["size"], spec["size"], 3), dtype=torch.uint8)
    given_rows = spec["size"] - 1
    given = model.targets(images)[:, : int(model.given_steps(given_rows).sum())]  # (1, t)

    def decode_start() -> None:
        model.prefill(given, model.start_decoding(1))

    with torch.no_grad():
        full_pass(model, images)  # warm
        full_pass_seconds, full_pass_rss = timed_rss(lambda: full_pass(model, images))
        prefill_seconds, prefill_rss = timed_rss(decode_start)
        full_pass_profiled = profiled_memory(lambda: full_pass(model, images))
        prefill_profiled = profiled_memory(decode_start)
    length, cache = given.shape[1], model.layers[0].self_attn.index.cache_length
    return {**spec, "pattern": model.pattern.describe(), "n_layers": config.n_layers, "d_model": config.d_model,
            "given_rows": given_rows, "prefill_steps": length, "full_pass_steps": model.order.length,
            "kv_cache_length": cache,
            "dense_mask_mib": length * (cache + length) / 2**20, "full_pass_seconds": full_pass_seconds,
            "full_pass_rss": full_pass_rss, "full_pass_profiled": full_pass_profiled,
            "prefill_seconds": prefill_seconds, "prefill_rss": prefill_rss, "prefill_profiled": prefill_profiled,
            "torch_threads": torch.get_num_threads()}


def peak(rss: dict) -> str:
    lower_bound = " (a lower bound: the mark did not move)" if rss["peak_is_lower_bound"] else ""
    return f"{rss['peak_mib']:.0f} MiB{lower_bound}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/imagenet64.yaml", help="preset whose model to build")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64], help="image sizes, one worker each")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", default="bench_prefill.json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        print(RESULT_MARKER + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    results = []
    for size in args.sizes:
        spec = {"config": args.config, "size": size, "layers": args.layers, "threads": args.threads}
        # A module run from the repository root, as the user runs this script: ``scripts`` imports there.
        result = run_subprocess([sys.executable, "-m", "scripts.bench_prefill", "--worker", json.dumps(spec)], spec,
                                cwd=REPO_ROOT)
        results.append(result)
        if "error" in result:
            print(f"{size}x{size}: {result['error']}")
            continue
        print(f"{size}x{size} {result['pattern']}, {result['n_layers']} layers d={result['d_model']}, kv-cache "
              f"{result['kv_cache_length']} (a dense prefill mask: {result['dense_mask_mib']:.0f} MiB)")
        for name, what in (("prefill", f"prefill, {result['prefill_steps']} steps ({result['given_rows']} rows)"),
                           ("full_pass", f"full pass, {result['full_pass_steps']} steps")):
            profiled = result[f"{name}_profiled"]
            print(f"  {what + ':':32} {result[f'{name}_seconds']:6.2f} s, peak tensor memory "
                  f"{profiled['peak_tensor_mib']:.0f} MiB, largest allocation {profiled['largest_allocation_mib']:.1f} "
                  f"MiB, peak RSS growth {peak(result[f'{name}_rss'])}")
    report = {"command": sys.argv, "machine": machine_info("cpu", args.threads), "results": results}
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
