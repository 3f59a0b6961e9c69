"""Pictures in and out: PNG grids of samples, and the user's own image files.

Grids are what people look at (docs/model.md §6: completion and super-resolution grids).
User images of any size are centre-cropped to a square and resized to the model's
size; callers report that they did so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.utils import make_grid


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


def load_image_file(path: str | Path, size: int) -> tuple[torch.Tensor, str]:
    """An image file of any size -> ((size, size, 3) uint8, a note of what was done to it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file {path} does not exist")
    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{path} is not an image PIL can read ({type(error).__name__}); "
                         "give a PNG or JPEG file") from error
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    square = image.crop((left, top, left + side, top + side))
    note = f"{path.name}: {width}x{height}"
    if width != height:
        note += f", centre-cropped to {side}x{side}"
    if side != size:
        square = square.resize((size, size), Image.BICUBIC if side < size else Image.BOX)
        note += f", resized to {size}x{size}"
    return torch.from_numpy(np.asarray(square, dtype=np.uint8).copy()), note
