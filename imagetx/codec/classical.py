"""The lossless codecs people use, each at its best lossless setting, on the same pixels as the
model's codec (the demo's compress tab, experiments/compress_codecs.py): PNG, WebP, JPEG XL and
JPEG 2000, through Pillow and the pillow-jxl-plugin (JPEG XL; left out where it is not
installed). Every file is decoded again and checked to give the same pixels."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image

try:  # registers the "JXL" format with Pillow (the demo extra installs it)
    import pillow_jxl  # noqa: F401
    HAS_JXL = True
except ImportError:  # pragma: no cover - the plugin is in the dev and demo extras
    HAS_JXL = False

# name -> Pillow's save options for its best lossless setting:
# PNG: optimize (zlib level 9 and the smallest of its filter choices);
# WebP: lossless, quality 100 (in lossless mode the effort spent searching) and method 6 (slowest, smallest);
# JPEG XL: lossless at effort 9, libjxl's slowest standard effort (10 is an experimental one);
# JPEG 2000: the reversible 5/3 wavelet (lossless), written as a bare codestream (.j2k), without the
# JP2 container's boxes (about 80 bytes an image more), with 2 resolution levels, the smallest
# of 1..6 on 32×32 CIFAR-10 images (experiments/compress_codecs.py --j2k_levels).
CODECS: dict[str, tuple[str, dict]] = {
    "PNG": ("PNG", {"optimize": True}),
    "WebP": ("WEBP", {"lossless": True, "quality": 100, "method": 6}),
    "JPEG XL": ("JXL", {"lossless": True, "effort": 9}),
    "JPEG 2000": ("JPEG2000", {"irreversible": False, "no_jp2": True, "num_resolutions": 2}),
}


def available() -> list[str]:
    return [name for name in CODECS if name != "JPEG XL" or HAS_JXL]


def encoded(image: np.ndarray, name: str, **options) -> bytes:
    """(H, W, 3) uint8 -> the file ``name``'s codec writes for it, checked to decode exactly."""
    fmt, settings = CODECS[name]
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt, **(settings | options))
    data = buffer.getvalue()
    with Image.open(io.BytesIO(data)) as decoded:
        back = np.asarray(decoded.convert("RGB"))
    if not np.array_equal(back, image):
        raise AssertionError(f"{name} did not give the pixels back: not lossless with {settings | options}")
    return data


def sizes(image: np.ndarray, names: list[str] | None = None,
          encode: Callable[[np.ndarray, str], bytes] = encoded) -> dict[str, int]:
    """{codec: bytes of its file} for one (H, W, 3) uint8 image, each codec available here."""
    return {name: len(encode(image, name)) for name in (names or available())}
