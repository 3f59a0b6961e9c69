"""``python -m imagetx.sample``: image grids from a checkpoint (docs/model.md §6, §7).

    python -m imagetx.sample --ckpt CKPT --task generate [--count 16] [--label 3] [--transform rot90]
    python -m imagetx.sample --ckpt CKPT --task complete [--rows 16] [--images a.png b.jpg]
    python -m imagetx.sample --ckpt CKPT --task superres [--temperatures 0.8 0.9 1.0]

CKPT: a checkpoint written by imagetx.train, or a weights folder (imagetx.export).
Grids (PNG, one row per input, enlarged ``--scale`` times with nearest neighbours: 4 by default,
1 for the raw pixels):
* generate: the samples;
* complete: given prefix (rest grey) | samples | original;
* superres: nearest-upsampled 8×8 input | one sample per temperature | original.
Every sample of every input is drawn in one batch (a completion's given rows in one pass).
Inputs come from a data split (``--data.source``, ``--data.root``, ``--split``) or from image files
of any size, prepared as the folder conversion prepares a training image (``--data.crop``,
``--data.resize``; what was done is printed; files too large, not images or damaged are refused
with the reason, ``imagetx.data.images.read_picture``). A JSON summary (files, seconds, seconds
of sampling, images/s) is written beside the grids and printed as the last line. Each task writes
``OUT/<task>.png`` and ``OUT/<task>.json``; where those exist already the command refuses before any
work unless ``--force`` (then they are replaced): an earlier grid is never lost silently.
A class-conditional model draws every class in turn (generate, user images), the inputs' own
classes (data), or the one ``--label`` names, by number or by the data's name for it (cli/classes.py);
a line on stderr says which. A model trained with distribution augmentation (``num_transforms``) samples
the identity's distribution, or with ``--transform NAME`` (or id; data/transforms.py) a transformed one, its
inputs (complete, superres) transformed first. Settings can also come from a YAML file: ``--config FILE``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Literal

import torch
from jsonargparse import ArgumentParser, Namespace

from .cli.shipped import resolve
from .cli.common import Number, check_device, check_given_rows, check_not_taken, parse, parser_for, run_or_exit
from .cli.classes import class_names, class_number, described
from .cli.data_options import add_data_arguments, add_split_argument, data_reader
from .data.sources import check_fits, tensors
from .data.transforms import apply, name, parse_transform
from .errors import UserError, shown
from .io.atomic import check_writable
from .data.images import GRID_SCALE, load_image_file, save_grid, upsample_nearest
from .io.load import load_model
from .model.config import ModelConfig
from .model.heads import check_temperature
from .model.sampler import sample
from .model.superres import downsample_area
from .model.transformer import AutoregressiveModel, check_labels

IMAGES_PER_ROW = 8
GREY = 128  # fills the part of a completion's input that the model is not shown


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("--ckpt", type=str, required=True,
                        help="checkpoint written by imagetx.train, or a weights folder (imagetx.export)")
    parser.add_argument("--task", type=Literal["generate", "complete", "superres"], default="generate",
                        help="generate from scratch, complete the bottom of inputs, or upsample inputs' 8x8 versions")
    parser.add_argument("--count", type=int, default=8, help="images to generate, or inputs to complete/upsample")
    parser.add_argument("--samples", type=int, default=3, help="samples per input (complete)")
    parser.add_argument("--label", type=int | str | None, default=None,
                        help="class for every image (class-conditional models): a number, or a name of the data's "
                             "(CIFAR-10's, or a folder's sub-folders with --data.source folder); without it, "
                             "generate draws every class in turn and inputs from data keep their own classes")
    parser.add_argument("--transform", type=int | str | None, default=None,
                        help="a model trained with distribution augmentation: sample the distribution of a transform, "
                             "by name (rot90, transpose, bgr, rot90+gbr, ...) or id 0..47 (default: the identity); "
                             "inputs (complete, superres) are transformed first")
    parser.add_argument("--rows", type=int, default=16, help="rows given for completion")
    parser.add_argument("--temperature", type=Number, default=1.0,
                        help="1: the model's own distribution; lower: plainer, more likely values; 0: the most likely")
    parser.add_argument("--temperatures", type=Number, nargs="+", default=[0.8, 0.9, 1.0], help="for superres")
    parser.add_argument("--seed", type=int, default=0, help="the same seed draws the same samples")
    parser.add_argument("--out", type=str, default="samples",
                        help="output directory: OUT/<task>.png and OUT/<task>.json are written there")
    parser.add_argument("--force", type=bool, nargs="?", const=True, default=False,
                        help="replace the <task>.png and <task>.json an earlier run left in --out (else refused)")
    parser.add_argument("--scale", type=int, default=GRID_SCALE,
                        help="grids enlarged this many times with nearest neighbours (1: the raw pixels)")
    parser.add_argument("--images", type=str, nargs="+", default=None,
                        help="your own image files as inputs, prepared by --data.crop and --data.resize")
    add_data_arguments(parser)
    add_split_argument(parser)
    parser.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N: cuda where this machine has a GPU, else cpu")
    return parser


def check_arguments(args: Namespace) -> None:
    """What can be refused before the model is read: counts, scale, temperatures."""
    for option, value in (("--count", args.count), ("--samples", args.samples)):
        if value < 1:
            raise UserError(f"{option} {value} is invalid: give 1 or more")
    if args.scale < 1:
        raise UserError(f"--scale {args.scale} is invalid: enlarge the grids 1 (the raw pixels) or more times")
    for temperature in [args.temperature, *args.temperatures]:
        check_temperature(temperature)


def check_request(args: Namespace, model: AutoregressiveModel, label: int | None) -> None:
    """What the model must be able to serve: rows, ``label`` (--label as a number), the task."""
    cfg = model.config
    if args.task == "complete":
        check_given_rows(args.rows, cfg.image_size)
        model.given_steps(args.rows)  # the rule for rows in 2D blocks, checked before any sampling
    if label is not None:  # without --label a class-conditional model draws every class in turn
        check_labels(torch.tensor([label]), 1, cfg.num_classes, name="--label")
    if args.task == "superres" and not cfg.superres:
        raise UserError("--task superres needs a super-resolution checkpoint (a superres section)")
    if args.task != "superres" and cfg.superres:
        raise UserError("this is a super-resolution checkpoint: use --task superres")


def load_inputs(args: Namespace, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, size, size, 3) uint8 inputs and their labels (None for user files and unlabelled data)."""
    size = config.image_size
    if args.images:
        loaded = [load_image_file(path, size, args.data.crop, args.data.resize) for path in args.images]
        for _, note in loaded:
            print(f"input {shown(note)}", file=sys.stderr)  # a file's name, a stranger's text
        return torch.stack([image for image, _ in loaded]), None
    data = data_reader(args, size).split(args.split).part(None, args.count)
    # with --label every image gets that class: the data's labels, if any, are not read
    check_fits(data, size, config.num_classes if args.label is None else None, checkpoint=True)
    return tensors(data)


