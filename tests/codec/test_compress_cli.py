"""``python -m imagetx.compress`` and ``imagetx.decompress``: pictures and npz in, the exact
pixels out (or a refusal: never other pixels); every bad input or file one ``error:`` line, exit
code 2, nothing written; outputs replaced whole; Ctrl-C one line, exit status 130."""

from __future__ import annotations

import dataclasses
import json
import stat
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import one_error_line, random_images, tiny_model
from imagetx import compress as compress_cli
from imagetx import decompress as decompress_cli
from imagetx.codec import files
from imagetx.codec.container import pack, unpack
from imagetx.io.hub import save_pretrained

# In this process the codec runs on this machine's own kernels; tests/codec/test_codec_portable.py runs
# the commands as programs, with portable arithmetic, in processes of their own.
NATIVE = ("--portable", "false")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("codec")
    model = tiny_model(seed=1, head="dmol")
    save_pretrained(model, root / "model")
    save_pretrained(tiny_model(seed=2, head="dmol"), root / "other")
    images = random_images(4, 4, seed=3).numpy()
    np.savez(root / "four.npz", images=images)
    Image.fromarray(images[0]).save(root / "one.png")
    Image.fromarray(images[1]).save(root / "two.jpg", quality=80)  # coded as the pixels it decodes to
    Image.fromarray(images[2]).convert("P").save(root / "palette.png")  # exact after the lookup
    return root


def run_json(command, args, capsys) -> dict:
    command.main(args)
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_pictures_and_npz_round_trip(folders, tmp_path, capsys):
    inputs = [folders / "four.npz", folders / "one.png", folders / "two.jpg", folders / "palette.png"]
    out = tmp_path / "all.itx"
    result = run_json(compress_cli, [*NATIVE, *map(str, inputs), "--ckpt", str(folders / "model"), "--out", str(out),
                                     "--batch", "3", "--progress", "false"], capsys)
    assert result["images"] == 7 and result["bytes"] == out.stat().st_size
    assert result["bits_per_dim"] == pytest.approx(8 * result["bytes"] / (7 * 48), abs=1e-4)
    expected = np.concatenate([np.load(folders / "four.npz")["images"],
                               *[np.asarray(Image.open(p).convert("RGB"))[None] for p in inputs[1:]]])
    run_json(decompress_cli, [str(out), "--ckpt", str(folders / "model"), "--out", str(tmp_path / "back.npz"),
                              "--progress", "false"], capsys)
    assert np.array_equal(np.load(tmp_path / "back.npz")["images"], expected)
    result = run_json(decompress_cli, [str(out), "--ckpt", str(folders / "model"), "--out", str(tmp_path / "pngs"),
                                       "--progress", "false"], capsys)
    assert result["files"] == 7
    names = ["four_00000.png", "four_00001.png", "four_00002.png", "four_00003.png", "one.png", "two.png",
             "palette.png"]  # each image under its file's name (format 5), in the order given
    assert sorted(p.name for p in (tmp_path / "pngs").iterdir()) == sorted(names)
    assert np.array_equal(np.stack([np.asarray(Image.open(tmp_path / "pngs" / name)) for name in names]), expected)


def sixteen_bit_png(path: Path, samples: np.ndarray) -> None:
    """A 16-bit PNG of (H, W, 3) RGB or (H, W, 4) RGBA uint16 samples, written by hand: PIL
    writes no 16-bit colour PNG (it reads one as 8 bits, which is the bug this catches)."""
    height, width, channels = samples.shape
    colour_type = {3: 2, 4: 6}[channels]  # the PNG colour types of RGB and RGBA
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in samples)  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))


