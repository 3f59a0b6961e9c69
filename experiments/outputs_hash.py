"""Whether a change to the model's code left what models compute as it was, to the bit: the
shipped models' bits/dim of the first 32 val images (every digit), and seeded samples (SHA-256
of the images) of the shipped completion model (a prefill and decoding steps) and of tiny fresh
models under each attention pattern, with and without rotary positions, with their bits/dim of
seeded random images. One line each, then one
JSON object.

Run it on each tree as a file (the imagetx first on ``PYTHONPATH`` is the one read; a worktree of
an older commit through it), and compare the two outputs:

    .venv/bin/python experiments/outputs_hash.py
    PYTHONPATH=/tmp/base .venv/bin/python experiments/outputs_hash.py --tree /tmp/base

One thread, on one machine: the figures are this CPU's floats (another CPU's kernels may round
otherwise), which is what a side-by-side comparison needs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

import imagetx
from imagetx import load_model
from imagetx.model.sampler import sample
from imagetx.model.scoring import evaluate

SHIPPED = ("cifar10_gpu", "completion", "superres", "superres_gpu")
# Tiny fresh models (tests/helpers.py's, seeded): each pattern, and rotary positions under two.
TINY = {"local_1d": {}, "local_2d": {"attention": "local_2d"}, "full": {"attention": "full"},
        "local_1d_rotary": {"relative_positions": "rotary"},
        "local_2d_rotary": {"attention": "local_2d", "relative_positions": "rotary"}}


def images_hash(images: torch.Tensor) -> str:
    return hashlib.sha256(images.numpy().tobytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the repository whose shipped models and tests/helpers.py are read (the one imported)")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/cifar10"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.append(str(args.tree / "tests"))
    from helpers import tiny_model

    shards = sorted(args.data_root.glob("train-*.npz"))
    val = {key: np.concatenate([np.load(shard)[key] for shard in shards])[-5000:][:32] for key in ("images", "labels")}
    images, labels = torch.from_numpy(val["images"]), torch.from_numpy(val["labels"]).long()
    result = {"imagetx": imagetx.__file__, "bits_per_dim": {}, "samples": {}}
    for name in SHIPPED:
        model = load_model(args.tree / "pretrained" / name)
        scored = evaluate(model, images, labels if model.config.num_classes else None, batch_size=32, progress=False)
        result["bits_per_dim"][name] = repr(scored["bpd"])
    completion = load_model(args.tree / "pretrained" / "completion")
    drawn = sample(completion, 2, prefix=images[:2], given_rows=28, generator=torch.Generator().manual_seed(0))
    result["samples"]["completion"] = images_hash(drawn)
    for name, fields in TINY.items():
        model = tiny_model(seed=1, **fields)
        drawn = sample(model, 2, generator=torch.Generator().manual_seed(0))
        result["samples"][f"tiny_{name}"] = images_hash(drawn)
        # the samples of a fresh tiny model are near-uniform draws that a small change of its logits
        # rarely flips (with and without rotary positions they hash alike): its bits/dim, every digit, too
        with torch.no_grad():
            scored = model.bits_per_dim(torch.randint(0, 256, (4, *drawn.shape[1:]), dtype=torch.uint8,
                                                      generator=torch.Generator().manual_seed(0)))
        result["bits_per_dim"][f"tiny_{name}"] = repr(scored.double().mean().item())
    for kind in ("bits_per_dim", "samples"):
        for name, value in result[kind].items():
            print(f"{kind:12s} {name:24s} {value}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