def labels_for(model: AutoregressiveModel, count: int, label: int | None,
               given: torch.Tensor | None = None) -> torch.Tensor | None:
    """The class of each of ``count`` images for a class-conditional model (None for any other):
    ``label`` for all; else ``given``, the inputs' own labels; else every class in turn."""
    classes = model.config.num_classes
    if not classes:
        return None
    if label is not None:
        return torch.full((count,), label, dtype=torch.long)
    if given is not None:
        return given.long()
    return torch.arange(count) % classes


def say_classes(labels: torch.Tensor | None, label: int | None, given: torch.Tensor | None,
                names: list[str] | None) -> None:
    """One line on stderr for a class-conditional model: which classes the images are drawn in and why."""
    if labels is None:
        return
    said = described(labels.tolist(), names)
    if label is not None:
        print(f"classes: {said} (--label)", file=sys.stderr)
    elif given is not None:
        print(f"classes: the inputs' own ({said}); --label N or NAME gives every image one class", file=sys.stderr)
    else:
        print(f"classes: every class in turn ({said}); --label N or NAME gives every image one class",
              file=sys.stderr)


def given_part(inputs: torch.Tensor, rows: int) -> torch.Tensor:
    """What a completion is shown of ``inputs`` (N, H, W, 3): the first ``rows`` rows, the rest grey."""
    kept = inputs.clone()
    kept[:, rows:] = GREY
    return kept


def each_repeated(tensor: torch.Tensor | None, times: int) -> torch.Tensor | None:
    """(N, ...) -> (N·times, ...), each item ``times`` times in a row: the batch of all samples of
    all inputs, sample j of input i at i·times + j."""
    return None if tensor is None else tensor.repeat_interleave(times, dim=0)


