"""Pictures in and out: image files prepared for a model, and PNG grids of samples.

In: every image file a model reads, a training image of a folder (``sources/folder.py``),
a photo given to ``imagetx.sample --images`` or uploaded to ``imagetx.demo``, is prepared by
``prepare_image``: decoded and made RGB by ``read_picture`` (below: turned upright by its
EXIF orientation, 16-bit values scaled, transparency laid on white), cropped to a square
(``center``: the largest centred square; ``celeba``: the centred 138×138 face crop of
CelebA's aligned 178×218 images) and resized
to the model's side with the ``resize`` filter, rounded half up (``area`` by default: each
output pixel the mean of the area it covers, as T2T's resize by area, computed exactly and in
one pass over the picture, ``resize_area``; the others in floating point). So a photo is
sampled from exactly as the folder a model was trained on would have stored it.

``read_picture`` refuses a file before its pixels are decoded when it is larger than
``MAX_FILE_BYTES`` (an upload's limit: a folder's own files have none) or claims more than
``MAX_PIXELS`` pixels (a decompression bomb: a small file
that would decode to gigabytes), refused with the reason when it is not an image PIL can read
or is truncated, and made RGB by stated rules (``to_rgb``): an animated image's first frame,
CMYK converted, 16-bit values scaled to 8 bits, palette colours looked up, transparency laid on
white. What was done is said in one note.

Out: grids are what people look at (docs/model.md §6: completion and super-resolution grids),
enlarged ``GRID_SCALE`` times with nearest neighbours by default.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ..errors import UserError
from .options import CROPS, FILTER_NAMES  # noqa: F401 - the names, defined where the options parse
# CelebA's face crop: the centred 138x138 box (40 rows off the top and bottom, 20 columns
# off each side of the aligned 178x218 images), as T2T's img2img_celeba, the paper's
# CelebA super-resolution task; others use 140 or 148 boxes.
CELEBA_CROP = 138
# area: each output pixel the mean of the input area it covers, partly covered pixels
# weighted by the part covered (T2T's resize by area; PIL's BOX weighs whole pixels
# instead). The others are PIL's filters, for enlarging.
FILTERS = {"area": None, "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS}
assert tuple(FILTERS) == FILTER_NAMES, "options.FILTER_NAMES names these filters, in this order"
UPRIGHT = 1  # the EXIF orientation of a picture stored the right way up
# A user's file is refused above these, before its pixels are decoded. 20 MB holds any
# ordinary photo (a 48-megapixel phone JPEG is about 10-15 MB); 50 megapixels is above the
# largest common camera outputs (48 MP) and keeps one decoded RGB image under 150 MB, where a
# few-kilobyte PNG can claim billions of pixels. A MB here is 2^20 bytes, as file managers and
# Gradio's page (which refuses a larger upload itself, "exceeds 20.0 Mb") count it: every message
# then states the same limit.
MEGABYTE = 2**20
MAX_FILE_BYTES = 20 * MEGABYTE
MAX_PIXELS = 50_000_000
BACKGROUND = (255, 255, 255)  # what transparent parts of a picture are laid on: white, as a page shows them
SIXTEEN_BIT_MAX = 65535  # 16-bit pixel values run 0..65535; scaled so that 65535 becomes 255
EIGHT_BIT_MAX = 255
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # "I": how older Pillows open 16-bit greys
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")  # modes with an alpha channel
# Grids are enlarged this many times (nearest neighbours): a 32-pixel image at 4x is 128 pixels,
# big enough to see on a screen without zooming.
GRID_SCALE = 4


# ----- in: image files ---------------------------------------------------------------------

def prepare_image(path: str | Path, image_size: int, crop: str = "center", resize: str = "area",
                  name: str | None = None, max_bytes: int | None = MAX_FILE_BYTES
                  ) -> tuple[np.ndarray, Image.Image, list[str]]:
    """One image file as a model reads it, the same on every path (a folder's training images,
    sample's ``--images``, the demo's uploads): (the (image_size, image_size, 3) uint8 pixels, the
    decoded RGB picture they were cut from, ``read_picture``'s notes). A ``PictureError`` naming
    the file (as ``name``) for one ``read_picture`` refuses or one smaller than the crop;
    ``max_bytes`` None: no limit on the file's bytes (a folder's own files)."""
    name = name or Path(path).name
    picture, notes = read_picture(path, name, max_bytes)
    try:
        pixels = square(picture, image_size, crop, resize)
    except ValueError as error:  # smaller than the celeba crop
        raise PictureError(f"{name}: {error}; give a larger image or --data.crop center") from None
    return pixels, picture, notes


def crop_side(width: int, height: int, crop: str) -> int:
    side = CELEBA_CROP if crop == "celeba" else min(width, height)
    if side > min(width, height):
        raise UserError(f"{width}x{height} is smaller than the {side}x{side} celeba crop")
    return side


def square(image: Image.Image, image_size: int, crop: str, resize: str) -> np.ndarray:
    """An upright RGB picture cropped to a square and resized: (image_size, image_size, 3) uint8."""
    width, height = image.size
    side = crop_side(width, height, crop)
    left, top = (width - side) // 2, (height - side) // 2
    image = image.crop((left, top, left + side, top + side))
    if side == image_size:
        return np.asarray(image, dtype=np.uint8)
    if resize == "area":
        return resize_area(np.asarray(image, dtype=np.uint8), image_size)
    # each channel in float, rounded once below (PIL's 8-bit resize rounds between its two passes)
    resized = np.stack([np.asarray(band.convert("F").resize((image_size, image_size), FILTERS[resize]))
                        for band in image.split()], axis=-1)
    return np.clip(np.floor(resized + 0.5), 0, 255).astype(np.uint8)  # rounded half up


def area_coverage(side: int, size: int) -> np.ndarray:
    """(size, side) int64: how much of each of ``side`` input pixels each of ``size`` output pixels
    covers, in units of 1/size of a pixel, so whole numbers (each row sums to ``side``). Output
    pixel i covers [i·side, (i+1)·side) of these units, input pixel p covers [p·size, (p+1)·size)."""
    starts = np.arange(size, dtype=np.int64)[:, None] * side
    pixels = np.arange(side, dtype=np.int64)[None, :] * size
    return np.clip(np.minimum(starts + side, pixels + size) - np.maximum(starts, pixels), 0, None)


def resize_area(pixels: np.ndarray, size: int) -> np.ndarray:
    """(side, side, C) uint8 -> (size, size, C) uint8, each output pixel the mean of the area it
    covers (partly covered pixels weighted by the part covered), rounded half up exactly.

    Separable and in whole numbers (``area_coverage``'s units): rows first, each output row the sum
    of the input rows it covers whole (times ``size``, their coverage) plus its at most two partly
    covered rows, so the picture is read once, as uint8, with no float copy of it (the dense
    two-sided product costs side² × size² instead); then columns, on the small (size, side, C)
    result, in float64, exact below 2^53 (the sums stay below 255·side²). The mean's rounding is
    decided in integers: the answer of exact rational arithmetic, at any side."""
    side = pixels.shape[0]
    coverage = area_coverage(side, size)
    flat = pixels.reshape(side, -1)
    rows = np.zeros((size, flat.shape[1]), dtype=np.int64)
    for i in range(size):
        start, stop = i * side, (i + 1) * side  # output row i, in 1/size of a pixel
        whole_from, whole_to = -(-start // size), stop // size  # the input rows it covers whole
        if whole_to > whole_from:
            rows[i] = flat[whole_from:whole_to].sum(axis=0, dtype=np.int64) * size
        for row in {start // size, min(stop // size, side - 1)}:  # the partly covered ones
            if not whole_from <= row < whole_to and coverage[i, row]:
                rows[i] += coverage[i, row] * flat[row].astype(np.int64)
    sums = np.matmul(coverage.astype(np.float64), rows.reshape(size, side, -1).astype(np.float64))
    area = side * side  # the mean is sums / area; floor(mean + 1/2) in integers:
    return ((2 * sums.astype(np.int64) + area) // (2 * area)).astype(np.uint8)


class PictureError(UserError):
    """A user's file that cannot be read as a picture: the message says why and what to give."""


def megabytes(size: int) -> str:
    return f"{size / MEGABYTE:.1f} MB"


def read_picture(path: str | Path, name: str | None = None, max_bytes: int | None = MAX_FILE_BYTES,
                 max_pixels: int = MAX_PIXELS) -> tuple[Image.Image, list[str]]:
    """A user's image file -> (the picture, upright and RGB, decoded; notes of what was done to
    make it so). A ``PictureError`` naming the file (as ``name``, by default the file's name)
    for one that is too large (in bytes, checked before it is opened, or in pixels, before they
    are decoded), not an image, truncated, or of a kind ``to_rgb`` refuses."""
    path = Path(path)
    name = name or path.name
    if not path.is_file():
        raise FileNotFoundError(f"image file {path} does not exist")
    size = path.stat().st_size
    if size == 0:
        raise PictureError(f"{name} is empty (0 bytes): give a picture (PNG, JPEG, ...)")
    if max_bytes is not None and size > max_bytes:
        raise PictureError(f"{name} is {megabytes(size)}: files over {megabytes(max_bytes)} are refused; "
                           "give a smaller picture")
    with warnings.catch_warnings():
        # PIL warns (between its own limit and twice it) rather than refusing: a refusal here
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            opened = Image.open(path)  # reads the header only
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise PictureError(f"{name} claims more than {max_pixels:,} pixels (a decompression bomb?): "
                               "refused before decoding; give a smaller picture") from None
        except (UnidentifiedImageError, OSError, ValueError) as error:
            raise PictureError(f"{name} is not an image PIL can read ({type(error).__name__}); "
                               "give a PNG or JPEG file") from None
    with opened:
        width, height = opened.size
        if width * height > max_pixels:
            raise PictureError(f"{name} is {width}x{height}, {width * height:,} pixels: pictures over "
                               f"{max_pixels:,} pixels are refused before decoding (a decompression bomb "
                               "would be one); give a smaller picture")
        notes = []
        frames = getattr(opened, "n_frames", 1)
        if frames > 1:
            notes.append(f"the first of its {frames} frames")
        try:
            opened.seek(0)
            opened.load()
            orientation = opened.getexif().get(ExifTags.Base.Orientation, UPRIGHT)
            picture = ImageOps.exif_transpose(opened)
        except (OSError, ValueError, SyntaxError, EOFError) as error:  # what PIL's decoders raise for damaged data
            raise PictureError(f"{name} is truncated or damaged: its pixels cannot be decoded ({error}); "
                               "give the whole file") from None
        try:
            picture = to_rgb(picture, notes)
        except PictureError as error:
            raise PictureError(f"{name}: {error}") from None
    if orientation != UPRIGHT:
        notes.insert(0, f"turned upright (EXIF orientation {orientation})")
    return picture, notes


def to_rgb(image: Image.Image, notes: list[str]) -> Image.Image:
    """A decoded picture of any mode -> RGB, by these rules (each noted in ``notes`` where the
    values change): grey and bilevel spread to three channels; CMYK, YCbCr, LAB and HSV converted
    (CMYK without its colour profile); 16-bit values scaled to 8 bits (65535 -> 255); palette
    colours looked up; transparency laid on white; floating-point pixels, and modes PIL cannot
    convert, refused."""
    mode = image.mode
    if mode == "F":
        raise PictureError("floating-point pixels (PIL mode F) have no agreed range: give an 8- or 16-bit picture")
    if mode in SIXTEEN_BIT_MODES:
        values = np.asarray(image, dtype=np.float64)
        scaled = np.floor(np.clip(values, 0, SIXTEEN_BIT_MAX) * EIGHT_BIT_MAX / SIXTEEN_BIT_MAX + 0.5)
        notes.append("16-bit values scaled to 8 bits")
        return Image.fromarray(scaled.astype(np.uint8)).convert("RGB")
    try:
        if mode == "P":
            notes.append("palette colours looked up")
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        if image.mode in ALPHA_MODES:
            rgba = image.convert("RGBA")
            if rgba.getextrema()[3][0] < EIGHT_BIT_MAX:  # some pixel is not opaque
                notes.append("transparent parts laid on white")
            background = Image.new("RGBA", rgba.size, BACKGROUND + (EIGHT_BIT_MAX,))
            return Image.alpha_composite(background, rgba).convert("RGB")
        if image.mode in ("CMYK", "YCbCr", "LAB", "HSV"):
            profile = " (without its colour profile)" if image.mode == "CMYK" else ""
            notes.append(f"converted from {image.mode}{profile}")
        return image if image.mode == "RGB" else image.convert("RGB")
    except ValueError as error:  # PIL: "conversion from X to Y not supported"
        raise PictureError(f"pictures of PIL mode {mode} cannot be made RGB ({error}): give a PNG or JPEG") from None


def load_image_file(path: str | Path, image_size: int, crop: str = "center", resize: str = "area",
                    name: str | None = None) -> tuple[torch.Tensor, str]:
    """A user's image file -> ((image_size, image_size, 3) uint8 prepared by ``prepare_image``, a
    note of what was done to it); one clear error for a file that is missing, too large or not
    an image (``read_picture``). ``name``: the file as the note calls it (by default its file name)."""
    name = name or Path(path).name
    pixels, image, conversions = prepare_image(path, image_size, crop, resize, name)
    width, height = image.size
    side = crop_side(width, height, crop)
    steps = [f"{width}x{height}"]
    if conversions and conversions[0].startswith("turned upright"):
        steps = [f"{conversions.pop(0)} to {width}x{height}"]
    if (side, side) != (width, height):
        steps.append(f"centre-cropped to {side}x{side}")
    if side != image_size:
        steps.append(f"resized to {image_size}x{image_size} ({resize} filter)")
    note = f"{name}: " + ", ".join(steps) + ("; " + ", ".join(conversions) if conversions else "")
    return torch.from_numpy(pixels.copy()), note


# ----- out: grids --------------------------------------------------------------------------

def grid_image(rows: list[torch.Tensor], padding: int = 2) -> Image.Image:
    """rows: each (N, H, W, 3) uint8, all with the same N and size -> one PIL image, one row each."""
    # imported here: torchvision's import brings torch._dynamo (about a second of every command's
    # start), which only the grids need
    from torchvision.utils import make_grid

    images = torch.cat([row.cpu() for row in rows])  # (rows·N, H, W, 3)
    grid = make_grid(images.permute(0, 3, 1, 2), nrow=rows[0].shape[0], padding=padding, pad_value=255)
    return Image.fromarray(grid.permute(1, 2, 0).numpy())


def enlarged(image: Image.Image, scale: int) -> Image.Image:
    """``image`` ``scale`` times larger, each pixel a scale×scale square (nearest neighbours:
    the pixels as the model sees them, not smoothed); scale 1: as it is."""
    if scale < 1:
        raise UserError(f"scale {scale} is invalid: enlarge 1 (the raw pixels) or more times")
    if scale == 1:
        return image
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def save_grid(rows: list[torch.Tensor], path: str | Path, scale: int = GRID_SCALE) -> Path:
    """Write a PNG grid; ``scale`` enlarges 32-pixel images with nearest neighbours so they can be seen."""
    path = Path(path)
    image = enlarged(grid_image(rows), scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def upsample_nearest(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, h, w, 3) uint8 -> (B, size, size, 3) by repeating pixels (for showing low-res inputs)."""
    factor = size // images.shape[1]
    return images.repeat_interleave(factor, dim=1).repeat_interleave(factor, dim=2)