def bad_inputs(folders, tmp):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    sixteen_bit_png(tmp / "rgb16.png", np.full((4, 4, 3), 25707, np.uint16))  # issue 74: came back as 25700
    sixteen_bit_png(tmp / "rgba16.png", np.full((4, 4, 4), 65535, np.uint16))  # opaque, still 16-bit
    frames = [Image.fromarray(np.roll(pixels, shift, axis=0)).convert("P") for shift in range(3)]
    frames[0].save(tmp / "animated.gif", save_all=True, append_images=frames[1:])
    Image.fromarray(pixels).convert("CMYK").save(tmp / "cmyk.jpg")
    Image.fromarray(pixels).save(tmp / "picture.tiff")  # PIL reads 16-bit TIFFs as 8 bits: refused
    Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)).save(tmp / "wide.png")
    alpha = rng.integers(0, 256, (4, 4, 4), dtype=np.uint8)
    Image.fromarray(alpha).save(tmp / "alpha.png")
    Image.fromarray(rng.integers(0, 65536, (4, 4)).astype(np.uint16)).save(tmp / "grey16.png")
    (tmp / "text.png").write_text("not a picture")
    np.savez(tmp / "floats.npz", images=np.zeros((1, 4, 4, 3), np.float32))
    np.savez(tmp / "nokey.npz", pixels=np.zeros((1, 4, 4, 3), np.uint8))
    (tmp / "broken.npz").write_bytes(b"PK\x03\x04broken")
    for empty in ("empty.png", "empty.npz"):
        (tmp / empty).write_bytes(b"")
    return {"rgb16.png": "samples are 16-bit", "rgba16.png": "samples are 16-bit", "animated.gif": "of its 3 frames",
            "cmyk.jpg": "converted from CMYK", "picture.tiff": "give it as a PNG",
            "wide.png": "is 6x4", "alpha.png": "transparent", "grey16.png": "16-bit", "text.png": "not an image",
            "floats.npz": "uint8", "nokey.npz": "no array 'images'", "broken.npz": "not a readable npz",
            "missing.png": "does not exist", "empty.png": "is empty (0 bytes)", "empty.npz": "is empty (0 bytes)"}


def test_bad_inputs_one_error_line(folders, tmp_path, capsys):
    for name, said in bad_inputs(folders, tmp_path).items():
        out = tmp_path / "x.itx"
        line = one_error_line(capsys, compress_cli.main, [*NATIVE, str(tmp_path / name),
                                                          "--ckpt", str(folders / "model"), "--out", str(out)])
        assert said in line, (name, line)
        assert not out.exists()


def test_bad_files_one_error_line(folders, tmp_path, capsys):
    good = tmp_path / "good.itx"
    compress_cli.main([*NATIVE, str(folders / "four.npz"), "--ckpt", str(folders / "model"), "--out", str(good),
                       "--progress", "false"])
    data = good.read_bytes()
    files = {"truncated.itx": (data[:-7], "truncated"), "damaged.itx": (data[:50] + bytes([data[50] ^ 1]) + data[51:],
                                                                         "damaged"),
             "png.itx": ((folders / "one.png").read_bytes(), "not an imagetx compressed file"),
             "empty.itx": (b"", "not an imagetx compressed file")}
    for name, (content, said) in files.items():
        (tmp_path / name).write_bytes(content)
        out = tmp_path / "out.npz"
        line = one_error_line(capsys, decompress_cli.main, [str(tmp_path / name), "--ckpt", str(folders / "model"),
                                                            "--out", str(out)])
        assert said in line and name in line, (name, line)  # the problem, and the file that has it
        assert not out.exists()
    line = one_error_line(capsys, decompress_cli.main, [str(good), "--ckpt", str(folders / "other"),
                                                        "--out", str(tmp_path / "o.npz")])
    assert "another model" in line and not (tmp_path / "o.npz").exists()
    line = one_error_line(capsys, compress_cli.main, [*NATIVE, str(folders / "one.png"),
                                                      "--ckpt", str(folders / "model"), "--out", str(good)])
    assert "exists" in line and good.read_bytes() == data  # nothing overwritten without --force


