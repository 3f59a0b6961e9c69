"""The demo's "compress" tab: an upload coded losslessly with the completion model
(imagetx.codec), its size beside PNG, WebP and JPEG XL of the same pixels, and where the bits
go, as a picture. ``compress_picture`` is the task (a generator like ``tasks.py``'s, never
raising for a bad upload); ``add_tab`` lays the tab out inside the page's Blocks."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr
import numpy as np
import torch

from ..codec import compress, decompress
from ..codec.arithmetic import current
from ..codec.bits_map import SCALE_BITS, bits_per_pixel, colour
from ..codec.classical import available, sizes
from ..codec.container import CodecError
from ..codec.files import read_picture_exactly
from ..errors import UserError
from .tasks import Models, refused, seconds, shown

# The table's codecs beside imagetx's: the lossless formats people use for pictures (JPEG 2000 is in
# docs/results.md).
SHOWN_CODECS = ("PNG", "WebP", "JPEG XL")


def size_table(coded: int, dims: int, others: dict[str, int]) -> str:
    """A Markdown table: each codec's bytes and bits/dim for the same pixels, smallest first."""
    rows = sorted([("imagetx (this model)", coded), *others.items()], key=lambda row: row[1])
    lines = ["| codec | bytes | bits/dim |", "|---|---|---|"]
    lines += [f"| {name} | {size:,} | {8 * size / dims:.2f} |" for name, size in rows]
    return "\n".join(lines)


def own_pixels(upload: str, pixels: np.ndarray) -> bool:
    """Whether ``pixels`` (the page's 32×32) are the uploaded file's own, as ``imagetx.compress`` would
    read it: a lossless codec codes what it is given, and a resized photo is no longer the user's file."""
    try:
        exact, _ = read_picture_exactly(Path(upload), pixels.shape[0])
    except CodecError:  # another size, or pixels an 8-bit reading would change
        return False
    return bool(np.array_equal(exact[0], pixels))


def compress_picture(models: Models, upload: str | None) -> Iterator[tuple]:
    """Outputs (the pixels coded, enlarged; the bits map, enlarged; the compressed file; the size
    table; status)."""
    model = models.completion
    try:
        picture, note, preparing = models.picture(upload, model)  # the 32×32 pixels every tab uses
        pixels = picture.numpy()
        yield shown(picture), None, None, "", "compressing..."
        started = time.perf_counter()
        arithmetic = current()  # the demo's command restarts with portable arithmetic (arithmetic.py)
        data = compress(model, pixels[None], batch=1, portable=arithmetic.portable)
        coding = time.perf_counter() - started
        started = time.perf_counter()
        exact = np.array_equal(decompress(model, data)[0], pixels)
        decoding = time.perf_counter() - started
        bits = bits_per_pixel(model, picture[None])[0]
        codecs = [name for name in SHOWN_CODECS if name in available()]
        table = size_table(len(data), pixels.size, sizes(pixels, codecs))
        folder = Path(tempfile.mkdtemp(dir=models.downloads.name))
        path = folder / f"{Path(upload).stem}.itx"
        path.write_bytes(data)
        # the map alone, the shape of the pixels shown beside it: the image and its map side by side
        # (map_picture, twice as wide) was cut off on the right in the half-width box
        bits_map = shown(torch.from_numpy(colour(bits)))
        decoded = "decompressed back: **the same pixels**" if exact else "decompressed back: **DIFFERENT PIXELS**"
        travels = ("it decodes on any x86-64 machine with this torch" if arithmetic.portable else
                   f"coded with this machine's {arithmetic.kernels} kernels, it decodes on machines like this one")
        coded = "" if own_pixels(upload, pixels) else (
            "**Not your file's own pixels**: it was made 32×32 first, and these are what every codec here coded; "
            "`python -m imagetx.compress` codes a file only as it is (crop or resize it first). ")
        yield (shown(picture), bits_map, str(path), table,
               f"**{len(data):,} bytes**, {8 * len(data) / pixels.size:.2f} bits/dim, in "
               f"{seconds(preparing + coding)} ({seconds(preparing)} preparing the picture, {seconds(coding)} "
               f"compressing), then {seconds(decoding)} decompressing; {decoded}; {travels}. {coded}{note}. "
               f"{models.card('completion')}")
    except (UserError, OSError, FloatingPointError) as error:  # CodecError among them
        yield None, None, None, "", refused(error)


def add_tab(models: Models, image_height: int, upload_box: Callable[[str], gr.File]) -> None:
    """The "compress" tab, inside the page's ``gr.Blocks``; ``upload_box(prefix)`` makes the page's upload
    box with its examples, as the other tabs have it."""
    with gr.Tab("compress", id="compress"):
        with gr.Row():
            with gr.Column(scale=1):
                upload = upload_box("compress")
                run = gr.Button("compress", variant="primary", elem_id="compress-run")
                gr.Markdown("Lossless: the 32×32 pixels are coded with the model's probabilities and a range "
                            "coder, then decompressed to check. Your picture is first made 32×32 as in the "
                            "other tabs; the other codecs get the same pixels.")
            with gr.Column(scale=2):
                status = gr.Markdown(elem_id="compress-status")
                table = gr.Markdown(elem_id="compress-table")
                with gr.Row():
                    original = gr.Image(label="the pixels coded", type="pil", format="png", interactive=False,
                                        height=image_height, elem_id="compress-original")
                    bits_map = gr.Image(label=f"bits per pixel: black 0, pale yellow {SCALE_BITS:.0f} or more",
                                        type="pil", format="png", interactive=False, height=image_height,
                                        elem_id="compress-map")
                file = gr.File(label="the compressed file (python -m imagetx.decompress)", interactive=False,
                               elem_id="compress-file")

        def task(upload_path: str | None) -> Iterator[tuple]:
            yield from compress_picture(models, upload_path)

        run.click(task, [upload], [original, bits_map, file, table, status])