def run(args: Namespace) -> dict:
    check_arguments(args)
    grid_file, summary_file = Path(args.out) / f"{args.task}.png", Path(args.out) / f"{args.task}.json"
    check_not_taken(Path(args.out), [grid_file, summary_file], args.force)  # before the model loads
    check_device(args.device)
    model = load_model(resolve(args.ckpt), map_location=args.device)  # pretrained/...: also from an installed wheel
    cfg = model.config
    names = class_names(args.data.source, args.data.root, cfg.num_classes) if cfg.num_classes else None
    label = None if args.label is None else class_number(str(args.label), names, cfg.num_classes)
    check_request(args, model, label)
    transform = None if args.transform is None else chosen_transform(str(args.transform), cfg.num_transforms)
    # the inputs before --out is made: data that is not there leaves no empty --out folder behind
    inputs, given_labels = (None, None) if args.task == "generate" else load_inputs(args, cfg)
    if transform is not None and inputs is not None:
        inputs = torch.stack([apply(image, transform) for image in inputs])
    check_writable(args.out, "--out")
    device = args.device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    started, produced, grids = time.perf_counter(), 0, []

    if args.task == "generate":
        labels = labels_for(model, args.count, label, None)
        say_classes(labels, label, None, names)
        sampling_started = time.perf_counter()
        images = sample(model, args.count, _to(labels, device), temperature=args.temperature,
                        generator=generator, progress=True, transforms=transform_ids(transform, args.count, device))
        sampling_seconds = time.perf_counter() - sampling_started
        produced = args.count
        grids.append(save_grid(list(images.split(IMAGES_PER_ROW)), grid_file, args.scale))
    else:
        count = len(inputs)
        labels = labels_for(model, count, label, given_labels)
        say_classes(labels, label, given_labels, names)
        sampling_started = time.perf_counter()
        if args.task == "complete":
            per_input = args.samples
            drawn = sample(model, count * per_input, _to(each_repeated(labels, per_input), device),
                           temperature=args.temperature, prefix=each_repeated(inputs, per_input).to(device),
                           given_rows=args.rows, generator=generator, progress=True,
                           transforms=transform_ids(transform, count * per_input, device)).cpu()
            first_column = given_part(inputs, args.rows)
        else:
            per_input = len(args.temperatures)
            low_res = downsample_area(inputs, cfg.superres.low_res_size)
            drawn = sample(model, count * per_input, _to(each_repeated(labels, per_input), device),
                           each_repeated(low_res, per_input).to(device), args.temperatures * count,
                           generator=generator, progress=True,
                           transforms=transform_ids(transform, count * per_input, device)).cpu()
            first_column = upsample_nearest(low_res, cfg.image_size)
        sampling_seconds = time.perf_counter() - sampling_started
        produced = count * per_input
        drawn = drawn.view(count, per_input, *drawn.shape[1:])
        rows = [torch.cat([first_column[i : i + 1], drawn[i], inputs[i : i + 1]]) for i in range(count)]
        grids.append(save_grid(rows, grid_file, args.scale))

    seconds = time.perf_counter() - started
    summary = {"task": args.task, "files": [str(p) for p in grids], "images": produced,
               "seconds": round(seconds, 2), "sampling_seconds": round(sampling_seconds, 2),
               "images_per_sec": round(produced / seconds, 3),
               "temperature": args.temperature if args.task != "superres" else args.temperatures,
               "seed": args.seed, "ckpt": str(args.ckpt)}
    if transform is not None:
        summary["transform"] = name(transform)
    if labels is not None:
        summary["labels"] = labels.tolist()
        if names:
            summary["classes"] = names
    summary_file.write_text(json.dumps(summary, indent=2))
    return summary


def chosen_transform(given: str, num_transforms: int) -> int:
    """``--transform``'s id, for a model that embeds it; refused in one line otherwise."""
    if not num_transforms:
        raise UserError(f"--transform {given} given, but this model was trained without distribution augmentation "
                        "(num_transforms=0): drop --transform")
    transform = parse_transform(given)
    if transform >= num_transforms:
        raise UserError(f"--transform {given} is id {transform}; this model embeds ids 0..{num_transforms - 1}")
    return transform


def transform_ids(transform: int | None, count: int, device: str) -> torch.Tensor | None:
    """(count,) ``transform`` for every image, or None (the identity) without --transform."""
    return None if transform is None else torch.full((count,), transform, dtype=torch.long, device=device)


def _to(tensor: torch.Tensor | None, device: str) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def main(argv: list[str] | None = None) -> None:
    summary = run_or_exit(lambda: run(parse(build_parser(), argv, "sample")))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
