"""Pictures in and out: image files prepared for a model, and PNG grids of samples.

In: every image file a model reads, a training image of a folder (``sources/folder.py``)
or a photo given to ``imagetx.sample --images``, is prepared by ``prepare_image``: turned
upright (EXIF), made RGB, cropped to a square (``center``: the largest centred square;
``celeba``: the centred 138×138 face crop of CelebA's aligned 178×218 images) and resized
to the model's side with the ``resize`` filter, computed in floating point and rounded half
up (``area`` by default: each output pixel the mean of the area it covers, as T2T's resize
by area). So a photo is sampled from exactly as the folder a model was trained on would
have stored it.

Out: grids are what people look at (docs/model.md §6: completion and super-resolution grids).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError
from torchvision.utils import make_grid

CROPS = ("center", "celeba")
# CelebA's face crop: the centred 138x138 box (40 rows off the top and bottom, 20 columns
# off each side of the aligned 178x218 images), as T2T's img2img_celeba, the paper's
# CelebA super-resolution task; others use 140 or 148 boxes.
CELEBA_CROP = 138
# area: each output pixel the mean of the input area it covers, partly covered pixels
# weighted by the part covered (T2T's resize by area; PIL's BOX weighs whole pixels
# instead). The others are PIL's filters, for enlarging.
FILTERS = {"area": None, "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS}
UPRIGHT = 1  # the EXIF orientation of a picture stored the right way up


# ----- in: image files ---------------------------------------------------------------------

def prepare_image(path: str | Path, image_size: int, crop: str = "center", resize: str = "area") -> np.ndarray:
    """(image_size, image_size, 3) uint8 of one image file; raises whatever PIL raises for a
    file it cannot read, and a ValueError for one smaller than the crop."""
    with Image.open(path) as opened:
        return square(upright(opened), image_size, crop, resize)


def upright(image: Image.Image) -> Image.Image:
    """The picture turned as its EXIF orientation says, in RGB."""
    return ImageOps.exif_transpose(image).convert("RGB")


def crop_side(width: int, height: int, crop: str) -> int:
    side = CELEBA_CROP if crop == "celeba" else min(width, height)
    if side > min(width, height):
        raise ValueError(f"{width}x{height} is smaller than the {side}x{side} celeba crop")
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
        weights = area_weights(side, image_size)
        resized = np.einsum("ah,bw,hwc->abc", weights, weights, np.asarray(image, dtype=np.float64))
    else:  # each channel in float, rounded once below (PIL's 8-bit resize rounds between its two passes)
        resized = np.stack([np.asarray(band.convert("F").resize((image_size, image_size), FILTERS[resize]))
                            for band in image.split()], axis=-1)
    return np.clip(np.floor(resized + 0.5), 0, 255).astype(np.uint8)  # rounded half up


def area_weights(side: int, size: int) -> np.ndarray:
    """(size, side): how much of each input pixel each output pixel covers, rows summing to 1."""
    edges = np.arange(size + 1) * (side / size)
    starts, stops = edges[:-1, None], edges[1:, None]
    pixels = np.arange(side)[None, :]
    covered = np.clip(np.minimum(stops, pixels + 1) - np.maximum(starts, pixels), 0, None)
    return covered / covered.sum(axis=1, keepdims=True)


def load_image_file(path: str | Path, image_size: int, crop: str = "center",
                    resize: str = "area") -> tuple[torch.Tensor, str]:
    """A user's image file -> ((image_size, image_size, 3) uint8 prepared as ``prepare_image``
    prepares it, a note of what was done to it); one clear error for a file that is missing
    or not an image."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file {path} does not exist")
    try:
        with Image.open(path) as opened:
            orientation = opened.getexif().get(ExifTags.Base.Orientation, UPRIGHT)
            image = upright(opened)
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{path} is not an image PIL can read ({type(error).__name__}); "
                         "give a PNG or JPEG file") from error
    try:
        pixels = square(image, image_size, crop, resize)
    except ValueError as error:  # smaller than the celeba crop
        raise ValueError(f"{path}: {error}; give a larger image or --data.crop center") from None
    width, height = image.size
    side = crop_side(width, height, crop)
    note = f"{path.name}: "
    if orientation != UPRIGHT:
        note += f"turned upright (EXIF orientation {orientation}) to "
    note += f"{width}x{height}"
    if (side, side) != (width, height):
        note += f", centre-cropped to {side}x{side}"
    if side != image_size:
        note += f", resized to {image_size}x{image_size} ({resize} filter)"
    return torch.from_numpy(pixels.copy()), note


# ----- out: grids --------------------------------------------------------------------------

def grid_image(rows: list[torch.Tensor], padding: int = 2) -> Image.Image:
    """rows: each (N, H, W, 3) uint8, all with the same N and size -> one PIL image, one row each."""
    images = torch.cat([row.cpu() for row in rows])  # (rows·N, H, W, 3)
    grid = make_grid(images.permute(0, 3, 1, 2), nrow=rows[0].shape[0], padding=padding, pad_value=255)
    return Image.fromarray(grid.permute(1, 2, 0).numpy())


def save_grid(rows: list[torch.Tensor], path: str | Path, scale: int = 2) -> Path:
    """Write a PNG grid; ``scale`` enlarges 32-pixel images with nearest neighbours so they can be seen."""
    path = Path(path)
    image = grid_image(rows)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def upsample_nearest(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, h, w, 3) uint8 -> (B, size, size, 3) by repeating pixels (for showing low-res inputs)."""
    factor = size // images.shape[1]
    return images.repeat_interleave(factor, dim=1).repeat_interleave(factor, dim=2)
