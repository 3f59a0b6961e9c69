"""``python -m imagetx.compress``: images into one losslessly compressed file, coded with a
model (docs/compress.md); ``python -m imagetx.decompress`` gives them back exactly.

    python -m imagetx.compress --ckpt pretrained/completion --out images.itx INPUT [INPUT ...]
                               [--batch N] [--threads 1] [--portable true] [--force]

INPUT: pictures (PNG, a JPEG's decoded pixels, GIF, BMP, WebP), npz files with an array
``images`` (N, H, W, 3) uint8, or folders of them (their files in name order), each exactly the
model's size (nothing is resized), coded exactly, each with its name (the file's stem; the k-th
image of an npz ``STEM_0000k``), which decompress gives back where it is a safe file name
(codec/names.py; a line says how many are not): a picture whose 8-bit RGB pixels would not be
the file's own (16-bit, several frames, CMYK, transparency) is refused. Each input's line on
stderr says what it gave (a folder: one line). Every image goes into one file, coded in one decoding pass (up to 1,024
images; ``--batch``: passes of that many) on ``--threads`` torch threads (both recorded in the
file, which the decoder uses again). The file decodes on any x86-64 machine with the same torch:
the command runs the model with portable arithmetic (it restarts itself with
ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE; docs/compress.md); ``--portable false`` codes
with this machine's own kernels instead (faster; the file then decodes on machines like this
one). ``--force`` (or ``--force true``) replaces an existing --out file. The last line printed is
one JSON object: the images, the file's bytes and bits/dim, the model's bits/dim of the images and
the file's overhead over it (also said in a line before: the header and names, the coding), and
(``--compare``, on by default) the
bytes and bits/dim of the same images as separate PNG and WebP files; before it a line per picture
gives its bits/dim under the model beside its PNG's and WebP's, a line per folder or npz their means. Ctrl-C stops it with one line and
exit status 130.
"""

from __future__ import annotations

import json
import sys
import time
from argparse import ArgumentError
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
from jsonargparse import ArgumentParser, Namespace

from .cli.common import parse, parser_for, run_or_exit
from .cli.shipped import resolve
from .codec.container import MAX_BATCH
from .codec.files import Input, check_output, input_files, read_images, write_file
from .codec.names import PNG_NAME, kept_names
from .errors import shown
from .io.names import check_model_path

if TYPE_CHECKING:  # torch and the model are imported once the arguments are checked (run)
    from .codec.api import CompressionStats
    from .model.transformer import ImageTransformer

# The lossless formats a picture is kept in beside imagetx's file (the demo shows JPEG XL too, where
# its plugin is installed; here the two that Pillow always has).
COMPARED = ("PNG", "WebP")
SCORING_BATCH = 32  # images scored at once for their bits/dim (memory, not the result), as evaluate's default


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("inputs", nargs="+",
                        help="pictures, npz files (array 'images') or folders of them, of the model's size")
    parser.add_argument("--ckpt", type=str, required=True, help="the model: a weights folder or a checkpoint")
    parser.add_argument("--out", type=str, required=True, help="the compressed file to write")
    parser.add_argument("--batch", type=int | None, default=None,
                        help=f"images coded together in one pass (default: all, up to {MAX_BATCH})")
    parser.add_argument("--threads", type=int | None, default=None,
                        help="torch threads while coding (default: the codec's DEFAULT_THREADS, codec/api.py)")
    parser.add_argument("--portable", type=bool, default=True,
                        help="code with portable arithmetic: the file decodes on any x86-64 machine with this torch")
    parser.add_argument("--force", type=bool, nargs="?", const=True, default=False,
                        help="replace --out if it is a file (a bare flag, or --force true/false)")
    parser.add_argument("--progress", type=bool, default=True, help="a progress bar on stderr")
    parser.add_argument("--compare", type=bool, default=True,
                        help="each image's bits/dim under the model beside its PNG's and WebP's (a folder: the means)")
    return parser


def check_arguments(args: Namespace) -> None:
    """What can be refused before torch is imported (and before the restart with portable
    arithmetic, ``command``): --out, the inputs' paths, --ckpt's path."""
    check_output(args.out, args.force)
    input_files(args.inputs)
    check_model_path(resolve(args.ckpt))


def run(args: Namespace) -> dict:
    check_arguments(args)
    # here, not above: a bad argument is refused before torch and the model are imported
    from .codec.api import DEFAULT_THREADS, check_model, compress_with_stats
    from .io.load import load_model

    out = Path(args.out)
    model = load_model(resolve(args.ckpt))  # pretrained/...: also from an installed wheel
    check_model(model)
    inputs = read_images(args.inputs, model.config.image_size)
    for given in inputs:
        for line in (given.lines if len(given.lines) == 1 else [f"{given.name}: {len(given.images)} images from "
                                                                f"{len(given.lines)} files"]):
            print(f"input {shown(line)}", file=sys.stderr)  # a folder: one line, not one a file
    images = np.concatenate([given.images for given in inputs])
    names = [name for given in inputs for name in given.names]
    say_unkept_names(names)
    started = time.perf_counter()
    threads = DEFAULT_THREADS if args.threads is None else args.threads
    data, stats = compress_with_stats(model, images, args.batch, threads, args.progress, args.portable, names)
    seconds = time.perf_counter() - started
    write_file(out, data)
    result = {"out": str(out), "images": stats.images, "bytes": stats.file_bytes,
              "bits_per_dim": round(stats.bits_per_dim, 4), "seconds": round(seconds, 2),
              "images_per_second": round(stats.images / seconds, 3), "ckpt": str(args.ckpt)}
    scores = [model_bits_per_dim(model, given.images) for given in inputs]
    result.update(overhead(stats, float(np.concatenate(scores).mean())))
    if args.compare:
        result.update(compared(model, inputs, scores))
    return result


