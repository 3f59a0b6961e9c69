"""Format 5 keeps the images' names (issue 111 §3 item 6; docs/compress.md "Outputs"; format 6
packs them, codec/names_list.py and test_names_list.py): a folder
compressed and decompressed comes back under the same names, under the file's CRC; a name that
is not a safe file name (codec/names.py) falls back to the image's index name, said in one line,
and never writes outside the output folder; a names list that is not one is refused in one
``error:`` line; --force replaces only a folder of the PNGs a decode writes; files of formats 1
to 4 (tests/assets) decode as before, under index names."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import imagetx.codec.api as codec_api
from helpers import ASSETS, one_error_line, random_images, tiny_model
from imagetx import compress as compress_cli
from imagetx import decompress as decompress_cli
from imagetx.codec import CodecError, compress, decompress, read_header
from imagetx.codec.arithmetic import PORTABLE_ENVIRONMENT, RESTARTED
from imagetx.codec.container import ARITHMETIC, FORMAT_VERSION, HEADER, NAMES_LENGTH, TRAILER, pack, unpack
from imagetx.codec.names import MAX_NAME_BYTES, output_names
from imagetx.codec.names_list import LITERAL, RUN, RUN_FIELDS, WBITS
from imagetx.io.hub import save_pretrained

NATIVE = ("--portable", "false")  # this process codes with its own kernels (as test_compress_cli.py)
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "pretrained" / "completion"
NAMES_AT = HEADER.size + ARITHMETIC.size  # format 5 on: the names' length, then the names


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A model, and a folder of pictures and an npz of two, in name order as compress reads it:
    (root, the folder, the names the decoded PNGs should have, their pixels in that order)."""
    root = tmp_path_factory.mktemp("names")
    model = tiny_model(seed=1, head="dmol")
    save_pretrained(model, root / "model")
    images = random_images(6, 4, seed=3).numpy()
    folder = root / "inputs"
    folder.mkdir()
    Image.fromarray(images[0]).save(folder / "cat.png")
    Image.fromarray(images[1]).save(folder / "dog.bmp")  # lossless: compared exactly
    np.savez(folder / "more.npz", images=images[2:4])
    Image.fromarray(images[4]).save(folder / "photo 1 (é).png")  # a space, brackets, a non-ASCII letter
    Image.fromarray(images[5]).save(folder / "zebra.gif")
    picture = lambda name: np.asarray(Image.open(folder / name).convert("RGB"))  # noqa: E731
    pixels = np.stack([picture("cat.png"), picture("dog.bmp"), *images[2:4], picture("photo 1 (é).png"),
                       picture("zebra.gif")])
    names = ["cat.png", "dog.png", "more_00000.png", "more_00001.png", "photo 1 (é).png", "zebra.png"]
    return root, folder, names, pixels


def compress_folder(root: Path, folder: Path, out: Path, capsys) -> str:
    compress_cli.main([*NATIVE, str(folder), "--ckpt", str(root / "model"), "--out", str(out), "--progress", "false"])
    return capsys.readouterr().err


def decompress_to(root: Path, data: Path, out: Path, capsys, *more: str) -> str:
    decompress_cli.main([str(data), "--ckpt", str(root / "model"), "--out", str(out), "--progress", "false", *more])
    return capsys.readouterr().err


def folder_pixels(out: Path, names: list[str]) -> np.ndarray:
    return np.stack([np.asarray(Image.open(out / name)) for name in names])


def test_a_folder_round_trips_to_the_same_names_and_pixels(named, tmp_path, capsys):
    root, folder, names, pixels = named
    data = tmp_path / "named.itx"
    said = compress_folder(root, folder, data, capsys)
    assert "names:" not in said  # every name is kept
    header = read_header(data.read_bytes())
    assert header.version == FORMAT_VERSION
    assert header.names == ("cat", "dog", "more_00000", "more_00001", "photo 1 (é)", "zebra")
    out = tmp_path / "back"
    said = decompress_to(root, data, out, capsys)
    assert "names:" not in said
    assert sorted(path.name for path in out.iterdir()) == sorted(names)
    assert np.array_equal(folder_pixels(out, names), pixels)
    # the same file to an npz: the images in order, names aside
    decompress_to(root, data, tmp_path / "back.npz", capsys)
    assert np.array_equal(np.load(tmp_path / "back.npz")["images"], pixels)


