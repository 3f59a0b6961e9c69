"""What a compressed file spends beyond the model (issue 124, "also found by measurement"): format
5 stored an npz's names in full, 11 bytes an image for ``h100_00000`` ... ``h100_00099`` (+0.029
bits/dim on 32x32 images, unsaid); format 6 names an npz's images in a few bytes, and compress says
the file's bits/dim against the model's and what the header and names take of the difference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import imagetx.codec.api as codec_api
from helpers import random_images, tiny_model
from imagetx import compress as compress_cli
from imagetx.codec import read_header
from imagetx.codec.container import TRAILER, header_size, unpack
from imagetx.io.hub import save_pretrained
from imagetx.io.load import load_model

NATIVE = ("--portable", "false")  # this process codes with its own kernels (as test_compress_cli.py)
IMAGES = 100


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    """A tiny model and an npz of 100 of its 4x4 images, named as the issue's: (model folder, npz)."""
    root = tmp_path_factory.mktemp("overhead")
    save_pretrained(tiny_model(seed=1, head="dmol"), root / "model")
    np.savez(root / "h100.npz", images=random_images(IMAGES, 4, seed=3).numpy())
    return root / "model", root / "h100.npz"


def compressed(h100, out, capsys) -> tuple[dict, str]:
    model, npz = h100
    compress_cli.main([*NATIVE, str(npz), "--ckpt", str(model), "--out", str(out), "--progress", "false",
                       "--compare", "false"])
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def names_bytes(data: bytes) -> int:
    """The bytes of a file's names list (format 5 on)."""
    return len(data) - len(unpack(data)[1]) - TRAILER.size - header_size(read_header(data).version)


def test_an_npz_names_its_100_images_in_a_few_bytes(h100, tmp_path, capsys, monkeypatch):
    compressed(h100, tmp_path / "new.itx", capsys)
    new = (tmp_path / "new.itx").read_bytes()
    assert read_header(new).names == tuple(f"h100_{index:05d}" for index in range(IMAGES))
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 5)  # as compress wrote before
    compressed(h100, tmp_path / "old.itx", capsys)
    old = (tmp_path / "old.itx").read_bytes()
    assert names_bytes(old) == IMAGES * len("h100_00000\0") - 1
    assert names_bytes(new) < 20


def test_compress_says_the_files_overhead_over_the_model(h100, tmp_path, capsys):
    out = tmp_path / "x.itx"
    result, said = compressed(h100, out, capsys)
    images = np.load(h100[1])["images"]
    model = load_model(h100[0])
    with torch.no_grad():
        own = float(model.bits_per_dim(torch.from_numpy(images)).mean())
    file_bits_per_dim = 8 * out.stat().st_size / images.size
    assert result["model_bits_per_dim"] == pytest.approx(own, abs=1e-4)
    assert result["overhead_bits_per_dim"] == pytest.approx(file_bits_per_dim - own, abs=2e-4)
    data = out.read_bytes()
    framing = len(data) - len(unpack(data)[1])  # the header, the names list and the CRC
    assert framing == header_size(6, names_bytes(data)) + TRAILER.size
    (line,) = [line for line in said.splitlines() if line.startswith("overhead: ")]
    assert line.startswith(f"overhead: {file_bits_per_dim:.4f} bits/dim in the file against the model's {own:.4f}")
    assert f"the header and names ({framing:,} bytes) {8 * framing / images.size:+.4f}" in line
