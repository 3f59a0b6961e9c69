"""A file in parts of a size a transfer or a file host takes, and the check that joins them again.

``write_parts`` cuts bytes into ``NAME.part00``, ``NAME.part01``, ... beside each other;
``read_parts`` joins them and refuses (``ValueError``) parts that do not add up to the size and
SHA-256 written with them. A packed continuation keeps its parts so (training/continuation.py), and
so does any other file split for travel:

    python -m imagetx.io.parts split FILE FOLDER --part-mib 15   # FOLDER/FILE.partNN and FILE.parts.json
    python -m imagetx.io.parts join FOLDER/FILE.parts.json OUT    # OUT, checked
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from ..errors import UserError
from .atomic import atomic_write

MiB = 2**20
MANIFEST_SUFFIX = ".parts.json"  # split's manifest of FILE: FILE.parts.json


def mib_to_part_bytes(text: str) -> int:
    """``--part-mib``'s value (MiB, fractions allowed) as the bytes of a part: every CLI that writes parts
    takes it so, and refuses a size under one byte in argparse's one line."""
    try:
        part_bytes = int(float(text) * MiB)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if part_bytes < 1:
        raise argparse.ArgumentTypeError(f"{text} MiB: a part must be at least one byte")
    return part_bytes


def write_parts(data: bytes, folder: str | Path, name: str, part_bytes: int | None = None) -> dict:
    """``data`` into ``folder/name.partNN``, each of at most ``part_bytes`` (None: one part); returns
    what ``read_parts`` checks them against: {"bytes", "sha256", "parts"}."""
    if part_bytes is not None and part_bytes < 1:
        raise ValueError(f"part_bytes={part_bytes}: must be positive")
    folder, size = Path(folder), part_bytes or max(len(data), 1)
    parts = []
    for index, start in enumerate(range(0, max(len(data), 1), size)):
        parts.append(f"{name}.part{index:02d}")
        atomic_write(folder / parts[-1], lambda handle, chunk=data[start:start + size]: handle.write(chunk))
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}


def read_parts(folder: str | Path, record: dict) -> bytes:
    """The bytes ``write_parts`` cut into the parts ``record`` names, from ``folder``; ``ValueError``
    (or ``OSError`` for a missing part) when they are not those bytes."""
    data = b"".join((Path(folder) / name).read_bytes() for name in record["parts"])
    if len(data) != int(record["bytes"]) or hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise UserError(f"the parts {', '.join(record['parts'])} do not add up to the file they were cut from "
                        f"({len(data)} of {record['bytes']} bytes, or another SHA-256): a part is cut short or changed")
    return data


def split(path: str | Path, folder: str | Path, part_bytes: int | None) -> Path:
    """``path`` in parts into ``folder``, with their record ``NAME.parts.json``; returns the record's path."""
    path = Path(path)
    record = {"file": path.name, **write_parts(path.read_bytes(), folder, path.name, part_bytes)}
    manifest = Path(folder) / (path.name + MANIFEST_SUFFIX)
    atomic_write(manifest, lambda handle: handle.write(json.dumps(record, indent=1).encode()))
    return manifest


def join(manifest: str | Path, to: str | Path) -> Path:
    """The file whose parts ``manifest`` (``split``'s record) names, joined beside it and checked, into ``to``."""
    manifest = Path(manifest)
    data = read_parts(manifest.parent, json.loads(manifest.read_text()))
    atomic_write(to, lambda handle: handle.write(data))
    return Path(to)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imagetx.io.parts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    cut = verbs.add_parser("split", help="a file in parts, with their record NAME.parts.json")
    cut.add_argument("file", type=Path)
    cut.add_argument("folder", type=Path)
    cut.add_argument("--part-mib", dest="part_bytes", type=mib_to_part_bytes, required=True,
                     help="parts of at most this many MiB")
    glue = verbs.add_parser("join", help="the parts a NAME.parts.json names, joined and checked")
    glue.add_argument("manifest", type=Path)
    glue.add_argument("out", type=Path)
    options = parser.parse_args(argv)
    try:
        if options.verb == "split":
            print(split(options.file, options.folder, options.part_bytes))
        else:
            print(join(options.manifest, options.out))
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
