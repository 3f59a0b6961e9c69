"""A compressed file's names list, packed (format 6 on; docs/compress.md, "The file").

Format 5 stored each image's name in full: an npz's ``h100_00000`` ... ``h100_00099`` cost 11
bytes an image, 0.029 bits/dim on 32x32 images, as much as the header ten times over. Format 6
stores the list as records, then compresses them with DEFLATE (zlib, raw: the file's CRC already
guards them):

* a **run**: ``RUN``, a prefix (UTF-8, NUL-ended), then the width, first number and count
  (``RUN_FIELDS``): the names prefix + the numbers first, first + 1, ... written in that many
  digits, zero-padded. An npz's names (its stem, ``_`` and the index in five digits) are one run,
  a folder's ``IMG_0001`` ... ``IMG_0100`` another: a few bytes for the lot;
* a **literal**: ``LITERAL``, then the name (UTF-8, NUL-ended; empty for an image without one).

DEFLATE then shares what literals have in common (a folder's common prefixes and suffixes).
Reading is bounded: the inflated records may take at most what ``count`` literals of the longest
name would, and their names must add up to ``count`` exactly, before any run is spelled out.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence

from .names import MAX_NAME_BYTES

LITERAL, RUN = 0, 1
RUN_FIELDS = struct.Struct("<BII")  # digits, first number, count
END = b"\0"
# A name ending in ASCII digits: the prefix and the number (not \d: other scripts' digits would
# not come back as they went in from a format's "{:0{width}d}").
NUMBERED = re.compile(r"(.*?)([0-9]+)", re.DOTALL)
# Raw DEFLATE (no zlib header or Adler-32: 6 bytes an empty list would spend), at its best level.
WBITS = -zlib.MAX_WBITS
LEVEL = 9
# The most bytes one record can take: a literal of the longest name, or a run of the longest prefix.
RECORD_BYTES = 1 + MAX_NAME_BYTES + len(END) + RUN_FIELDS.size


class NamesListError(ValueError):
    """A packed names list that is not one (the container says so in its one line)."""


def numbered(name: str) -> tuple[str, int, int] | None:
    """``name`` -> (prefix, number, digits) where it ends in ASCII digits, else None."""
    match = NUMBERED.fullmatch(name)
    return (match[1], int(match[2]), len(match[2])) if match else None


def run_length(names: Sequence[str], start: int) -> int:
    """How many names from ``start`` on count up by one from ``names[start]``'s number, in the same
    prefix and digits (1 where it has none, or the next does not follow)."""
    first = numbered(names[start])
    if first is None:
        return 1
    prefix, number, digits = first
    length = 1
    while start + length < len(names) and names[start + length] == f"{prefix}{number + length:0{digits}d}":
        length += 1
    return length


def pack(names: Sequence[str]) -> bytes:
    """``names`` (one an image, "" for none) -> the packed list."""
    records, index = bytearray(), 0
    while index < len(names):
        length = run_length(names, index)
        if length > 1:
            prefix, number, digits = numbered(names[index])
            records += bytes([RUN]) + prefix.encode() + END + RUN_FIELDS.pack(digits, number, length)
        else:
            records += bytes([LITERAL]) + names[index].encode() + END
        index += length
    deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, WBITS)
    return deflate.compress(bytes(records)) + deflate.flush()


def unpack(block: bytes, count: int) -> tuple[str, ...]:
    """A packed list of ``count`` names -> the names, or a ``NamesListError`` saying what is wrong."""
    inflate = zlib.decompressobj(WBITS)
    limit = count * RECORD_BYTES
    try:
        records = inflate.decompress(block, limit + 1)
    except zlib.error:
        raise NamesListError("not DEFLATE data") from None
    if len(records) > limit:
        raise NamesListError(f"more than {RECORD_BYTES} bytes a name")
    if not inflate.eof or inflate.unused_data:
        raise NamesListError("its DEFLATE data ends early or goes on past its end")
    names: list[str] = []
    at = 0
    while at < len(records):
        kind, end = records[at], records.find(END, at + 1)
        if kind not in (LITERAL, RUN) or end < 0:
            raise NamesListError("a record that is not one")
        text = read_text(records[at + 1:end])
        at = end + len(END)
        if kind == LITERAL:
            names.append(text)
            continue
        if at + RUN_FIELDS.size > len(records):
            raise NamesListError("a run cut short")
        digits, first, length = RUN_FIELDS.unpack_from(records, at)
        at += RUN_FIELDS.size
        if not length or len(names) + length > count or len(text.encode()) + digits > MAX_NAME_BYTES:
            raise NamesListError(f"a run of {length:,} names of {digits} digits after {len(names):,} "
                                 f"of {count:,}")
        names += (f"{text}{first + offset:0{digits}d}" for offset in range(length))
    if len(names) != count:
        raise NamesListError(f"{len(names):,} names for {count:,} images")
    if any(len(name.encode()) > MAX_NAME_BYTES for name in names):
        raise NamesListError(f"a name of more than {MAX_NAME_BYTES} bytes")
    return tuple(names)


def read_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NamesListError("not UTF-8 text") from None
