"""A checkpoint's training state, checked before Lightning restores it: a damaged or edited one is
refused in one line naming the file, where Lightning failed deep in its fit loop (a 28–69-line
traceback for a wrong tensor shape, junk optimiser state or a string ``global_step``; issue 124).

Two checks. ``check_training_state`` reads the state's form (a whole step, the optimiser and
scheduler states as torch writes them, a horizon the module can rebuild) when ``--resume`` reads
the file, before anything starts (resume.py, run_folder.py). ``check_restored`` holds the tensors
against the model that restores them, in ``ImageTransformerModule.on_load_checkpoint`` (module.py):
only there is the model as the checkpoint needs it, a grown checkpoint's deepened first, older names
read as today's. Lightning's ``load_state_dict`` would say the same of the weights; nothing says it
of the optimiser's moments, which the fused step reads only at the first update.
"""

from __future__ import annotations

from itertools import chain
from pathlib import Path

import torch

from ..io.errors import CheckpointError
from ..io.weights import check_tensors, listed

# Where a checkpoint that does not fit leads: its run's other checkpoints, or its weights alone.
FIX = "resume from another checkpoint of the run, or start a new run from its weights with --init_from"
# budget.Horizon's fields, as a checkpoint stores them (budget.py imports Lightning, which reading a
# checkpoint does without: `python -m imagetx.training.resume settings`)
HORIZON_FIELDS = ("decay_start", "end", "steered_at")
STEP = "step"  # Adam's count of updates in a parameter's state: a scalar; the rest are moments, shaped as it


def refused(path: Path | str, problem: str) -> CheckpointError:
    return CheckpointError(f"--resume {path}: {problem}; {FIX} {path}")


def is_count(value) -> bool:
    """A whole number of steps or epochs (not a bool, a float or a string)."""
    return type(value) is int and value >= 0


def optimizer_problem(state) -> str | None:
    """What is wrong with the form of one optimiser's state (``Optimizer.state_dict()``), or None."""
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) or \
            not isinstance(state.get("param_groups"), list):
        return "an optimiser state without its state and param_groups"
    for group in state["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list) or \
                not all(is_count(index) for index in group["params"]):
            return "an optimiser parameter group without its list of parameter indices"
    for index, values in state["state"].items():
        if not is_count(index) or not isinstance(values, dict) or \
                not all(isinstance(value, torch.Tensor) for value in values.values()):
            return f"optimiser state {index!r} is not a parameter index holding tensors"
    return None


def check_training_state(path: Path | str, checkpoint: dict) -> None:
    """Refuse, in one line, a checkpoint whose training state has not the form ``imagetx.train``
    writes: ``global_step`` and ``epoch`` whole counts, the loops a mapping, one optimiser's state
    and one scheduler's, a learning-rate horizon the module can rebuild (the weights-only file
    holds nothing but plain data: what is checked is its form)."""
    for key in ("global_step", "epoch"):
        if not is_count(checkpoint.get(key)):
            raise refused(path, f"its {key} is {checkpoint.get(key)!r}, not a count of steps")
    if not isinstance(checkpoint.get("loops"), dict):
        raise refused(path, "its loop state is not a mapping")
    optimizers, schedulers = checkpoint.get("optimizer_states"), checkpoint.get("lr_schedulers", [])
    if not isinstance(optimizers, list) or len(optimizers) != 1:
        raise refused(path, "it holds no single optimiser state (imagetx trains with one)")
    problem = optimizer_problem(optimizers[0])
    if problem is not None:
        raise refused(path, f"it holds {problem}")
    if not isinstance(schedulers, list) or not all(isinstance(state, dict) and is_count(state.get("last_epoch"))
                                                   for state in schedulers):
        raise refused(path, "its learning-rate scheduler state is not one a scheduler wrote")
    horizon = checkpoint.get("imagetx", {}).get("lr_horizon")
    if horizon is not None and not (isinstance(horizon, dict) and set(horizon) <= set(HORIZON_FIELDS)
                                    and is_count(horizon.get("decay_start")) and is_count(horizon.get("end"))):
        raise refused(path, f"its learning-rate horizon {horizon!r} is not one training wrote")


def check_restored(path: Path | str, checkpoint: dict, module: torch.nn.Module,
                   groups: list[list[torch.nn.Parameter]]) -> None:
    """Refuse, in one line, a checkpoint whose tensors do not fit ``module`` (the LightningModule as
    it restores them): a weight missing, extra or of another shape, or an optimiser state of other
    parameter groups (``groups``: the optimiser's parameters, group by group) or with moments shaped
    unlike their parameters. The state is by the indices its groups list, as torch reads it."""
    check_tensors(Path(path), checkpoint["state_dict"], module.state_dict(), f"{FIX} {path}")
    state = checkpoint["optimizer_states"][0]
    stored = [group["params"] for group in state["param_groups"]]
    if [len(indices) for indices in stored] != [len(group) for group in groups]:
        raise refused(path, f"its optimiser state has parameter groups of {[len(indices) for indices in stored]} "
                            f"parameters, this model's optimiser {[len(group) for group in groups]}")
    parameter = dict(zip(chain.from_iterable(stored), chain.from_iterable(groups)))
    misfits = [f"{index} ({key} {tuple(value.shape)} for a parameter of {tuple(parameter[index].shape)})"
               for index, values in state["state"].items() if index in parameter
               for key, value in values.items() if key != STEP and value.shape != parameter[index].shape]
    strays = [f"{index} (no parameter)" for index in state["state"] if index not in parameter]
    if misfits or strays:
        raise refused(path, f"its optimiser state does not fit the model: state {listed(misfits + strays)}")