def test_each_input_says_what_it_gave_and_lossless_conversions_round_trip(folders, tmp_path, capsys):
    """Issue 74: what compress accepts, and how it made it RGB without changing a value, is one
    line per input; the decoded pixels are the file's own."""
    rng = np.random.default_rng(1)
    grey = rng.integers(0, 256, (4, 4), dtype=np.uint8)
    Image.fromarray(grey).save(tmp_path / "grey.png")
    opaque = np.concatenate([rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), np.full((4, 4, 1), 255, np.uint8)], -1)
    Image.fromarray(opaque).save(tmp_path / "opaque.png")
    Image.fromarray(opaque[..., :3]).convert("P").save(tmp_path / "one_frame.gif")
    inputs = [folders / "palette.png", tmp_path / "grey.png", tmp_path / "opaque.png", tmp_path / "one_frame.gif",
              folders / "four.npz"]
    out = tmp_path / "x.itx"
    compress_cli.main([*NATIVE, *map(str, inputs), "--ckpt", str(folders / "model"), "--out", str(out),
                       "--progress", "false"])
    lines = capsys.readouterr().err.splitlines()
    assert lines[:5] == [
        "input palette.png: PNG 4x4 P, coded as RGB with the same values (palette colours looked up)",
        "input grey.png: PNG 4x4 L, coded as RGB with the same values (grey spread to RGB)",
        "input opaque.png: PNG 4x4 RGBA, coded as RGB with the same values (its alpha channel, opaque "
        "everywhere, dropped)",
        "input one_frame.gif: GIF 4x4 P, coded as RGB with the same values (palette colours looked up)",
        "input four.npz: 4 images 4x4 RGB (npz array 'images')"], lines
    back = tmp_path / "back.npz"
    decompress_cli.main([str(out), "--ckpt", str(folders / "model"), "--out", str(back), "--progress", "false"])
    expected = [np.asarray(Image.open(inputs[0]).convert("RGB")), grey[..., None].repeat(3, -1), opaque[..., :3],
                np.asarray(Image.open(inputs[3]).convert("RGB"))]
    assert np.array_equal(np.load(back)["images"], np.concatenate([np.stack(expected),
                                                                   np.load(folders / "four.npz")["images"]]))


def compress_one(folders, tmp_path, source="one.png") -> Path:
    out = tmp_path / f"{source}.itx"
    compress_cli.main([*NATIVE, str(folders / source), "--ckpt", str(folders / "model"), "--out", str(out),
                       "--progress", "false"])
    return out


def decompress_args(folders, data: Path, out: Path, *more: str) -> list[str]:
    return [str(data), "--ckpt", str(folders / "model"), "--out", str(out), "--progress", "false", *more]


def test_force_is_a_bare_flag_and_still_takes_true_or_false(folders, tmp_path, capsys):
    """Issue 74: ``--force`` alone failed ("expected one argument") though errors say "give --force"."""
    data = compress_one(folders, tmp_path)
    out = tmp_path / "one.npz"
    decompress_cli.main(decompress_args(folders, data, out))
    for force in (["--force"], ["--force", "true"], ["--force=true"]):
        decompress_cli.main(decompress_args(folders, data, out, *force))
    line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, data, out, "--force", "false"))
    assert "exists" in line and "give --force" in line
    compress_cli.main([*NATIVE, str(folders / "one.png"), "--ckpt", str(folders / "model"), "--out", str(data),
                       "--force", "--progress", "false"])


def test_force_replaces_an_earlier_decode_whole(folders, tmp_path, capsys):
    """Issue 74: decoding a file of one image over a folder holding a decode of four left the old
    00001-00003.png beside the new 00000.png. The folder is replaced as a whole, and only where it
    holds nothing but what this decode writes (issue 124: the other three were deleted, though a
    decode of one image does not write them, and may be the user's own): a folder holding anything
    else is not deleted even with --force. (Here the files have no names, decoded to 00000.png,
    ...: a folder of another file's named PNGs is not replaced either, test_names.py.)"""
    four = tmp_path / "four.itx"
    compress_cli.main([*NATIVE, str(folders / "four.npz"), "--ckpt", str(folders / "model"), "--out", str(four),
                       "--progress", "false"])
    header, payload = unpack(four.read_bytes())
    four.write_bytes(pack(dataclasses.replace(header, names=()), payload))  # as from Python: no names
    one = compress_one(folders, tmp_path)
    header, payload = unpack(one.read_bytes())
    one.write_bytes(pack(dataclasses.replace(header, names=()), payload))  # decoded to 00000.png
    out = tmp_path / "decoded"
    decompress_cli.main(decompress_args(folders, four, out))
    (out / "00000.png").write_bytes(b"replaced")
    decompress_cli.main(decompress_args(folders, four, out, "--force", "true"))  # as the issue ran it
    assert sorted(path.name for path in out.iterdir()) == [f"{index:05d}.png" for index in range(4)]
    assert np.array_equal(np.asarray(Image.open(out / "00000.png")), np.load(folders / "four.npz")["images"][0])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["decoded", "four.itx", "one.png.itx"]  # nothing beside
    line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, one, out, "--force"))
    assert "not a folder of decoded PNGs only (it holds '00001.png')" in line and len(list(out.iterdir())) == 4
    (out / "notes.txt").write_text("mine")
    line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, four, out, "--force"))
    assert "not a folder of decoded PNGs only" in line and (out / "notes.txt").exists()


