"""``load_model``: the one entry that opens any imagetx model file from a local path: a weights
folder (``weights.model_from_folder``) or a checkpoint written by training
(``checkpoint.model_from_checkpoint``). Neither runs code from the file; nothing is downloaded
(a Hugging Face Hub repository id: ``hub.from_pretrained``). ``with_config``: a loaded model
under a configuration that changes none of its tensors; ``with_exact_box_means``: the one such
setting, a super-resolution model's bounds switched on or off."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ..errors import UserError
from .shipped import resolve
from ..model.config import ModelConfig
from ..model.superres import build_model
from ..model.transformer import AutoregressiveModel
from .checkpoint import model_from_checkpoint
from .weights import model_from_folder


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> AutoregressiveModel:
    """The model stored at the local ``path``, in eval mode: a weights folder or a checkpoint
    file written by imagetx.train; ``pretrained/NAME`` not found here is the shipped model of that
    name (``io.shipped.resolve``), as the commands find it."""
    path = resolve(os.fspath(path))
    if Path(path).is_dir():
        return model_from_folder(path, map_location)
    return model_from_checkpoint(path, map_location)


def with_config(model: AutoregressiveModel, config: ModelConfig) -> AutoregressiveModel:
    """The same weights under ``config``, in the same mode: for settings that have no tensors of
    their own (``superres.exact_box_means``, which restricts a trained super-resolution model's
    values to its input's box means). A ValueError for a config that would add, drop or reshape
    a tensor."""
    rebuilt = build_model(config)
    own, stored = rebuilt.state_dict(), model.state_dict()
    if {name: value.shape for name, value in own.items()} != {name: value.shape for name, value in stored.items()}:
        raise UserError("the new configuration changes the model's tensors: train a model with it instead")
    rebuilt.load_state_dict(stored)
    parameter = next(model.parameters())
    return rebuilt.to(parameter.device, parameter.dtype).train(model.training)


def with_exact_box_means(model: AutoregressiveModel, exact: bool) -> AutoregressiveModel:
    """The same weights with ``superres.exact_box_means`` set to ``exact`` (``with_config``): a
    super-resolution model's values restricted to its input's box means, or free. A ValueError for
    a model without a low-resolution input, or (``exact``) without the cell remainder input."""
    superres = model.config.superres
    if superres is None:
        raise UserError("exact_box_means is a super-resolution model's setting, and this model has no "
                        "low-resolution input (no superres section): leave it out")
    superres = dataclasses.replace(superres, exact_box_means=exact)
    return with_config(model, dataclasses.replace(model.config, superres=superres))
