"""``python -m imagetx.export``: a checkpoint as a weights folder to share (io/weights.py).

    python -m imagetx.export --ckpt runs/quick/checkpoints/last.ckpt --out runs/quick/weights [--dtype fp32|bf16]
        [--exact_box_means true|false] [--force]

Writes ``OUT/model.safetensors`` (the network's tensors: opening it runs no code),
``OUT/config.json`` (the model configuration and the format version) and, unless the folder
has one, ``OUT/README.md`` (a model card with the Hugging Face Hub's metadata), as
``imagetx.save_pretrained`` does. A folder that already holds a ``model.safetensors`` or a
``config.json`` is refused unless ``--force`` (a README.md there is the user's and is kept), and
the JSON lists the files written, no others. imagetx.evaluate,
imagetx.sample (``--ckpt OUT``) and ``imagetx.load_model`` read the folder as they read the
checkpoint. ``--dtype fp32`` keeps the weights exactly; ``bf16`` halves the file, and the model
loads in float32 from it. ``--exact_box_means true`` exports a super-resolution model (with the
cell remainder input) trained without ``superres.exact_box_means`` with it: the setting has no
tensors, so the weights are the same. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from jsonargparse import ArgumentParser, Namespace

from .cli.common import check_not_taken, parse, parser_for, run_or_exit
from .io.atomic import check_writable
from .io.hub import save_pretrained
from .io.load import load_model, with_exact_box_means
from .io.weights import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("--ckpt", type=str, required=True,
                        help="checkpoint written by imagetx.train (or a weights folder)")
    parser.add_argument("--out", type=str, required=True,
                        help="folder to write model.safetensors, config.json and a model card into")
    parser.add_argument("--dtype", type=Literal[tuple(DTYPES)], default="fp32",
                        help="precision of the stored weights")
    parser.add_argument("--exact_box_means", type=bool | None, default=None,
                        help="set the super-resolution model's superres.exact_box_means in the exported model "
                             "(default: as trained)")
    parser.add_argument("--force", type=bool, nargs="?", const=True, default=False,
                        help="replace a model.safetensors and config.json already in --out (a README.md there is kept)")
    return parser


def files_to_write(out: Path, force: bool) -> list[Path]:
    """The files export writes into ``out``: the weights, the configuration and, where the folder
    has none, a model card (save_pretrained keeps the one there). Files of those names already
    there are refused unless ``force``: they may be the user's."""
    files = [out / WEIGHTS_FILE, out / CONFIG_FILE]
    check_not_taken(out, files, force)
    return files + ([] if (out / CARD_FILE).exists() else [out / CARD_FILE])


def run(args: Namespace) -> dict:
    model = load_model(args.ckpt)  # a bad checkpoint is refused before anything is written
    if args.exact_box_means is not None:
        model = with_exact_box_means(model, args.exact_box_means)  # refused as early
    out = check_writable(args.out, "--out")
    files = files_to_write(out, args.force)
    save_pretrained(model.to(DTYPES[args.dtype]), out)
    return {"out": str(out), "files": [str(path) for path in files], "dtype": args.dtype,
            "parameters": sum(p.numel() for p in model.parameters()), "bytes": sum(p.stat().st_size for p in files),
            "exact_box_means": bool(model.config.superres and model.config.superres.exact_box_means),
            "ckpt": str(args.ckpt)}


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "export")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