def test_the_names_are_under_the_crc(named, tmp_path, capsys):
    """A changed byte of the names list is a damaged file, refused before anything is written."""
    root, folder, _, _ = named
    data = tmp_path / "named.itx"
    compress_folder(root, folder, data, capsys)
    content = bytearray(data.read_bytes())
    assert NAMES_LENGTH.unpack_from(content, NAMES_AT)[0] > 0
    at = NAMES_AT + NAMES_LENGTH.size  # the names list's first byte
    content[at] ^= 1
    damaged = tmp_path / "damaged.itx"
    damaged.write_bytes(bytes(content))
    out = tmp_path / "out"
    line = one_error_line(capsys, decompress_cli.main, [str(damaged), "--ckpt", str(root / "model"), "--out",
                                                        str(out), "--progress", "false"])
    assert "damaged" in line and "CRC-32" in line and not out.exists()


@pytest.mark.parametrize("unsafe", ["../escaped", "/tmp/absolute", "sub/dir", "back\\slash", ".hidden", "..",
                                    "line\nbreak", "tab\there", "bidi\u202eGNP.exe", "-rf", " lead", "trail.",
                                    "CON", "nul.tar", "x" * (MAX_NAME_BYTES + 1), "a:b", "00000", "",
                                    # issue 124: every Windows device name, the ports' 0 and superscripts too
                                    "COM0", "lpt0", "COM\u00b9", "lpt\u00b3.x", "conin$", "CONOUT$.txt", "nul .txt"])
def test_an_unsafe_name_never_comes_back(unsafe):
    """The rule (codec/names.py): the unsafe stem, second in the list, falls back to its index
    name; a safe one beside it is kept."""
    assert output_names(["first", unsafe, "last"], 3) == ["first.png", None, "last.png"]


def test_safe_names_are_kept_once_and_never_take_an_index_name():
    stems = ["Photo", "photo", "café", "cafe\u0301", "00004", "00000", "日本語", "a.b.c", "x" * MAX_NAME_BYTES]
    assert output_names(stems, len(stems)) == [
        "Photo.png", None,  # the same name on a case-insensitive file system
        "café.png", None,  # the same name as NFC (macOS compares names so)
        "00004.png", None,  # its own index name is kept; another's is not
        "日本語.png", "a.b.c.png", "x" * MAX_NAME_BYTES + ".png"]


