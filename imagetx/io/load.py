"""``load_model``: the one entry that opens any imagetx model file from a local path: a weights
folder (``weights.model_from_folder``) or a checkpoint written by training
(``checkpoint.model_from_checkpoint``). Neither runs code from the file; nothing is downloaded
(a Hugging Face Hub repository id: ``hub.from_pretrained``). ``with_settings``: a loaded model
under settings that have no tensors of their own."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ..model.superres import build_model
from ..model.transformer import ImageTransformer
from .checkpoint import model_from_checkpoint
from .weights import model_from_folder


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> ImageTransformer:
    """The model stored at the local ``path``, in eval mode: a weights folder or a checkpoint
    file written by imagetx.train."""
    if Path(path).is_dir():
        return model_from_folder(path, map_location)
    return model_from_checkpoint(path, map_location)


def with_settings(model: ImageTransformer, **settings) -> ImageTransformer:
    """The same weights under ``model``'s configuration with ``settings`` changed, in the same mode:
    for settings that have no tensors of their own (``exact_box_means``, which restricts a trained
    super-resolution model's values to its input's box means). A ValueError for one that would
    add, drop or reshape a tensor."""
    rebuilt = build_model(dataclasses.replace(model.config, **settings))
    own, stored = rebuilt.state_dict(), model.state_dict()
    if {name: value.shape for name, value in own.items()} != {name: value.shape for name, value in stored.items()}:
        raise ValueError(f"{', '.join(f'{key}={value!r}' for key, value in settings.items())} changes the model's "
                         "tensors: train a model with it instead")
    rebuilt.load_state_dict(stored)
    parameter = next(model.parameters())
    return rebuilt.to(parameter.device, parameter.dtype).train(model.training)
