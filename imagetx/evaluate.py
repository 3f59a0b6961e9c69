"""``python -m imagetx.evaluate``: bits/dim of a checkpoint on a data split (docs/model.md §5, §6).

    python -m imagetx.evaluate --ckpt runs/quick/checkpoints/last.ckpt [--data.root DIR]
                               [--data.source cifar10|imagenet|folder] [--split test|val|train]
                               [--task likelihood|complete --rows K] [--limit N] [--batch_size N] [--config FILE]

Bits/dim is the total negative log-likelihood over every image of the split (no
dropped last batch) divided by (images · dimensions · ln 2). ``--task complete``
scores only the sub-pixels below the first K rows, given those rows (completion);
for a super-resolution checkpoint the score is of the 32×32 image given its 8×8
input. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import math
import time
from typing import Literal

import torch
from jsonargparse import ArgumentParser, Namespace
from tqdm.auto import tqdm

from .checkpoint import check_device, load_model
from .cli import add_data_arguments, data_reader, parse, parser_for, run_or_exit
from .lit import model_inputs
from .model import ImageTransformer
from .sources import SPLITS, check_fits, tensors


def completion_steps(model: ImageTransformer, rows: int) -> torch.Tensor:
    """(T,) bool: the steps scored when the first ``rows`` image rows are given."""
    cfg = model.config
    if not 0 <= rows < cfg.image_size:
        raise ValueError(f"--rows {rows} is invalid: give 0..{cfg.image_size - 1} rows")
    if cfg.attention == "local_2d" and rows % cfg.query_block_shape[0]:
        raise ValueError(f"--rows {rows}: with 2D blocks of height {cfg.query_block_shape[0]} the given rows "
                         "must be a whole number of block rows to come first in generation order")
    return model.step_rows >= rows


@torch.no_grad()
def evaluate(model: ImageTransformer, images: torch.Tensor, labels: torch.Tensor | None, batch_size: int = 32,
             rows: int = 0, progress: bool = True) -> dict[str, float]:
    """Bits/dim over all ``images`` (N, H, W, 3); with ``rows`` > 0, of the part below them.
    ``labels``: for a class-conditional model (None for unlabelled images)."""
    device = next(model.parameters()).device
    scored = completion_steps(model, rows).to(device)
    dims = model.config.dims_per_image * (model.config.image_size - rows) // model.config.image_size
    total_nats = 0.0
    batches = range(0, len(images), batch_size)
    for start in tqdm(batches, desc="evaluating", unit="batch", disable=not progress):
        batch = {"images": images[start : start + batch_size].to(device)}
        if labels is not None:
            batch["labels"] = labels[start : start + batch_size].to(device)
        log_p = model.log_prob(*model_inputs(model.config, batch))  # (B, T)
        total_nats -= float(log_p[:, scored].double().sum())
    count = len(images)
    return {"bpd": total_nats / (count * dims * math.log(2)), "images": count,
            "nats_per_image": total_nats / count, "dims_per_image": dims}


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("--ckpt", type=str, required=True, help="checkpoint written by imagetx.train or save_model")
    add_data_arguments(parser)
    parser.add_argument("--split", type=Literal[SPLITS], default="test",
                        help="test: the official held-out images (ImageNet: its validation set); a folder has none")
    parser.add_argument("--task", type=Literal["likelihood", "complete"], default="likelihood")
    parser.add_argument("--rows", type=int, default=16, help="with --task complete: rows given")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--limit", type=int | None, default=None, help="only the first N images of the split")
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def run(args: Namespace) -> dict:
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise ValueError("--batch_size and --limit must be positive")
    check_device(args.device)
    model = load_model(args.ckpt, map_location=args.device)
    data = data_reader(args, model.config.image_size).split(args.split)
    check_fits(data, model.config, checkpoint=True)
    images, labels = tensors(data.part(None, args.limit))  # limit None: all of them
    rows = args.rows if args.task == "complete" else 0
    started = time.perf_counter()
    result = evaluate(model, images, labels, args.batch_size, rows)
    result.update(split=args.split, task=args.task, rows=rows, ckpt=str(args.ckpt),
                  seconds=round(time.perf_counter() - started, 2))
    return result


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "evaluate")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
