"""Where the bits go: the bits each pixel of an image costs under the model, as numbers and
as a picture (the demo's compress tab, ``imagetx.evaluate --bits_map``).

A pixel's bits are -log2 of the model's probability of its three values (given everything
before it in generation order): what the codec spends on it, up to the 2**-24 quantisation
(docs/compress.md). From one teacher-forced pass of the model, not the codec's step-by-step one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from einops import reduce
from PIL import Image

from ..io.atomic import atomic_write
from ..model.config import CHANNELS, LEVELS
from ..model.modes import eval_mode
from ..model.scoring import conditioning
from ..model.transformer import ImageTransformer

# The colour scale runs from 0 to 24 bits per pixel: 24 = 3 · log2(256) is what a pixel costs
# under a model that gives every value the same probability (8 bits/dim); pixels above it are
# drawn at the top colour. One fixed scale, so that maps of different images compare.
SCALE_BITS = CHANNELS * math.log2(LEVELS)
# Colours from 0 bits to SCALE_BITS, evenly spaced: black, purple, red, orange, pale yellow
# (a perceptually ordered dark-to-light ramp, like matplotlib's "inferno").
RAMP = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], dtype=np.float64)
# Maps are shown enlarged this many times with nearest neighbours: 32 pixels -> 256 on a screen.
MAP_SCALE = 8
# imagetx.evaluate --bits_map draws the first this many images: a few to look at, not a data set.
MAP_IMAGES = 8


@torch.no_grad()
def bits_per_pixel(model: ImageTransformer, images: torch.Tensor, labels: torch.Tensor | None = None) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, H, W) float64 bits each pixel costs under the model (given the
    labels, for a class-conditional model; given its 8×8 version, for super-resolution)."""
    device = next(model.parameters()).device
    batch = {"images": images.to(device)} | ({} if labels is None else {"labels": labels.to(device)})
    with eval_mode(model):
        nats = -model.log_prob(batch["images"], **conditioning(model.config, batch))  # (N, T): a sub-pixel or pixel each
    grid = model.order.sequence_to_grid(nats.double().cpu())  # (N, H, 3W) or (N, H, W)
    grid = reduce(grid, "n h (w s) -> n h w", "sum", s=model.head.steps_per_pixel)  # a pixel's steps: its cost
    return (grid / math.log(2)).numpy()


def colour(bits: np.ndarray) -> np.ndarray:
    """(H, W) bits -> (H, W, 3) uint8 colours of ``RAMP``, 0..SCALE_BITS (clipped above)."""
    position = np.clip(bits / SCALE_BITS, 0.0, 1.0) * (len(RAMP) - 1)
    low = np.minimum(position.astype(np.int64), len(RAMP) - 2)
    fraction = (position - low)[..., None]
    return np.round(RAMP[low] * (1 - fraction) + RAMP[low + 1] * fraction).astype(np.uint8)


def map_picture(image: np.ndarray, bits: np.ndarray, scale: int = MAP_SCALE) -> np.ndarray:
    """The image and its bits map side by side, enlarged ``scale`` times: (S·H, S·(2W + 1), 3)
    uint8 with a one-pixel white gap (before enlarging)."""
    gap = np.full((image.shape[0], 1, 3), 255, np.uint8)
    both = np.concatenate([image, gap, colour(bits)], axis=1)
    return both.repeat(scale, axis=0).repeat(scale, axis=1)


def write_bits_maps(model: ImageTransformer, images: torch.Tensor, labels: torch.Tensor | None,
                    directory: str | Path) -> list[Path]:
    """``map_picture`` of each image as ``directory``/bits_map_00000.png, ... -> the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (image, bits) in enumerate(zip(images.cpu().numpy(), bits_per_pixel(model, images, labels))):
        path = directory / f"bits_map_{index:05d}.png"
        picture = Image.fromarray(map_picture(image, bits))
        atomic_write(path, lambda handle, picture=picture: picture.save(handle, format="PNG"))
        paths.append(path)
    return paths
