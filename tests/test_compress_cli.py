"""``python -m imagetx.compress`` and ``imagetx.decompress``: pictures and npz in, the exact
pixels out; every bad input or file one ``error:`` line, exit code 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers import one_error_line, random_images, tiny_model
from imagetx import compress as compress_cli
from imagetx import decompress as decompress_cli
from imagetx.io.hub import save_pretrained


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
    result = run_json(compress_cli, [*map(str, inputs), "--ckpt", str(folders / "model"), "--out", str(out),
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
    pngs = sorted((tmp_path / "pngs").glob("*.png"))
    assert [p.name for p in pngs[:2]] == ["00000.png", "00001.png"]
    assert np.array_equal(np.stack([np.asarray(Image.open(p)) for p in pngs]), expected)


def bad_inputs(folders, tmp):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)).save(tmp / "wide.png")
    alpha = rng.integers(0, 256, (4, 4, 4), dtype=np.uint8)
    Image.fromarray(alpha).save(tmp / "alpha.png")
    Image.fromarray(rng.integers(0, 65536, (4, 4)).astype(np.uint16)).save(tmp / "grey16.png")
    (tmp / "text.png").write_text("not a picture")
    np.savez(tmp / "floats.npz", images=np.zeros((1, 4, 4, 3), np.float32))
    np.savez(tmp / "nokey.npz", pixels=np.zeros((1, 4, 4, 3), np.uint8))
    (tmp / "broken.npz").write_bytes(b"PK\x03\x04broken")
    return {"wide.png": "is 6x4", "alpha.png": "transparent", "grey16.png": "16-bit", "text.png": "not an image",
            "floats.npz": "uint8", "nokey.npz": "no array 'images'", "broken.npz": "not a readable npz",
            "missing.png": "does not exist"}


def test_bad_inputs_one_error_line(folders, tmp_path, capsys):
    for name, said in bad_inputs(folders, tmp_path).items():
        out = tmp_path / "x.itx"
        line = one_error_line(capsys, compress_cli.main, [str(tmp_path / name), "--ckpt", str(folders / "model"),
                                                          "--out", str(out)])
        assert said in line, (name, line)
        assert not out.exists()


def test_bad_files_one_error_line(folders, tmp_path, capsys):
    good = tmp_path / "good.itx"
    compress_cli.main([str(folders / "four.npz"), "--ckpt", str(folders / "model"), "--out", str(good),
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
        assert said in line, (name, line)
        assert not out.exists()
    line = one_error_line(capsys, decompress_cli.main, [str(good), "--ckpt", str(folders / "other"),
                                                        "--out", str(tmp_path / "o.npz")])
    assert "another model" in line and not (tmp_path / "o.npz").exists()
    line = one_error_line(capsys, compress_cli.main, [str(folders / "one.png"), "--ckpt", str(folders / "model"),
                                                      "--out", str(good)])
    assert "exists" in line and good.read_bytes() == data  # nothing overwritten without --force
