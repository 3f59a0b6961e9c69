"""What ``imagetx.decompress`` may replace at ``--out`` (issue 124, item 3 and item 10's codec
share): --force replaces only what a decode of this file writes, its exact file names, judged
before the decode and again when it replaces, so that neither a user's index-named PNGs nor a
file saved during the decode is deleted; a link given as --out leaves nothing beside it; a
folder given as the compressed file is said to be one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import imagetx.codec.api as codec_api
from helpers import one_error_line, random_images, tiny_model
from imagetx import compress as compress_cli
from imagetx import decompress as decompress_cli
from imagetx.codec.container import pack, unpack
from imagetx.io.hub import save_pretrained

NATIVE = ("--portable", "false")  # this process codes with its own kernels (as test_compress_cli.py)


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    """A model and a file of four images without names (as from Python: decoded to 00000.png ...
    00003.png): (the model's folder, the file, its pixels)."""
    root = tmp_path_factory.mktemp("out")
    save_pretrained(tiny_model(seed=1, head="dmol"), root / "model")
    images = random_images(4, 4, seed=3).numpy()
    np.savez(root / "four.npz", images=images)
    data = root / "four.itx"
    compress_cli.main([*NATIVE, str(root / "four.npz"), "--ckpt", str(root / "model"), "--out", str(data),
                       "--progress", "false"])
    header, payload = unpack(data.read_bytes())
    data.write_bytes(pack(dataclasses.replace(header, names=()), payload))
    return root / "model", data, images


def decompress_args(model: Path, data: Path, out: Path, *more: str) -> list[str]:
    return [str(data), "--ckpt", str(model), "--out", str(out), "--progress", "false", *more]


def decoded(out: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(path)) for path in sorted(out.iterdir())])


def contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_force_replaces_a_decode_of_the_same_names_only(coded, tmp_path, capsys):
    """The issue: any NNNNN.png counted as the decoder's own, so --force deleted a user's 00001.png
    ... 00010.png (rc 0). Now a folder holding a PNG this decode does not write is refused, as it
    was, in one line; one holding only the PNGs it writes (again, or some of them) is replaced."""
    model, data, images = coded
    mine = tmp_path / "mine"
    mine.mkdir()
    for index in range(1, 11):
        (mine / f"{index:05d}.png").write_bytes(b"the user's own")
    before = contents(mine)
    line = one_error_line(capsys, decompress_cli.main, decompress_args(model, data, mine, "--force"))
    assert "not a folder of decoded PNGs only (it holds '00004.png')" in line, line
    assert contents(mine) == before
    out = tmp_path / "out"
    decompress_cli.main(decompress_args(model, data, out))
    (out / "00002.png").unlink()  # a subset of what it writes is still replaced
    decompress_cli.main(decompress_args(model, data, out, "--force"))
    assert np.array_equal(decoded(out), images)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine", "out"]  # nothing left beside


def saving_during_the_decode(monkeypatch, save) -> None:
    """The decode, followed by ``save()``: what a user does in the hours a large file takes."""
    real = codec_api.decompress

    def decode_then_save(*args, **kwargs):
        images = real(*args, **kwargs)
        save()
        return images

    monkeypatch.setattr(codec_api, "decompress", decode_then_save)


def test_a_file_saved_in_out_during_the_decode_is_kept(coded, tmp_path, capsys, monkeypatch):
    """The issue: the folder was judged before a decode that can take hours, so a file saved there
    meanwhile was deleted (rc 0). It is judged again when replaced: refused, everything kept."""
    model, data, images = coded
    out = tmp_path / "out"
    decompress_cli.main(decompress_args(model, data, out))
    saving_during_the_decode(monkeypatch, lambda: (out / "notes.txt").write_text("written meanwhile"))
    line = one_error_line(capsys, decompress_cli.main, decompress_args(model, data, out, "--force"))
    assert "it holds 'notes.txt'" in line and "nothing was written" in line, line
    assert (out / "notes.txt").read_text() == "written meanwhile"
    assert np.array_equal(np.stack([np.asarray(Image.open(out / f"{index:05d}.png")) for index in range(4)]),
                          images)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]  # no staging folder left


@pytest.mark.parametrize("kind", ["folder", "npz"])
def test_an_out_made_during_the_decode_is_not_replaced_without_force(coded, tmp_path, capsys, monkeypatch, kind):
    """Without --force nothing is replaced, though --out did not exist when the decode began."""
    model, data, _ = coded
    out = tmp_path / ("out" if kind == "folder" else "out.npz")

    def save() -> None:
        if kind == "folder":
            out.mkdir()
            (out / "00000.png").write_bytes(b"the user's own")
        else:
            out.write_bytes(b"the user's own")

    saving_during_the_decode(monkeypatch, save)
    line = one_error_line(capsys, decompress_cli.main, decompress_args(model, data, out))
    assert "exists" in line and "give --force" in line, line
    saved = out / "00000.png" if kind == "folder" else out
    assert saved.read_bytes() == b"the user's own"
    assert sorted(path.name for path in tmp_path.iterdir()) == [out.name]


def test_a_link_given_as_out_is_replaced_and_nothing_left_beside(coded, tmp_path, capsys):
    """The issue: --force over a link to a decoded folder left a ``.NAME.XXXX.tmp.old`` link beside
    --out. The link is replaced by the folder; the folder it pointed to stays as it was."""
    model, data, images = coded
    target = tmp_path / "target"
    decompress_cli.main(decompress_args(model, data, target))
    before = contents(target)
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    decompress_cli.main(decompress_args(model, data, link, "--force"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["link", "target"]
    assert link.is_dir() and not link.is_symlink() and np.array_equal(decoded(link), images)
    assert contents(target) == before


def test_a_folder_given_as_the_compressed_file_is_said_to_be_one(coded, tmp_path, capsys):
    """The issue: a folder given as the file was said not to exist."""
    model, _, _ = coded
    line = one_error_line(capsys, decompress_cli.main, decompress_args(model, tmp_path, tmp_path / "out"))
    assert "is a folder, not a compressed file" in line and "does not exist" not in line, line
    assert not (tmp_path / "out").exists()
