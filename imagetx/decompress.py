"""``python -m imagetx.decompress``: a file written by ``imagetx.compress`` back to its images,
exactly (docs/compress.md).

    python -m imagetx.decompress FILE --ckpt pretrained/completion --out DIR|IMAGES.npz|IMAGE.png [--force]

``--out`` ending in .npz: one npz with the array ``images`` (N, H, W, 3) uint8; in .png: that
PNG, for a file of one image; otherwise a folder of PNGs, written whole beside it and then put
in its place: each image under the name of the file it was compressed from (format 5 keeps
them: ``photo.jpg`` gives ``photo.png``, the k-th image of ``more.npz`` ``more_0000k.png``), or
where the file keeps none (images compressed from Python, files of formats 1 to 4), or its name
is not a safe file name (codec/names.py), under its index: 00000.png, 00001.png, ... in the order
the images were compressed; one line on stderr says how many fell back. ``--force`` (or
``--force true``) replaces an existing --out: a file, or a folder holding nothing but PNGs of
the names this decode writes, as a whole; judged before the decode and again when it writes, so
that a file saved there meanwhile is never deleted. A file that is not one (a folder is said to
be one), is truncated or damaged, claims more images than its payload can code, or was
compressed with another model is refused with one ``error:`` line (exit code 2) before anything
is written, read in pieces (its payload only to decode it); so is a decoding that reads past the
payload's end, as soon as it does, or whose pixels do not match the file's checksum. The command runs the model with
the arithmetic the file was coded with (restarting itself with or without
ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE: docs/compress.md); a file coded with another
machine's native kernels is refused where they differ. The last line printed is one JSON object.
Ctrl-C stops it with one line and exit status 130.
"""

from __future__ import annotations

import json
import sys
import time
from argparse import ArgumentError
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from jsonargparse import ArgumentParser, Namespace

from .cli.common import parse, parser_for, run_or_exit
from .cli.shipped import resolve
from .codec.container import CodecError
from .io.errors import CheckpointError
from .codec.files import check_output, output_kind, read_compressed, write_images
from .codec.names import folder_names
from .io.names import check_model_path

T = TypeVar("T")


def build_parser() -> ArgumentParser:
    parser = parser_for(__doc__)
    parser.add_argument("file", help="a file written by imagetx.compress")
    parser.add_argument("--ckpt", type=str, required=True, help="the model it was compressed with")
    parser.add_argument("--out", type=str, required=True,
                        help="an .npz file, a .png (a file of one image), or a folder for PNGs")
    parser.add_argument("--force", type=bool, nargs="?", const=True, default=False,
                        help="replace --out if it exists (a bare flag, or --force true/false)")
    parser.add_argument("--progress", type=bool, default=True, help="a progress bar on stderr")
    return parser


def run(args: Namespace) -> dict:
    data = read_compressed(args.file)  # its header and CRC: refused before the model is loaded
    header = data.header
    check_model_path(resolve(args.ckpt))
    # here, not above: a bad argument is refused before torch and the model are imported
    from .codec.api import decompress
    from .io.load import load_model

    folder = output_kind(Path(args.out), header.count) == "folder"
    names, fell_back = folder_names(header.names, header.count)
    out = check_output(args.out, args.force, folder, names if folder else ())
    model = load_model(resolve(args.ckpt))  # pretrained/...: also from an installed wheel
    started = time.perf_counter()
    images = naming_the_file(args.file, lambda: decompress(model, data, args.progress))
    seconds = time.perf_counter() - started
    written = write_images(images, out, header.names, args.force)  # judged again: the decode may take hours
    if folder and fell_back:
        print(f"names: {fell_back} of {header.count} images written under their index names (00000.png, ...): the "
              "file gives them no name, or one that is not a safe, unique file name", file=sys.stderr)
    return {"out": str(out), "images": header.count, "files": len(written), "seconds": round(seconds, 2),
            "images_per_second": round(header.count / seconds, 3), "ckpt": str(args.ckpt)}


def naming_the_file(name: str, read: Callable[[], T]) -> T:
    """``read()``, its CodecError (the file's problem) starting with the file's name."""
    try:
        return read()
    except CodecError as error:
        raise CodecError(f"{name}: {error}") from None


def main(argv: list[str] | None = None) -> None:
    result = run_or_exit(lambda: run(parse(build_parser(), argv, "decompress")))
    print(json.dumps(result))


def command() -> None:
    """The program (``imagetx-decompress``): ``main`` in a process that computes with the arithmetic
    the file records, restarted with it where it does not (files of formats 1 and 2: native)."""
    try:
        args = build_parser().parse_args(sys.argv[1:])
        header = read_compressed(args.file).header
        check_model_path(resolve(args.ckpt))
    except (ArgumentError, CodecError, CheckpointError, OSError):
        main()  # it says what is wrong, before torch is imported
        return
    from .codec.arithmetic import restart_with  # torch, as the restart does

    restart_with(header.arithmetic is not None and header.arithmetic.portable, "imagetx.decompress")
    main()


if __name__ == "__main__":
    command()
