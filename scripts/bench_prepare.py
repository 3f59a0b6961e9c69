"""Seconds to read and prepare a user's picture for a 32×32 model (``load_image_file``: decode,
upright, RGB, centre crop, area resize), by picture size: what a large photo costs
``imagetx.sample --images`` and the demo before sampling starts.

    .venv/bin/python -m scripts.bench_prepare [--sides 1000 2000 3024x4032 6000] [--rounds 3]
                                              [--json bench_prepare.json]

Each picture is a photo-like one (smooth random shapes, grain on top: a file about as large as a
camera's), written once as a JPEG (PNG with ``--png``) to a temporary folder; reported: the median of ``--rounds`` calls, and the part
spent on the crop and resize alone (``square``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from imagetx.data.images import load_image_file, read_picture, square


def size_of(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height or width)


def photo_like(width: int, height: int) -> Image.Image:
    """Smooth random colours (a 16×16 picture enlarged) with a little grain: compresses as a
    photo does, where pure noise would make a JPEG larger than any camera's."""
    rng = np.random.default_rng(0)
    smooth = Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).resize((width, height),
                                                                                          Image.Resampling.BICUBIC)
    grain = rng.integers(-8, 9, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(smooth, dtype=np.int64) + grain, 0, 255).astype(np.uint8))


def seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", nargs="+", default=["1000", "2000", "3024x4032", "6000"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--png", action="store_true", help="write PNG files instead of JPEG")
    parser.add_argument("--json", default="bench_prepare.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for text in args.sides:
            width, height = size_of(text)
            path = Path(folder) / f"photo-{width}x{height}.{'png' if args.png else 'jpg'}"
            photo_like(width, height).save(path, quality=90)
            picture, _ = read_picture(path)
            total = statistics.median(seconds(lambda: load_image_file(path, 32)) for _ in range(args.rounds))
            resize = statistics.median(seconds(lambda: square(picture, 32, "center", "area"))
                                       for _ in range(args.rounds))
            rows.append({"picture": f"{width}x{height}", "file_bytes": path.stat().st_size, "seconds": total,
                         "crop_and_resize_seconds": resize})
            print(f"{width}x{height:<6} {path.suffix[1:]:<4} {total:8.3f} s  (crop and resize {resize:.3f} s)",
                  flush=True)
    Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
