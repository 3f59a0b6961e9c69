"""``--init_from``: a new run that starts from another model's weights instead of a random start.

What it is for: a super-resolution model started from an unconditional model of the same decoder,
and a deeper model started from a shallower one.
Every tensor of the source is copied into the new model, which must have it, with the same shape;
the tensors the new model has beyond the source's may only be those that read the low-resolution
input (``SuperResolutionTransformer.low_res_modules``), which keep their own start, and those of decoder
layers after the source's last (a pre-norm model only), which start as identity layers: their
residual writers at zero (``TransformerLayer.residual_writers``), the rest as initialised, so
that gradients reach the writers from the first step. With ``low_res_zero_start`` the new model
then computes exactly what the source does until it learns to read its input and to use its new
layers, so its training starts at the source's bits/dim. What is checked is the tensors, by name
and shape: settings that have none (block sizes, the attention kind) may differ, and the weights
are then a start, not the same model.

Unlike ``--resume``, nothing but the weights is taken: the optimiser, the schedule, the step count
and the time budget are the new run's own (the schedule warms up from step 0).

Kept: torch's ``load_state_dict(strict=False)`` would take what matches and say nothing of the rest,
nor start added layers as identity layers; here a source with another decoder is refused in one line,
and a deeper model scores as its source at step 0 (docs/training.md, "Starting from another model").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..io.errors import CheckpointError
from ..io.load import load_model
from ..io.weights import listed
from ..model.superres import SuperResolutionTransformer
from ..model.transformer import AutoregressiveModel, zero_start
from .continuation import is_packed, unpack


def read_source(source: str | Path) -> dict[str, torch.Tensor]:
    """The weights at ``source``; a packed continuation is joined in a temporary folder, so a
    run refused later (its data, say) leaves nothing behind."""
    path = Path(source)
    if not is_packed(path):
        return load_model(path).state_dict()
    with tempfile.TemporaryDirectory() as folder:
        return load_model(unpack(path, Path(folder) / "joined.ckpt", option="--init_from")).state_dict()


def source_layers(stored: dict[str, torch.Tensor], prefix: str = "") -> int:
    """How many decoder layers the weights ``stored`` have (``<prefix>layers.<i>.`` tensors)."""
    indices = {int(name.removeprefix(prefix).split(".")[1]) for name in stored if name.startswith(f"{prefix}layers.")}
    return max(indices, default=-1) + 1


def start_from(model: AutoregressiveModel, source: str | Path) -> str:
    """Copy the weights stored at ``source`` (a weights folder, a checkpoint written by
    imagetx.train, or a packed continuation folder) into ``model``, in place; a CheckpointError
    naming the tensors that do not fit. Returns what was done, in one line."""
    stored = read_source(source)
    own = model.state_dict()
    # A plain decoder's weights start a super-resolution model's decoder (``model.decoder``, its
    # tensors under ``decoder.``); a super-resolution model's start one of its kind whole.
    composed = isinstance(model, SuperResolutionTransformer)
    decoder, prefix = (model.decoder, "decoder.") if composed else (model, "")
    if composed and not any(name.startswith(prefix) for name in stored):
        stored = {prefix + name: value for name, value in stored.items()}
    parts = model.low_res_modules() if composed else []
    low_res = {id(module) for module in parts}
    reading = {f"{name}.{key}" for name, module in model.named_modules() if id(module) in low_res
               for key in module.state_dict()}
    kept_layers = source_layers(stored, prefix)
    added = list(decoder.layers)[kept_layers:]
    in_added = {f"{prefix}layers.{index}.{key}" for index, layer in enumerate(added, start=kept_layers)
                for key in layer.state_dict()}
    fresh = reading | in_added
    extra = [name for name in stored if name not in own]
    misfits = [f"{name} {tuple(stored[name].shape)} there, {tuple(own[name].shape)} here"
               for name in stored if name in own and stored[name].shape != own[name].shape]
    missing = [name for name in own if name not in stored and name not in fresh]
    problems = [f"{kind} {listed(names)}" for kind, names in (
        ("tensors this model lacks:", extra), ("shapes that differ:", misfits),
        ("tensors of this model's decoder it lacks:", missing)) if names]
    if added and model.config.norm != "pre":
        problems.append(f"{len(added)} more decoder layers here, which only a pre-norm model can add as "
                        "identity layers (norm: pre)")
    if problems:
        raise CheckpointError(f"--init_from {source}: its model is not this run's decoder ({'; '.join(problems)}): "
                              "start from a model with the same decoder settings, or without --init_from")
    with torch.no_grad():
        for name, value in stored.items():
            own[name].copy_(value)
        zero_start(writer for layer in added for writer in layer.residual_writers())
    added_own = len(in_added - reading)  # their readings are counted with the low-res parts
    kept = len(model.state_dict()) - len(stored) - added_own
    return (f"started from {source}: {len(stored)} tensors copied"
            + (f", {kept} that read the low-resolution input left as initialised" if kept else "")
            + (f", {added_names(kept_layers, len(decoder.layers))} added as identity layers (their residual "
               "writers at zero)" if added else ""))


def added_names(first: int, count: int) -> str:
    """Decoder layers first..count−1, for a message: 'layer 2' or 'layers 2-3'."""
    return f"layer {first}" if count - first == 1 else f"layers {first}-{count - 1}"