def test_out_png_is_one_picture_and_other_picture_suffixes_are_refused(folders, tmp_path, capsys):
    """Issue 74: ``--out out.png`` made a folder named out.png."""
    one = compress_one(folders, tmp_path)
    out = tmp_path / "out.png"
    result = run_json(decompress_cli, decompress_args(folders, one, out), capsys)
    assert out.is_file() and result["files"] == 1
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(Image.open(folders / "one.png")))
    four = tmp_path / "four.itx"
    compress_cli.main([*NATIVE, str(folders / "four.npz"), "--ckpt", str(folders / "model"), "--out", str(four),
                       "--progress", "false"])
    for name, said in (("many.png", "holds 4 images"), ("out.jpg", "not .jpg")):
        line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, four, tmp_path / name))
        assert said in line and not (tmp_path / name).exists(), line


def test_an_unwritable_out_is_one_line_naming_it(folders, tmp_path, capsys):
    """Issue 74: raw OS errors named the temporary file (/proc/.x.itx.....tmp). Refused before
    any coding, naming the user's path."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    outs = [blocker / "x.itx"] + ([Path("/proc/x.itx")] if Path("/proc").is_dir() else [])
    for out in outs:
        line = one_error_line(capsys, compress_cli.main, [*NATIVE, str(folders / "one.png"),
                                                          "--ckpt", str(folders / "model"), "--out", str(out)])
        assert line.startswith(f"error: cannot write {out}: ") and ".tmp" not in line, line
    one = compress_one(folders, tmp_path)
    line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, one, blocker / "pngs"))
    assert line.startswith(f"error: cannot write {blocker / 'pngs'}: "), line


def test_a_folder_of_inputs_is_its_pictures_and_npz_files_in_name_order(folders, tmp_path, capsys):
    """A folder given as input: its pictures and npz files, in name order (hidden files and
    other files left out), said in one line; a folder with none is one error line."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("one.png", "four.npz", "palette.png"):
        (inputs / name).write_bytes((folders / name).read_bytes())
    (inputs / "notes.txt").write_text("not an image")
    (inputs / ".hidden.png").write_bytes((folders / "one.png").read_bytes())
    out = tmp_path / "folder.itx"
    result = run_json(compress_cli, [*NATIVE, str(inputs), "--ckpt", str(folders / "model"), "--out", str(out),
                                     "--progress", "false"], capsys)
    assert result["images"] == 6
    decompress_cli.main(decompress_args(folders, out, tmp_path / "back.npz"))
    expected = np.concatenate([np.load(folders / "four.npz")["images"],
                               *[np.asarray(Image.open(folders / name).convert("RGB"))[None]
                                 for name in ("one.png", "palette.png")]])  # four.npz, one.png, palette.png
    assert np.array_equal(np.load(tmp_path / "back.npz")["images"], expected)
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_error_line(capsys, compress_cli.main, [*NATIVE, str(empty), "--ckpt", str(folders / "model"),
                                                      "--out", str(tmp_path / "none.itx")])
    assert f"input folder {empty} holds no pictures or npz files" in line


def test_a_missing_folder_of_out_is_refused_not_made(folders, tmp_path, capsys):
    """A mistyped --out is not made into folders: one line naming the missing folder."""
    out = tmp_path / "no" / "such" / "x.itx"
    line = one_error_line(capsys, compress_cli.main, [*NATIVE, str(folders / "one.png"),
                                                      "--ckpt", str(folders / "model"), "--out", str(out)])
    assert f"the folder {out.parent} does not exist" in line and not (tmp_path / "no").exists()
    line = one_error_line(capsys, decompress_cli.main, decompress_args(folders, compress_one(folders, tmp_path),
                                                                       tmp_path / "no" / "pngs"))
    assert "does not exist" in line and not (tmp_path / "no").exists()


def test_a_decoded_folder_has_the_usual_permissions(folders, tmp_path, capsys):
    """A decoded folder is made as mkdir makes one (umask applied), not private (mkdtemp's 0700)."""
    out = tmp_path / "pngs"
    decompress_cli.main(decompress_args(folders, compress_one(folders, tmp_path), out))
    reference = tmp_path / "made_by_mkdir"
    reference.mkdir()
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode)


