"""The demo's compress tab in a real browser (as tests/demo/test_demo_browser.py drives the others):
a photo is compressed with the shipped model, the page shows the size beside PNG, WebP and
JPEG XL and the bits map, and the file it offers decompresses to the pixels it showed; a bad
upload shows why it is refused."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from helpers import write_pictures
from imagetx.codec.bits_map import MAP_SCALE
from imagetx.data.images import load_image_file
from imagetx.demo.tasks import SCALE
from test_demo_browser import (CHROMIUM_ARGS, DEFAULT_CARD_BPD, DEFAULT_MODEL, REPO, VIEWPORT,  # noqa: F401 (fixtures)
                               chromium, demo)

# One image compressed and decompressed with the shipped model: 1,024 steps each way, about 15 s
# on an idle 2-core CPU with the small model, 120 s measured beside two training runs (load 8.5);
# the GPU model the page opens on took 1.75 times the small one's coding time on a loaded machine
# (41 s against 23.5 s): still inside.
COMPRESS_MS = 300_000


def compress_upload(page, path, previous: str = "") -> str:
    """Upload ``path`` in the compress tab, press compress; the status once it is final: no
    longer ``previous`` (the last upload's, which stays on the page while the next one runs; as
    text, whitespace aside) and beginning with a result (its size, or "Cannot do that"), with
    none of Gradio's progress forms above it ("0.0s", "processing | 0.1/5.5s",
    "queue: 1/1 | 0.0/4.6s", ...). The text returned is the one the check passed on: read again,
    it could be the next moment's."""
    chooser = page.locator("#compress-upload input[type=file]")
    if not chooser.count():
        page.click("#compress-upload button[aria-label=Clear]")
        chooser = page.locator("#compress-upload input[type=file]")
    chooser.set_input_files(str(path))
    page.wait_for_selector(f'#compress-upload [aria-label="{path.name}"]')
    page.click("#compress-run")
    # the status as shown (Markdown rendered: no asterisks) once it is final
    final = page.wait_for_function(
        """previous => {
            const text = document.querySelector('#compress-status').innerText;
            const done = text.trim() !== previous.trim() && /^\\s*([\\d,]+ bytes, |Cannot do that)/.test(text);
            return done ? text : null;
        }""", arg=previous, timeout=COMPRESS_MS)
    return final.json_value()


@pytest.mark.slow
def test_the_compress_tab_codes_an_upload_exactly_and_compares_codecs(chromium, demo, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    pictures = write_pictures(tmp_path / "pictures")
    photo, note = pictures["photo.jpg"]
    prepared = load_image_file(photo, 32)[0].numpy()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT, accept_downloads=True)
            page.goto(demo)
            page.get_by_role("tab", name="compress").click()
            page.wait_for_selector("#compress-upload input[type=file]", state="attached")
            status = compress_upload(page, photo)
            assert "the same pixels" in status and note in status and f"val bits/dim {DEFAULT_CARD_BPD}" in status, status
            size = int(re.search(r"([\d,]+) bytes", status).group(1).replace(",", ""))
            table = page.inner_text("#compress-table")
            for codec in ("imagetx (this model)", "PNG", "WebP", "JPEG XL"):
                assert codec in table, table
            shown = page.locator("#compress-map img")
            shown.wait_for()
            assert shown.evaluate("img => img.naturalWidth") == 32 * MAP_SCALE  # the map alone, as the pixels
            with page.expect_download() as info:
                page.locator("#compress-file a[download]").first.click()
            data = open(info.value.path(), "rb").read()
            assert len(data) == size
            # the demo codes with portable arithmetic (its command restarts with it), as the
            # decompress command, run as a program, decodes
            assert "it decodes on any x86-64 machine" in status, status
            (tmp_path / "offered.itx").write_bytes(data)
            decoded = subprocess.run([sys.executable, "-m", "imagetx.decompress", str(tmp_path / "offered.itx"),
                                      "--ckpt", DEFAULT_MODEL, "--out",
                                      str(tmp_path / "back.png"), "--progress", "false"], cwd=REPO,
                                     capture_output=True, text=True)
            assert decoded.returncode == 0, decoded.stderr
            np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "back.png")), prepared)
            original = page.locator("#compress-original img").get_attribute("src")
            assert original  # the coded pixels are shown

            bad, said = pictures["not_an_image.png"]
            status = compress_upload(page, bad, previous=status)
            assert said in status and "Cannot do that" in status, status
        finally:
            browser.close()
    assert SCALE == 8  # the shown pictures are the 32x32 pixels enlarged 8 times
