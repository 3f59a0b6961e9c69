"""Weights to share: the folder format, ``model.safetensors`` and ``config.json``, written and read
(``io/hub.py``'s ``save_pretrained`` / ``from_pretrained`` and ``load_model`` use it).

The folder follows the Hugging Face convention: ``model.safetensors`` holds the network's
tensors and nothing else, so opening it cannot run code; ``config.json`` holds the
``ModelConfig`` fields and ``format_version``. The tensors are checked against the model that
config.json describes, so a missing, extra or wrongly shaped tensor is named rather than left to
a failure deep inside the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from ..model.config import ModelConfig
from ..model.superres import build_model
from .names import CONFIG_FILE, WEIGHTS_FILE
from .older import current_names, model_config
from ..model.transformer import AutoregressiveModel
from .atomic import atomic_write
from .errors import CheckpointError
from .size import check_fits_memory

FORMAT_KEY = "format_version"
# 3: the config as ModelConfig.to_dict writes it (what the model computes); 2: in sections, with the
# attention kernel and its tiles and both kinds' geometry; 1: one level. 1 and 2 are read (io/older.py).
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, FORMAT_VERSION)
LISTED = 3  # names of missing, extra or misshapen tensors given in one error line


def write_weights(directory: str | os.PathLike, state: dict[str, torch.Tensor], config: ModelConfig) -> Path:
    """Write ``directory/model.safetensors`` (the tensors of ``state``) and ``directory/config.json``
    (``config`` and the format version), each atomically. Returns the folder."""
    directory = Path(directory)
    tensors = {name: value.detach().to("cpu").contiguous() for name, value in state.items()}
    # "format": "pt" is the metadata the huggingface tools read to know the tensors are torch's
    atomic_write(directory / WEIGHTS_FILE, lambda handle: handle.write(safetensors_bytes(tensors, {"format": "pt"})))
    values = {FORMAT_KEY: FORMAT_VERSION, **config.to_dict()}
    atomic_write(directory / CONFIG_FILE, lambda handle: handle.write((json.dumps(values, indent=2) + "\n").encode()))
    return directory


def read_weights(directory: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The configuration and the tensors of a weights folder, each checked as it is read (a
    CheckpointError naming what is wrong); whether the tensors fit the configuration is
    ``check_tensors``'s to say, once the model is built."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"no weights folder at {directory}: pass a folder holding {WEIGHTS_FILE} and "
                              f"{CONFIG_FILE} (imagetx.export, save_pretrained), or a Hugging Face Hub repository id "
                              "to imagetx.from_pretrained")
    return read_config(directory / CONFIG_FILE), read_tensors(directory / WEIGHTS_FILE)


def model_from_folder(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> AutoregressiveModel:
    """The model in a local weights folder, in eval mode on ``map_location``, in float32 whatever
    precision the folder stores: the configuration checked, then every tensor against it."""
    config, stored = read_weights(directory)
    return checked_model(config, stored, Path(directory) / WEIGHTS_FILE,
                         "export the folder again from the checkpoint these weights came from", map_location)


def checked_model(config: ModelConfig, state: dict[str, torch.Tensor], source: Path, fix: str,
                  map_location: str | torch.device) -> AutoregressiveModel:
    """The model of ``config`` holding the tensors ``state`` read from ``source``, in eval mode; a
    CheckpointError naming any tensor that does not fit, and the ``fix``; one for a configuration
    too large for this machine's memory, before any of it is built (size.py)."""
    check_fits_memory(config, source.with_name(CONFIG_FILE) if source.name == WEIGHTS_FILE else source)
    model = build_model(config)
    state = current_names(state, model)
    check_tensors(source, state, model.state_dict(), fix)
    model.load_state_dict(state)
    return model.to(map_location).eval()


def read_config(path: Path) -> ModelConfig:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {CONFIG_FILE}: pass a weights folder written by imagetx.export "
                              "or save_pretrained, or a .ckpt checkpoint")
    try:
        values = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read ({error}); write the folder again with imagetx.export") from error
    if not isinstance(values, dict) or FORMAT_KEY not in values:
        raise CheckpointError(f"{path} is not an imagetx {CONFIG_FILE} (no {FORMAT_KEY}); write the folder with "
                              "imagetx.export or save_pretrained")
    version = values.pop(FORMAT_KEY)
    if version not in READ_VERSIONS:
        raise CheckpointError(f"{path}: {FORMAT_KEY} {version!r}, where this imagetx reads {READ_VERSIONS}: read the "
                              "folder with the imagetx that wrote it, or export it again with this one")
    try:
        return model_config(values).validate()
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: {error}; fix the field or export the folder again") from error


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {WEIGHTS_FILE}: pass a weights folder written by imagetx.export "
                              "or save_pretrained, or a .ckpt checkpoint")
    try:
        return load_file(path)
    except Exception as error:  # safetensors' own error type for a bad header, truncation, ...
        raise CheckpointError(f"{path} cannot be read ({type(error).__name__}: {error}): the file is truncated or "
                              "corrupt; export the folder again") from error


def listed(names: list[str]) -> str:
    """The first ``LISTED`` of ``names``, and how many more: for one error line."""
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def check_tensors(path: Path, stored: dict[str, torch.Tensor], needed: dict[str, torch.Tensor], fix: str) -> None:
    """A CheckpointError naming the tensors of ``stored`` that are missing, extra, misshapen or not
    floating point where the model of the stored configuration (``needed``) has floating-point
    ones, and the ``fix``."""
    missing = [name for name in needed if name not in stored]
    extra = [name for name in stored if name not in needed]
    misfits = [f"{name} is {tuple(stored[name].shape)} {str(stored[name].dtype).removeprefix('torch.')} where the "
               f"model needs {tuple(needed[name].shape)} {str(needed[name].dtype).removeprefix('torch.')}"
               for name in needed if name in stored and (stored[name].shape != needed[name].shape or
                                                         stored[name].is_floating_point() !=
                                                         needed[name].is_floating_point())]
    problems = [f"{kind} {listed(names)}" for kind, names in (
        ("missing tensor(s)", missing), ("unexpected tensor(s)", extra), ("wrong tensor(s):", misfits)) if names]
    if problems:
        raise CheckpointError(f"{path}: the weights do not fit the model configuration stored with them: "
                              f"{'; '.join(problems)}; {fix}")