def test_crafted_unsafe_names_fall_back_and_nothing_is_written_outside(named, tmp_path, capsys):
    """A file written by the codec's own writer (container.pack, which computes the CRC) with
    names patched to escape the folder, hide a file, or take another image's name: the decoded
    folder holds exactly the safe names and index names, nothing is written beside it, and one
    line says how many fell back."""
    root, folder, names, pixels = named
    data = tmp_path / "named.itx"
    compress_folder(root, folder, data, capsys)
    header, payload = unpack(data.read_bytes())
    crafted = ("../escaped", "cat", ".hidden", "cat", "/tmp/absolute\u0001", "00001")
    evil = tmp_path / "evil.itx"
    evil.write_bytes(pack(dataclasses.replace(header, names=crafted), payload))
    assert read_header(evil.read_bytes()).names == crafted  # the file is well formed: its names are not safe
    out = tmp_path / "box" / "out"
    out.parent.mkdir()
    said = decompress_to(root, evil, out, capsys)
    expected = ["00000.png", "cat.png", "00002.png", "00003.png", "00004.png", "00005.png"]
    assert sorted(path.name for path in out.iterdir()) == sorted(expected)
    assert np.array_equal(folder_pixels(out, expected), pixels)
    assert [path.name for path in (tmp_path / "box").iterdir()] == ["out"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["box", "evil.itx", "named.itx"]
    (line,) = [line for line in said.splitlines() if line.startswith("names:")]
    assert line.startswith("names: 5 of 6 images written under their index names (00000.png, ...)"), line


def test_compress_says_which_names_it_cannot_keep(named, tmp_path, capsys):
    """Two pictures of one stem (cat.png, cat.gif): the second is numbered, said by both commands."""
    root, folder, _, _ = named
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("cat.png", "zebra.gif"):
        (inputs / name).write_bytes((folder / name).read_bytes())
    Image.open(folder / "cat.png").save(inputs / "cat.gif")  # sorted first: it keeps the name "cat"
    data = tmp_path / "dup.itx"
    said = compress_folder(root, inputs, data, capsys)
    assert "names: 1 of 3 images will decompress under their index names (00000.png, ...): their names ('cat')" \
        in said, said
    assert read_header(data.read_bytes()).names == ("cat", "", "zebra")
    said = decompress_to(root, data, tmp_path / "out", capsys)
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["00001.png", "cat.png", "zebra.png"]
    assert "names: 1 of 3 images written under their index names" in said


def fix_crc(data: bytes) -> bytes:
    body = data[:-TRAILER.size]
    return body + TRAILER.pack(zlib.crc32(body))


def with_names_block(data: bytes, block: bytes) -> bytes:
    """A file's bytes (format 5 on) with its names list replaced by ``block`` (length and CRC fixed)."""
    (length,) = NAMES_LENGTH.unpack_from(data, NAMES_AT)
    start = NAMES_AT + NAMES_LENGTH.size
    return fix_crc(data[:NAMES_AT] + NAMES_LENGTH.pack(len(block)) + block + data[start + length:])


def deflated(*records: bytes) -> bytes:
    """Format 6's names list of these records (codec/names_list.py)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, WBITS)
    return deflate.compress(b"".join(records)) + deflate.flush()


# A names list that is not one, as each format stores its list: (what the error line says, the list).
NOT_NAMES_LISTS = {
    5: {"not UTF-8": b"cat\0\xff\xfe\0a\0b\0c\0d", "5 names for 6 images": b"a\0b\0c\0d\0e",
        "7 names for 6 images": b"a\0b\0c\0d\0e\0f\0g", "more than 200 bytes a name": b"x" * (6 * 201 + 1)},
    6: {"not UTF-8": deflated(bytes([LITERAL]) + b"\xff\xfe\0"),
        "5 names for 6 images": deflated(bytes([RUN]) + b"a\0" + RUN_FIELDS.pack(5, 0, 5)),
        "7 names for 6 images": deflated(bytes([RUN]) + b"a\0" + RUN_FIELDS.pack(5, 0, 6), bytes([LITERAL]) + b"b\0"),
        "a run of 4,294,967,295 names": deflated(bytes([RUN]) + b"a\0" + RUN_FIELDS.pack(5, 0, 2**32 - 1)),
        "bytes a name": deflated(bytes([LITERAL]) * 10_000_000),
        "not DEFLATE data": b"\xff" * 8},
}


@pytest.mark.parametrize("version", sorted(NOT_NAMES_LISTS))
def test_a_names_list_that_is_not_one_is_one_error_line(named, tmp_path, capsys, monkeypatch, version):
    root, folder, _, _ = named
    data = tmp_path / "named.itx"
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", version)
    compress_folder(root, folder, data, capsys)
    good = data.read_bytes()
    assert good[len(b"ITXC")] == version
    bad = {said: with_names_block(good, block) for said, block in NOT_NAMES_LISTS[version].items()}
    bad["its header says"] = good[:NAMES_AT] + struct.pack("<I", 2**32 - 1) + good[NAMES_AT + 4:]
    for said, content in bad.items():
        crafted = tmp_path / "crafted.itx"
        crafted.write_bytes(content)
        with pytest.raises(CodecError):
            read_header(content)
        out = tmp_path / "out"
        line = one_error_line(capsys, decompress_cli.main, [str(crafted), "--ckpt", str(root / "model"), "--out",
                                                            str(out), "--progress", "false"])
        assert said in line and "crafted.itx" in line, (said, line)
        assert not out.exists()


def test_force_replaces_a_folder_of_what_the_decode_writes_and_nothing_else(named, tmp_path, capsys):
    """--force replaces a folder holding only PNGs this decode writes (its names): never a folder
    with another file, nor another decode's named PNGs or index-named ones (issue 124: they were
    taken for this decode's), which it would delete."""
    root, folder, names, pixels = named
    data = tmp_path / "named.itx"
    compress_folder(root, folder, data, capsys)
    out = tmp_path / "out"
    decompress_to(root, data, out, capsys)
    decompress_to(root, data, out, capsys, "--force")  # the same names again: replaced
    assert sorted(path.name for path in out.iterdir()) == sorted(names)
    assert np.array_equal(folder_pixels(out, names), pixels)
    numbered = tmp_path / "numbered"  # an earlier decode of a file without names, or the user's own
    numbered.mkdir()
    for index in range(3):
        (numbered / f"{index:05d}.png").write_bytes(b"old")
    line = one_error_line(capsys, decompress_cli.main, [str(data), "--ckpt", str(root / "model"), "--out",
                                                        str(numbered), "--progress", "false", "--force"])
    assert "not a folder of decoded PNGs only (it holds '00000.png')" in line, line
    assert all(path.read_bytes() == b"old" for path in numbered.iterdir()) and len(list(numbered.iterdir())) == 3
    other = tmp_path / "other"  # another folder's PNGs, not this decode's to delete
    other.mkdir()
    (other / "holiday.png").write_bytes(b"mine")
    (other / "cat.png").write_bytes(b"mine too")
    line = one_error_line(capsys, decompress_cli.main, [str(data), "--ckpt", str(root / "model"), "--out",
                                                        str(other), "--progress", "false", "--force"])
    assert "not a folder of decoded PNGs only (it holds 'holiday.png')" in line, line
    assert (other / "holiday.png").read_bytes() == b"mine" and (other / "cat.png").read_bytes() == b"mine too"


def test_images_from_python_keep_no_names_and_decode_to_index_names(named, tmp_path, capsys):
    """The API without names stores none (an empty list, 4 bytes); the folder is numbered as before."""
    root, _, _, pixels = named
    from imagetx.io.load import load_model

    model = load_model(root / "model")
    data = compress(model, pixels, portable=False)
    header, payload = unpack(data)
    assert (header.version, header.names) == (FORMAT_VERSION, ())
    assert len(data) == NAMES_AT + NAMES_LENGTH.size + len(payload) + TRAILER.size
    assert np.array_equal(decompress(model, data), pixels)
    itx = tmp_path / "api.itx"
    itx.write_bytes(data)
    said = decompress_to(root, itx, tmp_path / "out", capsys)
    assert "names:" not in said
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [f"{i:05d}.png" for i in range(6)]
    named_data = compress(model, pixels, portable=False, names=["a", "b", "c", "d", "e", "f"])
    assert read_header(named_data).names == ("a", "b", "c", "d", "e", "f")
    with pytest.raises(CodecError, match="one str for each of the 6 images"):
        compress(model, pixels, portable=False, names=["a"])


def test_format_4_files_keep_no_names(named, tmp_path, capsys, monkeypatch):
    """A file of format 4 (as compress wrote before format 5), given names: it has no place for
    them, decodes to the same pixels under index names, and says nothing of names."""
    root, folder, _, pixels = named
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 4)
    data = tmp_path / "four.itx"
    compress_folder(root, folder, data, capsys)
    content = data.read_bytes()
    header, payload = unpack(content)
    assert (header.version, header.names) == (4, ())
    assert len(content) == NAMES_AT + len(payload) + TRAILER.size  # format 4's layout: no names list
    said = decompress_to(root, data, tmp_path / "out", capsys)
    assert "names:" not in said
    index_names = [f"{i:05d}.png" for i in range(6)]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == index_names
    assert np.array_equal(folder_pixels(tmp_path / "out", index_names), pixels)


