"""The demo's compress tab without a browser (imagetx.demo.compress_tab): an upload coded
losslessly, its size beside the classical codecs', the bits map; a bad upload refused."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from helpers import tiny_model, write_pictures
from imagetx.codec import decompress
from imagetx.codec.bits_map import bits_per_pixel, colour
from imagetx.codec.classical import available, encoded
from imagetx.data.images import load_image_file
from imagetx.demo.compress_tab import SHOWN_CODECS, compress_picture
from imagetx.demo.tasks import SCALE, Models


@pytest.fixture(scope="module")
def models() -> Models:
    return Models(tiny_model(image_size=8, head="dmol"), tiny_model(seed=1, encoder_layers=1, low_res_size=2),
                  "tiny", "tiny-sr")


def test_an_upload_is_compressed_measured_and_mapped(models, tmp_path):
    photo, note = write_pictures(tmp_path)["photo.jpg"]
    original, bits_map, path, table, status = list(compress_picture(models, str(photo)))[-1]
    pixels = load_image_file(photo, 8)[0]
    data = open(path, "rb").read()
    assert np.array_equal(decompress(models.completion, data)[0], pixels.numpy())
    assert f"**{len(data):,} bytes**" in status and "the same pixels" in status, status
    assert np.array_equal(np.asarray(original)[::SCALE, ::SCALE], pixels.numpy())
    # the map alone, the shape of the pixels beside it (side by side with them it was cut off)
    expected_map = colour(bits_per_pixel(models.completion, pixels[None])[0])
    assert np.asarray(bits_map).shape == np.asarray(original).shape
    assert np.array_equal(np.asarray(bits_map)[::SCALE, ::SCALE], expected_map)
    assert "JPEG XL" in available()  # the dev extra installs the plugin
    for name in SHOWN_CODECS:
        size = len(encoded(pixels.numpy(), name))
        assert f"| {name} | {size:,} | {8 * size / 192:.2f} |" in table, table
    assert f"| imagetx (this model) | {len(data):,} |" in table


def test_a_bad_upload_is_refused(models, tmp_path):
    bad, said = write_pictures(tmp_path)["not_an_image.png"]
    *outputs, status = list(compress_picture(models, str(bad)))[-1]
    assert said in status and status.startswith("**Cannot do that**")
    assert outputs[:3] == [None, None, None]
    *_, status = list(compress_picture(models, None))[-1]
    assert "no picture" in status


def test_the_tab_says_when_what_it_coded_is_not_the_uploaded_files_own_pixels(models, tmp_path):
    """Issue 126: the tab resized a photo and compared codecs on the result without a word, where
    imagetx.compress refuses a file of another size (a lossless codec codes what it is given)."""
    photo, _ = write_pictures(tmp_path)["photo.jpg"]  # not 8x8: made 8x8 first
    *_, status = list(compress_picture(models, str(photo)))[-1]
    assert "**Not your file's own pixels**" in status and "imagetx.compress` codes a file only as it is" in status
    exact = tmp_path / "exact.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(exact)
    *_, status = list(compress_picture(models, str(exact)))[-1]
    assert "the same pixels" in status and "Not your file's own pixels" not in status, status
