"""What the build options that act on each decoder layer cost on this machine: compiling the whole
network (``--model.compile true``) against compiling the layer once for every layer (``--model.compile
layers``, regional compilation), and recomputing each layer's activations in the backward pass
(``--model.activation_checkpointing true``), for the recipe's network at 14 and 28 layers
(configs/cifar10_recipe.yaml; float32, the SDPA path: the CPU's).

Each cell runs in a fresh process (nothing compiled or cached before it; Inductor's cache in a
fresh folder) and reports the first step's seconds (the compilation, where there is one), the
median of the timed steps, and the peak resident memory the steps added. One line a cell, then one
JSON object (``--json`` writes it too).

    .venv/bin/python -m scripts.bench_layers --json experiments/layer_options.json
    .venv/bin/python -m scripts.bench_layers --layers 14 --cells eager layers --steps 3   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from scripts.common import RESULT_MARKER

PRESET = "configs/cifar10_recipe.yaml"
# compile mode, activation checkpointing
CELLS = {"eager": (False, False), "model": (True, False), "layers": ("layers", False),
         "eager_checkpointed": (False, True), "layers_checkpointed": ("layers", True)}


def worker(spec: dict) -> dict:
    """One cell, in this process: the recipe's network of ``spec['layers']`` layers, built with the
    cell's options, trained for warm-up and timed steps on random images."""
    import torch
    import yaml

    from imagetx.model.config import ModelConfig
    from imagetx.model.scoring import batch_bits_per_dim
    from imagetx.training.module import compile_network, make_optimizer, optimizer_settings
    from imagetx.model.superres import build_model
    from scripts.common import PeakMemory

    torch.set_num_threads(spec["threads"])
    preset = yaml.safe_load(open(PRESET))["model"]
    config = ModelConfig.from_dict({**preset["config"], "n_layers": spec["layers"]})
    compile_mode, checkpointed = CELLS[spec["cell"]]
    torch.manual_seed(0)
    model = build_model(config, "sdpa", activation_checkpointing=checkpointed).train()
    if compile_mode:
        compile_network(model, compile_mode)
    optimizer = make_optimizer(model, **optimizer_settings(preset))
    images = torch.randint(0, 256, (spec["batch"], 32, 32, 3), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(1))

    def step() -> None:
        loss = batch_bits_per_dim(model, {"images": images}, check=False).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    memory = PeakMemory("cpu")
    started = time.perf_counter()
    step()
    first = time.perf_counter() - started
    for _ in range(spec["warmup"]):
        step()
    times = []
    for _ in range(spec["steps"]):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return {**spec, "first_step_s": first, "step_s": statistics.median(times), "steps_timed": len(times),
            "memory": memory.rss_figures(), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[14, 28])
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), default=list(CELLS))
    parser.add_argument("--batch", type=int, default=8, help="images a step (the CPU proxy's)")
    parser.add_argument("--warmup", type=int, default=1, help="steps after the first, untimed")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(RESULT_MARKER + json.dumps(worker(json.loads(args.worker))))
        return
    results = []
    for layers in args.layers:
        for cell in args.cells:
            spec = {"layers": layers, "cell": cell, "batch": args.batch, "warmup": args.warmup,
                    "steps": args.steps, "threads": args.threads}
            with tempfile.TemporaryDirectory() as cache:  # a cold Inductor cache for every cell
                environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                started = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "scripts.bench_layers", "--worker", json.dumps(spec)],
                                      capture_output=True, text=True, env=environment)
                wall = time.perf_counter() - started
            lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
            result = json.loads(lines[-1][len(RESULT_MARKER):]) if lines else \
                {**spec, "error": f"rc={proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-3:])}
            result["process_s"] = wall
            results.append(result)
            print(f"{layers:3d} layers  {cell:20s} " + (result["error"] if "error" in result else
                  f"first step {result['first_step_s']:7.1f} s  step {result['step_s']:6.2f} s  "
                  f"peak RSS +{result['memory']['peak_mib']:6.0f} MiB  process {wall:6.1f} s"), flush=True)
    out = {"preset": PRESET, "results": results}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(out, file, indent=1)


if __name__ == "__main__":
    main()
