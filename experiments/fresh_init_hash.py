"""Whether a change to the model's code left freshly built models as they were: the SHA-256 of a
seeded model's ``state_dict`` (every name, in order, with its values) for a few configurations,
one per line, then one JSON object.

Run it on the tree to compare with, from the repository root (the imagetx imported is the one
first on the path, so a worktree of an older commit is read through ``PYTHONPATH``):

    .venv/bin/python experiments/fresh_init_hash.py
    PYTHONPATH=/tmp/base .venv/bin/python experiments/fresh_init_hash.py   # a worktree of the older commit

Equal hashes: same parameter names, registration order and seeded initial values, so checkpoints,
continuations (whose optimiser state is matched by order) and seeded runs read as before. The second
hash, of the values alone in order, is equal where only names changed (read as today's by
``imagetx.io.older``): the same draws, the same order, so the optimiser's state still matches.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch

import imagetx
from imagetx import ModelConfig

# Decoder-only, and super-resolution with each reading of the encoder: the parts a refactoring of
# the network moves.
BASE = dict(image_size=8, n_layers=2, d_model=32, n_heads=2, d_filter=64, query_block_length=8, head="dmol")
CONFIGS = {
    "decoder": {},
    "superres_cell_add_bounded": dict(encoder_layers=1, low_res_size=4, low_res_reading="cell_add",
                                      cell_remainder_input=True, exact_box_means=True, low_res_zero_start=True),
    "superres_cross_attention_post_norm": dict(encoder_layers=1, low_res_size=4, low_res_reading="cross_attention",
                                               norm="post"),
}


def one_level_reader():
    try:
        from imagetx.io.older import model_config
    except ImportError:
        return ModelConfig.from_dict
    return model_config


def state_hash(fields: dict, seed: int) -> tuple[str, str, int]:
    """(SHA-256 of the seeded model's state_dict, of its values alone in order, its number of tensors)."""
    torch.manual_seed(seed)
    # Trees before build_model built every model with ImageTransformer(config); trees since issue 94
    # read the one-level form (which every tree reads) in imagetx.io.older, before it in from_dict.
    build = getattr(imagetx, "build_model", imagetx.ImageTransformer)
    state = build(one_level_reader()({**BASE, **fields})).state_dict()
    digest, values = hashlib.sha256(), hashlib.sha256()
    for name, value in state.items():
        digest.update(name.encode())
        digest.update(value.detach().contiguous().numpy().tobytes())
        values.update(value.detach().contiguous().numpy().tobytes())
    return digest.hexdigest(), values.hexdigest(), len(state)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = {"imagetx": imagetx.__file__, "seed": args.seed, "hashes": {}, "value_hashes": {}}
    for name, fields in CONFIGS.items():
        digest, values, tensors = state_hash(fields, args.seed)
        result["hashes"][name], result["value_hashes"][name] = digest, values
        print(f"{name:36s} {digest[:16]}  values {values[:16]}  ({tensors} tensors)")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
