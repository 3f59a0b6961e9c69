"""``python -m imagetx.export``: a checkpoint as a weights folder to share (weights.py).

    python -m imagetx.export --ckpt runs/quick/checkpoints/last.ckpt --out quick-weights [--dtype fp32|bf16]

Writes ``OUT/model.safetensors`` (the network's tensors: opening it runs no code) and
``OUT/config.json`` (the model configuration and the format version). imagetx.evaluate,
imagetx.sample (``--ckpt OUT``) and ``imagetx.load_model`` read the folder as they read the
checkpoint. ``--dtype fp32`` keeps the weights exactly; ``bf16`` halves the file, and the model
loads in float32 from it. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
from typing import Literal

import torch
from jsonargparse import ArgumentParser, Namespace

from .io.atomic import check_writable
from .cli.common import parse, parser_for, run_or_exit
from .io.weights import CONFIG_FILE, WEIGHTS_FILE, load_model, save_pretrained

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("--ckpt", type=str, required=True,
                        help="checkpoint written by imagetx.train (or a weights folder)")
    parser.add_argument("--out", type=str, required=True, help="folder to write model.safetensors and config.json into")
    parser.add_argument("--dtype", type=Literal[tuple(DTYPES)], default="fp32",
                        help="precision of the stored weights")
    return parser


def run(args: Namespace) -> dict:
    model = load_model(args.ckpt)  # a bad checkpoint is refused before anything is written
    out = check_writable(args.out, "--out")
    save_pretrained(model, out, DTYPES[args.dtype])
    files = [out / WEIGHTS_FILE, out / CONFIG_FILE]
    return {"out": str(out), "files": [str(path) for path in files], "dtype": args.dtype,
            "parameters": sum(p.numel() for p in model.parameters()), "bytes": sum(p.stat().st_size for p in files),
            "ckpt": str(args.ckpt)}


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "export")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
