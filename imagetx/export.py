"""``python -m imagetx.export``: a checkpoint as a weights folder to share (io/weights.py).

    python -m imagetx.export --ckpt runs/quick/checkpoints/last.ckpt --out runs/quick/weights [--dtype fp32|bf16]
        [--exact_box_means true|false] [--force]

Writes ``OUT/model.safetensors`` (the network's tensors: opening it runs no code),
``OUT/config.json`` (the model configuration and the format version) and, unless the folder
has one, ``OUT/README.md``, a model card with the Hugging Face Hub's metadata: a weights folder's
own card (a shipped model's), or for a checkpoint the generic card with what training recorded
(steps, data, val bits/dim). A folder that already holds a ``model.safetensors`` or a
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

from jsonargparse import ArgumentParser, Namespace

from .cli.common import check_not_taken, parse, parser_for, run_or_exit
from .cli.shipped import resolve
from .io.atomic import check_writable
from .io.names import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, check_model_path

# --dtype: torch's name of each (torch is imported once the arguments are checked, in ``run``)
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
VAL_BPD = "val/bpd"  # the metric training's ModelCheckpoint monitors (train.py)


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


def files_to_write(out: Path) -> list[Path]:
    """The files export writes into ``out``: the weights, the configuration and, where the folder
    has none, a model card (save_pretrained keeps the one there)."""
    return [out / WEIGHTS_FILE, out / CONFIG_FILE] + ([] if (out / CARD_FILE).exists() else [out / CARD_FILE])


# The Hub's dataset ids of the sources it holds (a folder of one's own images has none).
HUB_DATASETS = {"cifar10": "cifar10", "imagenet": "imagenet-1k"}


def card_for(ckpt: str) -> str:
    """The model card of the exported folder: a weights folder's own card, kept (a shipped model's
    describes it: its results, its data, how it was trained); a checkpoint's says what training
    recorded in it (``training_facts``) below the generic text."""
    from .io.checkpoint import read_checkpoint  # torch: imported once the arguments are checked (run)
    from .io.hub import model_card

    source = Path(resolve(ckpt))
    if source.is_dir():
        own = source / CARD_FILE
        return own.read_text(encoding="utf-8") if own.is_file() else model_card()
    checkpoint = read_checkpoint(source)
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    dataset = HUB_DATASETS.get(data.get("source"))
    return model_card(training_facts(checkpoint), [dataset] if dataset else None)


def training_facts(checkpoint: dict) -> list[str]:
    """What a training checkpoint records of its run, in words: the steps and images trained on, the
    data, and the val bits/dim that its ModelCheckpoint (monitoring val/bpd) last saw and the best."""
    facts = []
    if "global_step" in checkpoint:
        seen = (checkpoint.get("imagetx") or {}).get("images_seen")
        facts.append(f"steps: {checkpoint['global_step']:,}" + (f" ({seen:,} images seen)" if seen else ""))
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if data.get("source"):
        held_out = data.get("val_size")  # None: the source's default; 0: none held out
        facts.append(f"data: {data['source']}" + (f", val: the last {held_out:,} training images" if held_out else ""))
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("monitor") == VAL_BPD:
            for key, words in (("current_score", "val bits/dim at the last validation"),
                               ("best_model_score", "best val bits/dim of the run")):
                if state.get(key) is not None:
                    facts.append(f"{words}: {float(state[key]):.4f}")
            break
    return facts


def check_arguments(args: Namespace) -> None:
    """What can be refused before torch is imported: a --ckpt that does not exist, and files of the
    names export writes already in --out, unless --force (they may be the user's)."""
    check_model_path(resolve(args.ckpt))
    check_not_taken(Path(args.out), [Path(args.out) / WEIGHTS_FILE, Path(args.out) / CONFIG_FILE], args.force)


def run(args: Namespace) -> dict:
    check_arguments(args)
    # here, not above: a bad argument is refused before these (torch, the model) are imported
    import torch

    from .io.hub import save_pretrained
    from .io.load import load_model, with_exact_box_means

    model = load_model(args.ckpt)  # a bad checkpoint is refused before anything is written
    if args.exact_box_means is not None:
        model = with_exact_box_means(model, args.exact_box_means)  # refused as early
    out = check_writable(args.out, "--out")
    files = files_to_write(out)
    card = None if (out / CARD_FILE).exists() else card_for(args.ckpt)  # a card in --out is the user's: kept
    save_pretrained(model.to(getattr(torch, DTYPES[args.dtype])), out, card)
    return {"out": str(out), "files": [str(path) for path in files], "dtype": args.dtype,
            "parameters": sum(p.numel() for p in model.parameters()), "bytes": sum(p.stat().st_size for p in files),
            "exact_box_means": bool(model.config.superres and model.config.superres.exact_box_means),
            "ckpt": str(args.ckpt)}


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "export")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
