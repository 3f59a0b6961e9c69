"""Decoding's memory at the start, on each of several trees (issue 125: "decoding memory at 64×64 as
today"): for the imagenet64 preset's model (64×64, 12 layers, d 512, 1D blocks of 256, one memory
block; random weights, float32, batch 1), the bytes of what the model keeps of its pattern (its
non-persistent buffers under ``layers.0.self_attn``: the blocks, and before issue 125 step 1 each
decoding step's mask table) and of what ``start_decoding`` allocates besides (every tensor of the
decoding cache's self-attention layers), each storage counted once. Each tree in a fresh process through ``PYTHONPATH``.

    .venv/bin/python experiments/decoding_memory.py --trees /tmp/base .
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MEASURE = r"""
import json, sys, torch, imagetx
from imagetx import build_model
from imagetx.training.presets import preset_model_config
assert imagetx.__file__.startswith(sys.argv[1]), imagetx.__file__
model = build_model(preset_model_config(sys.argv[1] + "/configs/imagenet64.yaml")).eval()
def nbytes(tensors, seen):  # each storage once: a cache may hold the pattern's own tensors
    fresh = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors} if tensors else {}
    total = sum(size for pointer, size in fresh.items() if pointer not in seen)
    seen.update(fresh)
    return total
seen = {}
pattern_bytes = nbytes(list(model.layers[0].self_attn.buffers()), seen)
cache = model.start_decoding(1)
cache_bytes = nbytes([t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)], seen)
print(json.dumps({"pattern_mib": pattern_bytes / 2**20, "caches_mib": cache_bytes / 2**20,
                  "cache_steps": int(cache.layers[0].keys.shape[2]), "steps": model.order.length}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", type=Path, required=True)
    results = {}
    for tree in parser.parse_args().trees:
        tree = tree.resolve()
        out = subprocess.run([sys.executable, "-c", MEASURE, str(tree)], env={**os.environ, "PYTHONPATH": str(tree)},
                             cwd=tree, capture_output=True, text=True, check=True)
        results[str(tree)] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[str(tree)]
        print(f"{tree}: pattern {r['pattern_mib']:.2f} MiB, caches {r['caches_mib']:.2f} MiB "
              f"({r['cache_steps']} steps of {r['steps']}), start {r['pattern_mib'] + r['caches_mib']:.2f} MiB")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