def overhead(stats: CompressionStats, model_bits: float) -> dict:
    """One line on stderr: the file's bits/dim against the model's (its images' -log2 p over their
    dims; every image has as many), and what the difference is spent on: the header, names list
    and CRC, and the coding (the quantised distributions, the range coder's rounding and last
    words). -> the JSON's fields."""
    extra = stats.bits_per_dim - model_bits
    framing_bytes = stats.file_bytes - stats.payload_bytes
    framing = 8 * framing_bytes / stats.dims
    print(f"overhead: {stats.bits_per_dim:.4f} bits/dim in the file against the model's {model_bits:.4f}: "
          f"{extra:+.4f}, of which the header and names ({framing_bytes:,} bytes) {framing:+.4f}, the coding "
          f"{extra - framing:+.4f}", file=sys.stderr)
    return {"model_bits_per_dim": round(model_bits, 4), "overhead_bits_per_dim": round(extra, 4)}


def say_unkept_names(names: list[str]) -> None:
    """One line on stderr where some images' names are not kept (not safe file names, or one an
    earlier image has): they decompress under their index names."""
    kept = kept_names(names) or ("",) * len(names)
    unkept = [name for name, stored in zip(names, kept) if not stored]
    if unkept:
        listed = ", ".join(repr(name) for name in unkept[:3]) + (", ..." if len(unkept) > 3 else "")
        print(f"names: {len(unkept)} of {len(names)} images will decompress under their index names "
              f"({PNG_NAME.format(0)}, ...): their names ({listed}) are not safe, unique file names "
              "(docs/compress.md, Outputs)", file=sys.stderr)


def compared(model: ImageTransformer, inputs: list[Input], scores: list[np.ndarray]) -> dict:
    """Each image's bits/dim under the model (``scores``, an array an input) beside its own PNG's
    and WebP's, as the demo's compress tab shows them: a line on stderr for each picture named by
    itself, one for each folder or npz (their means); the totals, for the JSON summary."""
    from .codec.classical import available, sizes

    codecs = [name for name in COMPARED if name in available()]
    dims = model.config.dims_per_image
    totals = dict.fromkeys(codecs, 0)
    for given, own in zip(inputs, scores):
        files = [sizes(image, codecs) for image in given.images]
        for name in codecs:
            totals[name] += sum(sized[name] for sized in files)
        if given.one_picture:
            beside = ", ".join(f"{name} {8 * files[0][name] / dims:.2f} ({files[0][name]:,} bytes)" for name in codecs)
            print(f"{shown(Path(given.name).name)}: {own[0]:.2f} bits/dim under the model; as a file {beside}",
                  file=sys.stderr)
        else:
            beside = ", ".join(f"{name} {8 * sum(sized[name] for sized in files) / (dims * len(files)):.2f}"
                               for name in codecs)
            print(f"{shown(given.name)}: {len(own)} images, {own.mean():.2f} bits/dim under the model (mean); "
                  f"as separate files {beside} bits/dim", file=sys.stderr)
    count = sum(len(given.images) for given in inputs)
    return {f"{name.lower()}_bytes": total for name, total in totals.items()} | \
        {f"{name.lower()}_bits_per_dim": round(8 * total / (dims * count), 4) for name, total in totals.items()}


def model_bits_per_dim(model: ImageTransformer, images: np.ndarray) -> np.ndarray:
    """(n,) each image's bits/dim under the model: what the codec spends on it, up to the
    quantisation of its distributions and the file's header (docs/compress.md)."""
    import torch

    from .model.modes import eval_mode

    with torch.no_grad(), eval_mode(model):
        return np.concatenate([model.bits_per_dim(torch.from_numpy(images[start : start + SCORING_BATCH])).numpy()
                               for start in range(0, len(images), SCORING_BATCH)])


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "compress")))
    print(json.dumps(result))


def command() -> None:
    """The program (``imagetx-compress``): ``main`` in a process that computes with portable
    arithmetic, restarted with it where it does not, unless ``--portable false``."""
    try:
        args = build_parser().parse_args(sys.argv[1:])
    except ArgumentError:
        args = None  # main says what is wrong with the command line
    if args is not None and args.portable:
        run_or_exit(lambda: check_arguments(args))  # refused before the restart, which imports torch
        from .codec.arithmetic import restart_with

        restart_with(True, "imagetx.compress")
    main()


if __name__ == "__main__":
    command()
