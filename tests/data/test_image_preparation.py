"""One preparation of an image file for every path that reads one (imagetx.data.images.prepare_image):
a folder's training images, sample's --images and the demo's uploads give the same uint8 pixels for
the same file, a 16-bit PNG scaled to 8 bits and a transparent one laid on white on each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import tiny_model
from imagetx.data.images import EIGHT_BIT_MAX, SIXTEEN_BIT_MAX, load_image_file
from imagetx.data.sources import Reader, folder
from imagetx.demo.tasks import Models

SIDE = 8  # the tiny model's side: every path prepares the files at it, without resizing


def sixteen_bit_png(path: Path) -> np.ndarray:
    """A 16-bit grey PNG spanning 0..65535 (most values above 255, which 8-bit clipping turns white);
    the RGB pixels a model should see: each value scaled to 8 bits, rounded half up."""
    values = np.linspace(0, SIXTEEN_BIT_MAX, SIDE * SIDE).round().astype(np.uint16).reshape(SIDE, SIDE)
    Image.fromarray(values).save(path)
    assert Image.open(path).mode.startswith("I")  # PIL kept the 16 bits
    scaled = np.floor(values.astype(np.float64) * EIGHT_BIT_MAX / SIXTEEN_BIT_MAX + 0.5).astype(np.uint8)
    return np.repeat(scaled[..., None], 3, axis=-1)


def transparent_png(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An RGBA PNG of random colours, each pixel fully transparent, half or opaque; (its colours, alphas)."""
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
    alpha = rng.choice(np.array([0, 128, 255], np.uint8), (SIDE, SIDE))
    Image.fromarray(np.dstack([colours, alpha]), "RGBA").save(path)
    return colours, alpha


@pytest.fixture
def prepared_three_ways(tmp_path) -> dict:
    """{file name: (expected pixels or (colours, alphas), {path: pixels})} for both PNGs."""
    root = tmp_path / "pictures"
    root.mkdir()
    expected = {"deep.png": sixteen_bit_png(root / "deep.png"), "clear.png": transparent_png(root / "clear.png")}
    reader = Reader("folder", root, val_size=0, image_size=SIDE)
    trained = reader.pool("train").images
    order = [rel for rel, *_ in json.loads((reader.converted / "manifest.json").read_text())["files"]]
    demo = Models(tiny_model(image_size=SIDE), tiny_model(seed=1, encoder_layers=1, low_res_size=2), "tiny", "tiny-sr")
    return {name: (expected[name], {
        "folder training": np.asarray(trained[order.index(name)]),
        "sample --images": load_image_file(root / name, SIDE)[0].numpy(),
        "demo upload": demo.picture(str(root / name), demo.completion)[0].numpy(),
    }) for name in expected}


def test_a_16_bit_png_is_scaled_to_8_bits_on_every_path(prepared_three_ways):
    expected, by_path = prepared_three_ways["deep.png"]
    for path, pixels in by_path.items():
        np.testing.assert_array_equal(pixels, expected, err_msg=path)


def test_a_transparent_png_is_laid_on_white_on_every_path(prepared_three_ways):
    (colours, alpha), by_path = prepared_three_ways["clear.png"]
    first = by_path["folder training"]
    for path, pixels in by_path.items():
        np.testing.assert_array_equal(pixels, first, err_msg=path)  # the same pixels, exactly
    assert (first[alpha == 0] == EIGHT_BIT_MAX).all()  # transparent: white, not the hidden colour
    np.testing.assert_array_equal(first[alpha == EIGHT_BIT_MAX], colours[alpha == EIGHT_BIT_MAX])
    half = alpha == 128  # half-way between the colour and white, within PIL's rounding
    blended = (colours[half].astype(int) * 128 + EIGHT_BIT_MAX * (EIGHT_BIT_MAX - 128)) / EIGHT_BIT_MAX
    assert np.abs(first[half] - blended).max() <= 1


def test_a_conversion_by_an_earlier_format_is_converted_again(tmp_path, capsys):
    """A folder converted when images were prepared otherwise (format 1 clipped 16-bit values) is not
    trained on as it was: converted again, with a note."""
    root = tmp_path / "pictures"
    root.mkdir()
    expected = sixteen_bit_png(root / "deep.png")
    out = folder.convert(root, SIDE)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    stale = np.full((1, SIDE, SIDE, 3), EIGHT_BIT_MAX, np.uint8)  # what format 1 stored: clipped white
    folder.write_npz(folder.shard_path(out, 0), {"images": stale, "labels": np.full(1, -1, np.int64),
                                                 "skipped": np.zeros(0, str)})
    np.testing.assert_array_equal(folder.read(root, image_size=SIDE).images[0], expected)
    assert "converting again" in capsys.readouterr().err