def interrupted(capsys, command, args) -> str:
    """Run a command that Ctrl-C stops: exit status 130 and one line (cli/common.py's
    run_or_exit words it), no traceback."""
    with pytest.raises(SystemExit) as info:
        try:
            command(args)
        except KeyboardInterrupt:  # escaping, it would stop the whole test session
            pytest.fail("Ctrl-C escaped the command: a traceback, not one line")
    assert info.value.code == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert "interrupted (Ctrl-C)" in lines[-1], lines
    assert all(line.startswith("input ") for line in lines[:-1]), lines  # what it had read, then the one line
    return lines[-1]


def test_ctrl_c_is_one_line_exit_130_and_leaves_nothing_half_written(folders, tmp_path, capsys, monkeypatch):
    """Issue 74: Ctrl-C printed a 41-line traceback. Stopped while coding or while writing a
    folder over an earlier decode: nothing new, the earlier output as it was, nothing beside it."""
    four = tmp_path / "four.itx"
    compress_cli.main([*NATIVE, str(folders / "four.npz"), "--ckpt", str(folders / "model"), "--out", str(four),
                       "--progress", "false"])
    out = tmp_path / "decoded"
    decompress_cli.main(decompress_args(folders, four, out))
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    one = compress_one(folders, tmp_path)
    capsys.readouterr()

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("imagetx.codec.api.compress_with_stats", ctrl_c)  # compress imports it as it runs
    interrupted(capsys, compress_cli.main, [*NATIVE, str(folders / "one.png"), "--ckpt", str(folders / "model"),
                                            "--out", str(tmp_path / "new.itx")])
    written = []

    def png_then_ctrl_c(image):  # Ctrl-C while the third PNG of the new folder is written
        if len(written) == 2:
            raise KeyboardInterrupt
        written.append(image)
        return png_bytes(image)

    png_bytes = files.png_bytes
    monkeypatch.setattr(files, "png_bytes", png_then_ctrl_c)
    interrupted(capsys, decompress_cli.main, decompress_args(folders, four, out, "--force"))
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["decoded", "four.itx", "one.png.itx"]
    assert one.exists()


def test_each_picture_is_said_beside_its_png_and_webp_and_a_folder_in_one_line(folders, tmp_path, capsys):
    """As the demo's compress tab: a picture's bits/dim under the model beside its own PNG's and
    WebP's; a folder (or an npz) one line of the means, not a line per file; the JSON the totals."""
    import torch

    from imagetx.codec.classical import sizes
    from imagetx.io.load import load_model

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("one.png", "palette.png", "four.npz"):
        (inputs / name).write_bytes((folders / name).read_bytes())
    args = [*NATIVE, str(inputs), str(folders / "one.png"), "--ckpt", str(folders / "model"),
            "--out", str(tmp_path / "x.itx"), "--progress", "false"]
    compress_cli.main(args)
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    lines = captured.err.strip().splitlines()
    assert [line for line in lines if line.startswith("input ")] == [f"input {inputs}: 6 images from 3 files",
                                                                   "input one.png: PNG 4x4 RGB"]
    model, one = load_model(folders / "model"), np.asarray(Image.open(folders / "one.png"))
    with torch.no_grad():
        own = model.bits_per_dim(torch.from_numpy(one[None]))[0].item()
    png, webp = sizes(one, ["PNG", "WebP"]).values()
    dims = one.size
    assert f"one.png: {own:.2f} bits/dim under the model; as a file PNG {8 * png / dims:.2f} ({png:,} bytes), " \
           f"WebP {8 * webp / dims:.2f} ({webp:,} bytes)" in lines
    (folder_line,) = [line for line in lines if line.startswith(f"{inputs}: ")]
    assert folder_line.startswith(f"{inputs}: 6 images, ") and "PNG" in folder_line and "WebP" in folder_line
    every = np.concatenate([np.load(folders / "four.npz")["images"],
                            *[np.asarray(Image.open(inputs / name).convert("RGB"))[None]
                              for name in ("one.png", "palette.png")], one[None]])
    assert result["png_bytes"] == sum(sizes(image, ["PNG"])["PNG"] for image in every)
    assert result["webp_bits_per_dim"] == pytest.approx(
        8 * sum(sizes(image, ["WebP"])["WebP"] for image in every) / every.size, abs=1e-4)
    compress_cli.main([*args, "--force", "--compare", "false"])
    assert "png_bytes" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
