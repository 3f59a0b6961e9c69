"""Format 6's packed names list (codec/names_list.py; issue 124, "also found by measurement"):
every list comes back as it went in; an npz's names, a run, cost a few bytes, not 11 an image
as in format 5; a crafted list is refused as the file's names list, in one line, before any
run is spelled out or any inflation grows past what ``count`` names can take (the file's one
line for each: tests/codec/test_names.py)."""

from __future__ import annotations

import zlib

import pytest

from imagetx.codec.container import names_block
from imagetx.codec.names import MAX_NAME_BYTES, NPZ_IMAGE_NAME
from imagetx.codec.names_list import LITERAL, RUN, RUN_FIELDS, WBITS, NamesListError, pack as pack_names, unpack

NPZ_NAMES = tuple(NPZ_IMAGE_NAME.format("h100", index) for index in range(100))


def deflated(records: bytes) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, WBITS)
    return deflate.compress(records) + deflate.flush()


def literal(name: bytes) -> bytes:
    return bytes([LITERAL]) + name + b"\0"


def run(prefix: bytes, digits: int, first: int, count: int) -> bytes:
    return bytes([RUN]) + prefix + b"\0" + RUN_FIELDS.pack(digits, first, count)


@pytest.mark.parametrize("names", [
    NPZ_NAMES,
    ("cat", "", "dog", "photo 1 (é)", "日本語", "IMG_0009", "IMG_0010", "IMG_0011", "x" * MAX_NAME_BYTES),
    ("a9", "a10", "a11", "b_00001", "b_00002", "b_00002", "7", "8", "", ""),  # widths differ; a repeat; no prefix
    ("٣", "٤", "00000", "00001", "more_00099", "more_00100"),  # other scripts' digits are no run
    ("",),
])
def test_every_list_comes_back_as_it_went_in(names):
    assert unpack(pack_names(names), len(names)) == names


def test_an_npz_of_100_images_names_itself_in_a_few_bytes():
    """Format 5 spent 11 bytes an image on h100_00000 ... h100_00099: 1,100 bytes, +0.029 bits/dim
    on 32x32 images; one run now, inflated: under 20 bytes. A folder's names share their parts."""
    old = names_block(NPZ_NAMES, 5)
    assert len(old) == 1099 and len(pack_names(NPZ_NAMES)) < 20
    folder = tuple(f"holiday {place} {day}" for place in ("beach", "hills", "town") for day in range(10, 40))
    assert len(pack_names(folder)) < len(names_block(folder, 5)) / 3


@pytest.mark.parametrize("block, count, said", [
    (b"\xff\x00junk", 2, "not DEFLATE data"),
    (deflated(literal(b"a"))[:-1], 1, "ends early"),
    (deflated(literal(b"a")) + b"\0", 1, "goes on past its end"),
    (deflated(literal(b"a") + literal(b"\xff\xfe")), 2, "not UTF-8"),
    (deflated(literal(b"a") + b"\x02b\0"), 2, "a record that is not one"),
    (deflated(literal(b"a") + b"\x00b"), 2, "a record that is not one"),  # no NUL at its end
    (deflated(literal(b"a")), 2, "1 names for 2 images"),
    (deflated(literal(b"a") * 3), 2, "3 names for 2 images"),
    (deflated(run(b"a", 5, 0, 2**32 - 1)), 2, "a run of 4,294,967,295 names"),  # never spelled out
    (deflated(run(b"a", 5, 0, 0)), 1, "a run of 0 names"),
    (deflated(run(b"a", 5, 0, 2)[:-1]), 2, "a run cut short"),
    (deflated(run(b"x" * MAX_NAME_BYTES, 1, 0, 2)), 2, "of 1 digits"),
    (deflated(run(b"x" * (MAX_NAME_BYTES - 1), 1, 9, 2)), 2, f"a name of more than {MAX_NAME_BYTES} bytes"),
    (deflated(b"\0" * 10_000_000), 3, "more than"),  # a DEFLATE bomb: 10 MB of records in 10 KB
])
def test_a_crafted_list_is_refused(block, count, said):
    with pytest.raises(NamesListError, match=said):
        unpack(block, count)
