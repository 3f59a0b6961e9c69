"""What the model takes as input, checked with one clear ValueError each: image tensors and
class labels. The model, the sampler and the commands call these; nothing else checks them.

Shapes and dtypes are metadata, checked for free. Values (labels in range, non-uint8 images
in 0..255) have to be read back from the tensor's device, which waits for it: ``values=False``
leaves them to whoever checked the data already (the training step, docs/model.md §8)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import UserError
from .config import CHANNELS, LEVELS


def check_image_tensor(name: str, images: Tensor, side: int, values: bool = True) -> None:
    """uint8-like (B, side, side, 3) with values 0..255 (``values``: checked), or a ValueError
    naming ``name``."""
    expect = f"uint8 images of shape (B, {side}, {side}, 3) with values 0..255"
    if not isinstance(images, Tensor) or images.dim() != 4 or tuple(images.shape[1:]) != (side, side, CHANNELS):
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise UserError(f"{name} have shape {shape}; this model takes {expect}")
    if images.is_floating_point() or images.dtype == torch.bool:
        raise UserError(f"{name} are {images.dtype}; this model takes {expect}")
    if values and images.dtype != torch.uint8 and images.numel():  # uint8 is in range by construction
        low, high = int(images.min()), int(images.max())
        if low < 0 or high >= LEVELS:
            raise UserError(f"{name} values span {low}..{high}; expected 0..255")


def check_labels(labels: Tensor | None, count: int, num_classes: int, name: str = "labels",
                 values: bool = True) -> None:
    """Labels fit for a model with ``num_classes`` classes (0: unconditional) and ``count``
    images: None for an unconditional model, else integer class ids (count,) in range
    (``values``: checked); or a ValueError that names ``name`` (the argument or option the
    labels came from)."""
    if not num_classes:
        if labels is not None:
            raise UserError(f"{name} given, but this model is unconditional (num_classes=0): give no labels")
        return
    if labels is None:
        raise UserError(f"this model is class-conditional ({num_classes} classes): "
                        f"give {name}, a class id in 0..{num_classes - 1} per image")
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.dtype == torch.bool:
        kind = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise UserError(f"{name} are {kind}; give integer class ids (a long tensor of shape ({count},))")
    if labels.shape != (count,):
        raise UserError(f"{name} have shape {tuple(labels.shape)}; expected ({count},), one per image")
    if values and labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        low, high = int(labels.min()), int(labels.max())
        given = f"{name} {low} is" if count == 1 else f"{name} span {low}..{high}"
        raise UserError(f"{given} outside 0..{num_classes - 1}")


def downsample_area(images: torch.Tensor, size: int) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, size, size, 3): the box mean of each (H/size)² patch, rounded
    half up (T2T "resize by area"; docs/model.md §6). Exact integer arithmetic, no float rounding doubt."""
    batch, height, width, channels = images.shape
    if height % size or width % size:
        raise UserError(f"cannot box-downsample {height}x{width} to {size}x{size}: size must divide both")
    fh, fw = height // size, width // size
    patches = images.long().view(batch, size, fh, size, fw, channels).sum(dim=(2, 4))
    area = fh * fw
    return ((2 * patches + area) // (2 * area)).to(torch.uint8)  # floor(mean + ½)
