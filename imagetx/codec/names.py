"""The images' names a compressed file keeps (format 5, docs/compress.md "Outputs"), and the
rule that decides which of them a decompressed folder uses.

A file stores, for each image, the stem of the file it came from (``photo.jpg``: ``photo``; the
k-th image of ``more.npz``: ``more_0000k``, k in five digits), or nothing. Decompressed into a
folder, an image is written as its stem plus ``.png`` where the stem is a **safe name**, and
under its index name (``00000.png``, ...) otherwise. A file is untrusted: its names are checked
when it is read, whatever its writer checked. A stem is safe where

* it is 1 to ``MAX_NAME_BYTES`` bytes of UTF-8 (the file name, with ``.png``, fits the 255 bytes
  of common file systems);
* every character is printable (``str.isprintable``: no control, format (bidi overrides,
  zero-width), separator (other than the space), surrogate or unassigned characters), and none
  is one of ``/ \\ : * ? " < > |`` (path separators, and what Windows refuses in a name);
* it does not start with ``.`` (no hidden file, no ``.`` or ``..``), ``-`` (not read as an
  option by a shell command) or a space, and does not end with ``.`` or a space (Windows drops
  them);
* it is not one of Windows' device names (``CON``, ``NUL``, ``CONIN$``, ``COM0`` to ``COM9``,
  ``COM¹``, ..., in any case, before any dot and the spaces before it);
* it looks like an index name (five ASCII digits) only where it is its own image's index name
  (``00003`` for the fourth image), so that it can never take another image's fallback name;
* its ``.png`` name is the first of its kind: a later image whose name is the same, compared as
  NFC and case-folded (as macOS's and Windows' file systems compare names), falls back.

So every name written is one plain file inside the output folder, and no two images share one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

PNG_SUFFIX = ".png"
# A decoded folder's index names, in file order: five digits hold every index below MAX_IMAGES.
PNG_NAME = "{:05d}.png"
INDEX_STEM = re.compile(r"[0-9]{5}")
# A stem's bytes at most (UTF-8): the name with .png is then 204 bytes, under the 255 of ext4,
# APFS, NTFS (255 UTF-16 units) and most others.
MAX_NAME_BYTES = 200
FORBIDDEN = frozenset('/\\:*?"<>|')
# Windows' device names: a file of one of these names, whatever its suffix, opens the device. The
# serial and parallel ports take a digit, 0 to 9, or a superscript one, two or three (Windows reads
# ¹ ² ³ as digits there); the console's input and output are CONIN$ and CONOUT$.
PORT_DIGITS = "0123456789\u00b9\u00b2\u00b3"
RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$",
                      *(f"{kind}{digit}" for kind in ("COM", "LPT") for digit in PORT_DIGITS)})
# The k-th image of an npz file: the file's stem and k.
NPZ_IMAGE_NAME = "{}_{:05d}"


def unsafe_reason(stem: str) -> str | None:
    """Why ``stem`` is not a safe name (the rule above, less uniqueness), or None where it is."""
    if not stem:
        return "no name"
    if len(stem.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes"
    if not stem.isprintable():
        return "a control or other unprintable character"
    if FORBIDDEN.intersection(stem):
        return "a path separator or a character file systems refuse"
    if stem[0] in ".- " or stem[-1] in ". ":
        return "a leading dot, dash or space, or a trailing dot or space"
    if stem.split(".")[0].rstrip(" ").upper() in RESERVED:  # Windows ignores spaces before the suffix too
        return "a device name"
    return None


def output_names(stored: Sequence[str], count: int) -> list[str | None]:
    """For ``count`` images with names ``stored`` (a stem each, "" for none; an empty sequence:
    none at all), each image's file name in a decoded folder where its stem is safe and the
    first of its kind, None where it falls back to its index name."""
    names: list[str | None] = [None] * count
    taken: set[str] = set()
    for index, stem in enumerate(stored[:count]):
        if unsafe_reason(stem) is not None:
            continue
        if INDEX_STEM.fullmatch(stem) and int(stem) != index:
            continue  # another image's index name: that image may fall back to it
        key = unicodedata.normalize("NFC", stem + PNG_SUFFIX).casefold()
        if key in taken:
            continue
        taken.add(key)
        names[index] = stem + PNG_SUFFIX
    return names


def folder_names(stored: Sequence[str], count: int) -> tuple[list[str], int]:
    """The file names of a decoded folder of ``count`` images (``output_names``, an index name
    where it gives None), and how many fell back to index names though the file stores names
    (0 where it stores none)."""
    names = output_names(stored, count)
    fell_back = sum(name is None for name in names) if any(stored) else 0
    return [name or PNG_NAME.format(index) for index, name in enumerate(names)], fell_back


def kept_names(names: Sequence[str]) -> tuple[str, ...]:
    """What a compressed file stores for images named ``names``: each stem that ``output_names``
    keeps, "" for one it would not (so that the file holds only names it will give back); () where
    none is kept."""
    kept = output_names(names, len(names))
    stored = tuple(stem if name is not None else "" for stem, name in zip(names, kept))
    return stored if any(stored) else ()