def program(*args: str) -> subprocess.CompletedProcess:
    """``python -m imagetx.decompress ARGS`` as a program, which restarts itself with the file's
    arithmetic (the environment without the portable settings, as test_codec_portable.py runs it)."""
    env = {key: value for key, value in os.environ.items() if key not in (*PORTABLE_ENVIRONMENT, RESTARTED)}
    return subprocess.run([sys.executable, "-m", "imagetx.decompress", *args, "--progress", "false"], cwd=REPO,
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)


def test_the_committed_files_keep_no_names_and_decode_to_index_names(tmp_path):
    """tests/assets/*.itx (formats 2 and 3): no names; the portable one decodes, to a folder of
    00000.png and 00001.png holding the first two val images, as before format 5."""
    native = read_header((ASSETS / "completion_val_first2.itx").read_bytes())
    assert (native.version, native.names) == (2, ())
    data = ASSETS / "completion_val_first2_portable.itx"
    header = read_header(data.read_bytes())
    assert (header.version, header.names) == (3, ())
    out = tmp_path / "out"
    decoded = program(str(data), "--ckpt", str(SHIPPED), "--out", str(out))
    if header.arithmetic.torch != torch.__version__ and decoded.returncode != 0:
        pytest.skip(f"the file was coded with torch {header.arithmetic.torch}: {decoded.stderr.strip()}")
    assert decoded.returncode == 0, decoded.stderr
    assert "names:" not in decoded.stderr
    assert sorted(path.name for path in out.iterdir()) == ["00000.png", "00001.png"]
    expected = np.load(ASSETS / "cifar10_val_first32.npz")["images"][:2]
    assert np.array_equal(folder_pixels(out, ["00000.png", "00001.png"]), expected)


def test_the_committed_format_5_file_decodes_to_its_names(tmp_path):
    """tests/assets/completion_val_first2_format5.itx: the first two val images as one npz
    (``val.npz``), compressed by ``imagetx-compress`` of format 5 (portable arithmetic, torch
    2.14.1): its names stored in full, its coupling coefficients' tanh torch's (format 6 packs the
    names and computes the tanh itself). It decodes as it was coded, under its names."""
    data = ASSETS / "completion_val_first2_format5.itx"
    header = read_header(data.read_bytes())
    assert (header.version, header.names) == (5, ("val_00000", "val_00001"))
    out = tmp_path / "out"
    decoded = program(str(data), "--ckpt", str(SHIPPED), "--out", str(out))
    if header.arithmetic.torch != torch.__version__ and decoded.returncode != 0:
        pytest.skip(f"the file was coded with torch {header.arithmetic.torch}: {decoded.stderr.strip()}")
    assert decoded.returncode == 0, decoded.stderr
    expected = np.load(ASSETS / "cifar10_val_first32.npz")["images"][:2]
    assert np.array_equal(folder_pixels(out, ["val_00000.png", "val_00001.png"]), expected)
