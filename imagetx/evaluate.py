"""``python -m imagetx.evaluate``: bits/dim of a checkpoint on a data split (docs/model.md §5, §6).

    python -m imagetx.evaluate --ckpt runs/quick/checkpoints/last.ckpt|WEIGHTS_DIR [--data.root DIR]
                               [--data.source cifar10|imagenet|folder] [--split val|test|train]
                               [--task likelihood|complete --rows K] [--limit N] [--batch_size N] [--config FILE]

Bits/dim is the total negative log-likelihood over every image of the split (no
dropped last batch) divided by (images · dimensions · ln 2), each image scored as
training's validation scores it (``model.scoring``). ``--task complete``
scores only the sub-pixels below the first K rows, given those rows (completion);
for a super-resolution checkpoint the score is of the 32×32 image given its 8×8
input. The last line printed is one JSON object.
"""

from __future__ import annotations

import json
import time
from typing import Literal

import torch
from jsonargparse import ArgumentParser, Namespace

from .cli.shipped import resolve
from .cli.common import check_device, check_given_rows, parse, parser_for, run_or_exit
from .cli.data_options import add_data_arguments, add_split_argument, data_reader
from .codec.bits_map import MAP_IMAGES, write_bits_maps
from .data.sources import check_fits, tensors
from .errors import UserError
from .io.load import load_model
from .model.scoring import evaluate


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("--ckpt", type=str, required=True,
                        help="checkpoint written by imagetx.train, or a weights folder (imagetx.export)")
    add_data_arguments(parser)
    add_split_argument(parser)
    parser.add_argument("--task", type=Literal["likelihood", "complete"], default="likelihood",
                        help="likelihood: bits/dim of whole images; complete: of the rows below --rows, given those")
    parser.add_argument("--rows", type=int, default=16, help="with --task complete: rows given")
    parser.add_argument("--batch_size", type=int, default=32, help="images scored at once (memory, not the result)")
    parser.add_argument("--limit", type=int | None, default=None, help="only the first N images of the split")
    parser.add_argument("--bits_map", type=str | None, default=None,
                        help=f"a folder: the first {MAP_IMAGES} images beside the bits each pixel costs (PNGs)")
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N: cuda where this machine has a GPU, else cpu")
    return parser


def run(args: Namespace) -> dict:
    if args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise UserError("--batch_size and --limit must be positive")
    check_device(args.device)
    model = load_model(resolve(args.ckpt), map_location=args.device)  # pretrained/...: also from an installed wheel
    cfg = model.config
    rows = args.rows if args.task == "complete" else 0
    check_given_rows(rows, cfg.image_size)
    model.given_steps(rows)  # the rule for rows in 2D blocks, checked before the data is read
    data = data_reader(args, cfg.image_size).split(args.split)
    check_fits(data, cfg.image_size, cfg.num_classes, checkpoint=True)
    images, labels = tensors(data.part(None, args.limit))  # limit None: all of them
    started = time.perf_counter()
    result = evaluate(model, images, labels, args.batch_size, rows)
    result.update(split=args.split, task=args.task, rows=rows, ckpt=str(args.ckpt),
                  seconds=round(time.perf_counter() - started, 2))
    if args.bits_map:  # every pixel's bits, whatever --task scored (docs/compress.md)
        maps = write_bits_maps(model, images[:MAP_IMAGES], None if labels is None else labels[:MAP_IMAGES],
                               args.bits_map)
        result["bits_maps"] = [str(path) for path in maps]
    return result


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "evaluate")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
