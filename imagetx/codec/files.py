"""The commands' files: pictures and npz arrays in (``read_images``), and decoded images out
(``write_images``: an npz, or a folder of PNGs), every write whole or not at all.

Lossless means the pixels coded are the file's own: a picture is read by ``read_picture``
(limits on size, the same RGB rules as everywhere else), and refused where making it RGB would
change its values (16-bit, transparency) or where it is not the model's size (nothing is
resized or cropped). A JPEG is coded as the pixels it decodes to.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from ..data.images import PictureError, read_picture
from ..io.atomic import atomic_write
from .container import MAX_IMAGES, CodecError

NPZ_KEY = "images"  # the array an npz holds its images in (as the CIFAR-10 shards do)
# Notes of read_picture (data/images.py) for conversions that change pixel values: such a
# picture cannot be given back exactly, so it is refused. tests/test_compress_cli.py feeds
# both kinds, so a change of these words fails there rather than letting one through.
LOSSY_NOTES = ("16-bit", "transparent")
# A compressed file larger than this is not one the codec writes: 100,000 images (MAX_IMAGES) of
# 32×32 at the worst 24 bits a sub-pixel are 0.92 GB. Checked before the file is read.
MAX_COMPRESSED_BYTES = 1_000_000_000


def read_npz(path: Path, size: int) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as archive:
            if NPZ_KEY not in archive.files:
                raise CodecError(f"{path.name} has no array '{NPZ_KEY}' (it has {sorted(archive.files)})")
            images = archive[NPZ_KEY]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        if isinstance(error, CodecError):
            raise
        raise CodecError(f"{path.name} is not a readable npz file ({type(error).__name__}: {error})") from None
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise CodecError(f"{path.name}: '{NPZ_KEY}' must be (N, H, W, 3) uint8, not {images.dtype} "
                         f"{tuple(images.shape)}")
    check_size(path.name, images.shape[2], images.shape[1], size)
    return images


def read_picture_exactly(path: Path, size: int) -> np.ndarray:
    try:
        picture, notes = read_picture(path)
    except PictureError as error:
        raise CodecError(str(error)) from None
    lossy = [note for note in notes if any(word in note for word in LOSSY_NOTES)]
    if lossy:
        raise CodecError(f"{path.name}: making it 8-bit RGB would change its values ({'; '.join(lossy)}), "
                         "so it cannot be given back exactly; convert it to 8-bit RGB first")
    check_size(path.name, *picture.size, size)
    return np.asarray(picture, dtype=np.uint8)[None]


def check_size(name: str, width: int, height: int, size: int) -> None:
    if (width, height) != (size, size):
        raise CodecError(f"{name} is {width}x{height}; the model codes {size}x{size} images, and lossless "
                         f"compression resizes nothing: crop or resize it to {size}x{size} first")


def read_images(paths: list[str], size: int) -> np.ndarray:
    """Every image of the given files (npz: its array ``images``; any other: a picture), in
    order -> (N, size, size, 3) uint8, or a CodecError naming the file and the problem."""
    parts = []
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise CodecError(f"input file {name} does not exist")
        parts.append(read_npz(path, size) if path.suffix.lower() == ".npz" else read_picture_exactly(path, size))
        if sum(len(part) for part in parts) > MAX_IMAGES:
            raise CodecError(f"more than {MAX_IMAGES:,} images: a file holds at most that many; compress them in parts")
    return np.concatenate(parts)


def read_compressed(name: str) -> bytes:
    path = Path(name)
    if not path.is_file():
        raise CodecError(f"compressed file {name} does not exist")
    if path.stat().st_size > MAX_COMPRESSED_BYTES:
        raise CodecError(f"{name} is over {MAX_COMPRESSED_BYTES:,} bytes: not a file imagetx.compress writes")
    return path.read_bytes()


def check_output(name: str, force: bool) -> Path:
    """The output path, refused where something is there already (unless ``force``): nothing
    a user has is overwritten by mistake."""
    path = Path(name)
    if path.exists() and not force:
        raise CodecError(f"{name} exists: choose another --out, or give --force to replace it")
    return path


def png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def write_images(images: np.ndarray, out: Path) -> list[Path]:
    """(N, H, W, 3) uint8 -> ``out`` as an npz (array ``images``) when it ends in .npz, else a
    folder of PNGs 00000.png, 00001.png, ... in file order. Each file written whole."""
    if out.suffix.lower() == ".npz":
        buffer = io.BytesIO()
        np.savez(buffer, **{NPZ_KEY: images})
        atomic_write(out, lambda handle: handle.write(buffer.getvalue()))
        return [out]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, image in enumerate(images):
        path = out / f"{index:05d}.png"
        data = png_bytes(image)
        atomic_write(path, lambda handle, data=data: handle.write(data))
        written.append(path)
    return written
