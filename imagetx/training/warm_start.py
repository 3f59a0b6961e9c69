"""``--init_from``: a new run that starts from another model's weights instead of a random start.

What it is for: a super-resolution model started from an unconditional model of the same decoder
(docs/experiments.md, entry 21). Every tensor of the source is copied into the new model, which
must have it, with the same shape; the tensors the new model has beyond the source's may only be
those that read the low-resolution input (``ImageTransformer.low_res_modules``), which keep their
own start. With ``low_res_zero_start`` the new model then computes exactly what the source does
until it learns to read its input, so its training starts at the source's bits/dim. What is
checked is the tensors, by name and shape: settings that have none (block sizes, the attention
kind) may differ, and the weights are then a start, not the same model.

Unlike ``--resume``, nothing but the weights is taken: the optimiser, the schedule, the step count
and the time budget are the new run's own (the schedule warms up from step 0).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..io.errors import CheckpointError
from ..io.load import load_model
from ..io.weights import listed
from ..model.transformer import ImageTransformer
from .continuation import is_packed, unpack


def read_source(source: str | Path) -> dict[str, torch.Tensor]:
    """The weights at ``source``; a packed continuation is joined in a temporary folder, so a
    run refused later (its data, say) leaves nothing behind."""
    path = Path(source)
    if not is_packed(path):
        return load_model(path).state_dict()
    with tempfile.TemporaryDirectory() as folder:
        return load_model(unpack(path, Path(folder) / "joined.ckpt", option="--init_from")).state_dict()


def start_from(model: ImageTransformer, source: str | Path) -> str:
    """Copy the weights stored at ``source`` (a weights folder, a checkpoint written by
    imagetx.train, or a packed continuation folder) into ``model``, in place; a CheckpointError
    naming the tensors that do not fit. Returns what was done, in one line."""
    stored = read_source(source)
    own = model.state_dict()
    low_res = [id(module) for module in model.low_res_modules()]
    fresh = {f"{name}.{key}" for name, module in model.named_modules() if id(module) in low_res
             for key in module.state_dict()}
    extra = [name for name in stored if name not in own]
    misfits = [f"{name} {tuple(stored[name].shape)} there, {tuple(own[name].shape)} here"
               for name in stored if name in own and stored[name].shape != own[name].shape]
    missing = [name for name in own if name not in stored and name not in fresh]
    problems = [f"{kind} {listed(names)}" for kind, names in (
        ("tensors this model lacks:", extra), ("shapes that differ:", misfits),
        ("tensors of this model's decoder it lacks:", missing)) if names]
    if problems:
        raise CheckpointError(f"--init_from {source}: its model is not this run's decoder ({'; '.join(problems)}): "
                              "start from a model with the same decoder settings, or without --init_from")
    with torch.no_grad():
        for name, value in stored.items():
            own[name].copy_(value)
    kept = len(own) - len(stored)
    return (f"started from {source}: {len(stored)} tensors copied"
            + (f", {kept} that read the low-resolution input left as initialised" if kept else ""))
