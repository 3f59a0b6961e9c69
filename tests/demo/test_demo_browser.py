"""The demo page in a real browser: ``python -m imagetx.demo`` with the shipped models, driven
by Playwright through Debian's chromium. A photo is completed and the downloaded sample keeps
its rows; a bad upload and one over the size limit show why they are refused; the page then
still completes the next picture.

With IMAGETX_DEMO_SCREENSHOT=docs/demo.png the page is also photographed after completing a
bundled example (the README's screenshot). Without chromium the test is skipped, or fails
under CI=true, saying how to install it.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import write_pictures
from imagetx.data.images import MAX_FILE_BYTES, load_image_file
from imagetx.demo.__main__ import DEFAULT_MODEL
from imagetx.demo.tasks import SCALE, card_bits_per_dim

REPO = Path(__file__).resolve().parents[2]
INSTALL = "apt-get install -y chromium"
# a headless browser that reaches nothing but the page: no first-run, sync, update or QUIC traffic
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
STARTUP_SECONDS = 180  # importing torch and Gradio and loading two models on a busy 2-core CPU
SAMPLING_MS = 90_000  # a few rows of one sample take seconds; generous for a loaded CI machine
ROWS = 28  # four rows left to draw: 128 steps of one sample
SCREENSHOT_LIMIT = 300_000  # bytes: a README picture, not a page's worth of raw pixels
DEFAULT_CARD_BPD = card_bits_per_dim(DEFAULT_MODEL)  # of the model the page opens on (the GPU one, shipped)
VIEWPORT = {"width": 1280, "height": 900}  # a laptop screen: the four samples of a row side by side


@pytest.fixture
def chromium() -> str:
    """The system browser's path, looked for before the demo is started."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
    if path:
        return path
    reason = f"no chromium here to drive the demo page: {INSTALL}"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def demo(tmp_path):
    """The demo's address, served by ``python -m imagetx.demo`` with its defaults (the shipped models)."""
    port = free_port()
    # its files (Gradio's cache, the downloads) under tmp_path; one core: the suite shares the machine
    env = dict(os.environ, GRADIO_TEMP_DIR=str(tmp_path / "gradio"), TMPDIR=str(tmp_path),
               GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1")
    log = (tmp_path / "demo.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "imagetx.demo", "--port", str(port)], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert server.poll() is None, (tmp_path / "demo.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(url, timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo did not start: " + (tmp_path / "demo.log").read_text()
                time.sleep(0.5)
        yield url
        assert server.poll() is None, "the demo stopped: " + (tmp_path / "demo.log").read_text()[-3000:]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def upload(page, path: Path, arrives: bool = True) -> None:
    """Put ``path`` in the complete tab's upload box, replacing what is there (a box that holds a
    file has no file input until it is cleared); with ``arrives``, wait until it is uploaded."""
    chooser = page.locator("#complete-upload input[type=file]")
    if not chooser.count():
        page.click("#complete-upload button[aria-label=Clear]")
    chooser.set_input_files(str(path))
    if arrives:
        arrived(page, path.name)


def arrived(page, name: str) -> None:
    """Wait until the upload box lists the file ``name``: the upload is on the server."""
    page.wait_for_selector(f'#complete-upload [aria-label="{name}"]')


def run(page, rows: int, count: int, expected: str) -> str:
    """Complete what is uploaded; the status once it contains ``expected``."""
    for name, value in (("rows", rows), ("count", count)):
        box = f"#complete-{name} input[type=number]"
        page.fill(box, str(value))
        page.press(box, "Enter")
    page.click("#complete-run")
    page.wait_for_function("text => document.querySelector('#complete-status').innerText.includes(text)",
                           arg=expected, timeout=SAMPLING_MS)
    return page.inner_text("#complete-status")


def downloaded_sample(page) -> tuple[str, np.ndarray]:
    """(file name, pixels) of the first sample's PNG, downloaded as a user would."""
    with page.expect_download() as info:
        page.locator("#complete-files a[download]").first.click()
    download = info.value
    return download.suggested_filename, np.asarray(Image.open(download.path()).convert("RGB"))


def screenshot(page, url: str, path: Path) -> None:
    """A fresh page after completing a bundled example, 4 samples from the top 16 rows, as a PNG
    under the size limit (palette colours if the full-colour one is larger)."""
    page.goto(url)
    page.get_by_text("car_45013.png", exact=True).locator("visible=true").first.click()
    arrived(page, "car_45013.png")
    run(page, 16, 4, "4 sample(s) from the top 16 rows")
    image = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
    if path.stat().st_size > SCREENSHOT_LIMIT:
        image.quantize(256).save(path, optimize=True)
    assert path.stat().st_size <= SCREENSHOT_LIMIT, path.stat().st_size


@pytest.mark.slow
def test_the_page_completes_an_upload_refuses_bad_ones_and_keeps_serving(chromium, demo, tmp_path):
    from playwright.sync_api import sync_playwright

    pictures = write_pictures(tmp_path / "pictures")
    photo, note = pictures["photo.jpg"]
    prepared = load_image_file(photo, 32)[0].numpy()
    huge = tmp_path / "huge.png"
    with huge.open("wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)  # sparse: over the limit without writing 20 MB

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT, accept_downloads=True)
            page.goto(demo)
            page.wait_for_selector("#complete-upload input[type=file]", state="attached")  # the page is drawn
            upload(page, photo)
            status = run(page, ROWS, 1, "of sampling")
            assert note in status and f"val bits/dim {DEFAULT_CARD_BPD}" in status, status
            name, sample = downloaded_sample(page)
            assert name == "photo-completion-1.png" and sample.shape == (32 * SCALE, 32 * SCALE, 3)
            np.testing.assert_array_equal(sample[::SCALE, ::SCALE][:ROWS], prepared[:ROWS])

            bad, said = pictures["not_an_image.png"]
            upload(page, bad)
            assert said in run(page, ROWS, 1, said)

            upload(page, huge, arrives=False)  # refused by the page before it is sent
            toast = page.locator(".toast-body", has_text="exceed the maximum allowed size")
            toast.wait_for(timeout=SAMPLING_MS)

            cmyk, said = pictures["cmyk.jpg"]  # the next request is served as the first was
            upload(page, cmyk)
            status = run(page, ROWS, 1, said)
            assert "of sampling" in status, status
            name, sample = downloaded_sample(page)
            assert name == "cmyk-completion-1.png"
            np.testing.assert_array_equal(sample[::SCALE, ::SCALE][:ROWS], load_image_file(cmyk, 32)[0][:ROWS].numpy())

            if os.environ.get("IMAGETX_DEMO_SCREENSHOT"):
                screenshot(browser.new_page(viewport=VIEWPORT), demo, REPO / os.environ["IMAGETX_DEMO_SCREENSHOT"])
        finally:
            browser.close()
