"""Which checkpoint a training run continues from (``--resume``), and where to continue
after a run stopped on a non-finite loss.

``checkpoint_to_resume`` checks the checkpoint before training starts, so that a wrong one
is refused with one line instead of failing deep inside Lightning's fit loop, and one that would
run code when opened is refused before Lightning opens it (checkpoint.load_weights_only).

A run resumed with its own budget goes on exactly; with another budget (``max_steps`` or
``max_time``) it gets a schedule fitted to the new budget if its learning rate had not begun to
decay, and is refused if it had: a decay cannot be undone, and training on from a decayed (or
fully decayed: learning rate 0) state would waste the new budget. The state to extend a run from
is its continuation checkpoint, written just before the decay (continuation.py). A run resumed
with the budget it has already spent, which Lightning would end at once, is refused before the
loggers start, naming the way on (``refuse_finished``).

``--resume auto`` is the form a requeued job, a restarted pod or a retry loop reruns unchanged: it
resumes ``last.ckpt`` where the run folder holds one, else the newest whole checkpoint of the run the
folder holds (run_folder.py: never a new run over another's files), and starts the run where it holds
none; a folder whose run has another model or other data is refused (``check_same_data``), and a run that
has finished says so and ends with exit status 0 (``FinishedRun``).

A checkpoint of another model than the run's preset (a grown continuation, grow.py) resumes with the
settings ``settings_to_resume`` names, which the refusal quotes and a script reads one a line:

    python -m imagetx.training.resume settings CHECKPOINT_OR_PACKED_FOLDER --preset PRESET.yaml   # n_layers=28

Kept: Lightning's ``ckpt_path`` checks neither the model configuration nor the budget; resumed with
another budget after its decay, a run trained on at learning rate 0, silently (docs/training.md,
"What training is built from").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
from pathlib import Path

import yaml

from ..io.checkpoint import CHECKPOINT_DIR, LAST, model_config_of, read_checkpoint
from ..io.errors import CheckpointError
from ..model.config import ModelConfig
from .continuation import CONTINUE, MANIFEST, TIMER_STATE, is_packed, unpack
from .presets import dotted_fields, preset_model_config
from .resume_state import check_training_state
from .run_folder import JOINED, auto_checkpoint, run_checkpoints

AUTO = "auto"  # --resume auto: last.ckpt where there is one, else the run's newest checkpoint, else a new run
# The data options that make a run's images what they are: a folder resumed with ``--resume auto``
# must have been trained on the same (``check_same_data``).
SAME_DATA = ("source", "root", "val_size", "random_flip", "transforms", "identity_probability", "crop", "resize",
             "batch_size")


class FinishedRun(CheckpointError):
    """``--resume`` of a run that has spent its budget (``refuse_finished``); ``finished``: which run,
    and what it has spent, in words; ``path``: its checkpoint."""

    def __init__(self, message: str, finished: str, path: Path) -> None:
        super().__init__(message)
        self.finished, self.path = finished, path


def resolve_auto(resume: str | None, root: Path) -> str | None:
    """``--resume auto`` as what it means in ``root`` (run_folder.auto_checkpoint): 'last' where
    ``root`` holds a ``last.ckpt``, else the path of its run's newest whole checkpoint, else None (a
    new run); any other value as given."""
    if resume != AUTO:
        return resume
    path = auto_checkpoint(root)
    return None if path is None else "last" if path.name == LAST else str(path)


def check_same_data(path: Path, checkpoint: dict, data: dict) -> None:
    """Refuse, in one line, to go on with ``data`` (this run's data options) from ``checkpoint``
    where a ``SAME_DATA`` option differs from the one it was trained with (a data root as the same
    folder, however written): the folder holds another run than this command's."""
    stored = checkpoint.get("datamodule_hyper_parameters") or {}

    def same(key, there, here) -> bool:
        if key == "root" and there is not None and here is not None:
            return Path(there).resolve() == Path(here).resolve()
        return there == here

    differ = [f"data.{key}={stored[key]!r} there, {data.get(key)!r} here" for key in SAME_DATA
              if key in stored and not same(key, stored[key], data.get(key))]
    if differ:
        raise CheckpointError(f"--resume auto: {path} was trained on other data ({'; '.join(differ)}): rerun "
                              "the command that started it, resume with --resume last to go on with these "
                              "settings, or give a new --trainer.default_root_dir")


def checkpoint_to_resume(resume: str | None, root: Path, config: ModelConfig,
                         budget: dict | None = None, data: dict | None = None, processes: int = 1) -> str | None:
    """The checkpoint ``--resume`` names ('last': ``root/checkpoints/last.ckpt``; 'auto': that one
    where it exists, else None; a packed continuation folder: its parts joined), checked: it exists,
    is readable, is imagetx's, holds the training state and the same model configuration as this
    run (for 'auto' the same ``data`` too), its place in the training order goes on with this run's
    ``processes``, and, with another ``budget`` than its run's (budget.run_budget), its learning
    rate has not begun to decay."""
    given, resume = resume, resolve_auto(resume, root)
    if resume is None:
        return None
    path = root / CHECKPOINT_DIR / LAST if resume == "last" else Path(resume)
    if is_packed(path):
        path = unpack(path, root / CHECKPOINT_DIR / JOINED)
    if path.is_dir():
        raise CheckpointError(f"--resume {resume}: {path} is a folder (weights to share hold no optimiser or loop "
                              "state); resume from a checkpoint written by imagetx.train, e.g. checkpoints/last.ckpt")
    if not path.is_file():
        way = ("--resume auto goes on from the newest whole checkpoint of the run it holds" if run_checkpoints(
            root / CHECKPOINT_DIR) else "start without --resume or pass the path of an existing .ckpt")
        raise CheckpointError(f"--resume {resume}: no checkpoint at {path}; {way}")
    checkpoint = read_checkpoint(path, mmap=True)
    if "optimizer_states" not in checkpoint or "loops" not in checkpoint:
        raise CheckpointError(f"--resume {path}: this checkpoint holds weights only (no optimiser or loop state); "
                              "resume from a checkpoint written by imagetx.train, e.g. checkpoints/last.ckpt")
    check_training_state(path, checkpoint)
    # imported here, as rank_zero_info below: the data module brings Lightning, which `settings` goes without
    from ..data.datamodule import check_processes

    check_processes(checkpoint, processes)
    stored_config = model_config_of(checkpoint)  # a field added since it was written: its default
    if checkpoint["imagetx"].get("grown") and stored_config.n_layers > config.n_layers:
        # grown deeper in its run (grow.GrowDepth) or between runs: this run's model deepened as it was
        config = dataclasses.replace(config, n_layers=stored_config.n_layers)
    stored, wanted = dotted_fields(stored_config.to_dict()), dotted_fields(config.to_dict())
    differ = [f"{key}={stored.get(key)!r} there, {wanted.get(key)!r} here" for key in {**wanted, **stored}
              if stored.get(key) != wanted.get(key)]
    if differ:
        settings = " ".join(training_flags(settings_to_resume(stored_config, config)))
        raise CheckpointError(f"--resume {path}: the checkpoint's model differs from this run's "
                              f"({'; '.join(differ[:3])}): resume with the configuration it was trained with "
                              f"({settings}), or start a new run elsewhere")
    if given == AUTO and data is not None:
        check_same_data(path, checkpoint, data)
    if given == AUTO and path.name != LAST:
        # imported here: `python -m imagetx.training.resume settings` never comes here, and goes without
        # Lightning's import (2 s); training has imported it
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(f"--resume auto: {root / CHECKPOINT_DIR / LAST} is gone; going on from the run's newest "
                       f"whole checkpoint, {path} (step {checkpoint['global_step']})")
    check_budget(path, checkpoint, budget)
    return str(path)


def settings_to_resume(stored: ModelConfig, config: ModelConfig) -> list[str]:
    """``KEY=VALUE`` for each model field (a section's dotted) where ``stored``, a checkpoint's model,
    differs from ``config``, a run's: what a run of ``config``'s preset sets (``--model.config.KEY VALUE``)
    to resume that checkpoint, a grown one's (grow.py) for instance. Values in JSON, as both the training
    command line and ``scripts/step_check.py --set`` read them (a plain word as itself)."""
    there, here = dotted_fields(stored.to_dict()), dotted_fields(config.to_dict())
    return [f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in there.items()
            if here.get(key) != value]


def training_flags(settings: list[str]) -> list[str]:
    """``settings_to_resume``'s ``KEY=VALUE`` as the training command line's words: ``--model.config.KEY VALUE``."""
    return [word for setting in settings for word in (f"--model.config.{setting.split('=', 1)[0]}",
                                                       setting.split("=", 1)[1])]


def decaying(checkpoint: dict) -> bool:
    """Whether the run of ``checkpoint`` was past the start of its decay: a schedule that decays to
    its horizon (not noam's, which never reads one) and a step beyond the horizon's decay_start."""
    horizon = checkpoint["imagetx"].get("lr_horizon")
    noam = checkpoint.get("hyper_parameters", {}).get("optimizer") == "adam_noam"
    return horizon is not None and not noam and checkpoint.get("global_step", 0) > horizon["decay_start"]


def check_budget(path: Path, checkpoint: dict, budget: dict | None) -> None:
    """Refuse to resume a run whose decay had begun (see the module's docstring) with another budget."""
    stored = checkpoint["imagetx"]
    horizon = stored.get("lr_horizon")
    if budget is None or stored.get("continuation") or stored.get("budget") in (None, budget):
        return
    if decaying(checkpoint):
        was = stored["budget"]
        raise CheckpointError(
            f"--resume {path}: that run's learning rate was decaying since step {horizon['decay_start']} (to 0 at "
            f"step {horizon['end']}, under max_steps {was['max_steps']}, max_time {was['max_time']} s) and this "
            f"run's budget differs (max_steps {budget['max_steps']}, max_time {budget['max_time']} s): to train "
            f"on, resume from the run's {CONTINUE} (written before the decay by --model.optimizer adamw_wsd), "
            "or resume with the run's own budget")


def refuse_finished(resume: str, root: Path, max_steps: int, max_time: float | None) -> None:
    """Refuse ``--resume`` of a run that has spent this budget (``max_steps``; ``max_time`` in
    seconds, None: none): Lightning would restore it and stop at once, after the loggers had begun
    a csv version and a W&B run. Checked before they start; the line says how to train on. A
    checkpoint that cannot be read is ``checkpoint_to_resume``'s to refuse, with its reasons. Raises
    ``FinishedRun``, which ``--resume auto`` turns into a success (imagetx.train)."""
    resume = resolve_auto(resume, root)
    if resume is None:
        return
    path = root / CHECKPOINT_DIR / LAST if resume == "last" else Path(resume)
    if not path.is_file():
        return
    try:
        checkpoint = read_checkpoint(path, mmap=True)
        check_training_state(path, checkpoint)
    except CheckpointError:
        return
    step = checkpoint["global_step"]
    trained = checkpoint.get("callbacks", {}).get(TIMER_STATE, {}).get("time_elapsed", {}).get("train")
    if 0 < max_steps <= step:
        spent = f"it has taken its max_steps {max_steps}"
    elif max_time is not None and trained is not None and trained >= max_time:
        spent = f"it has trained for its max_time {max_time:.0f} s, to step {step}"
    else:
        return
    continuation = path.parent / CONTINUE
    if checkpoint["imagetx"].get("continuation"):  # max_steps counts from the first run's start
        how = f"give a --trainer.max_steps above {step}, or a --trainer.max_time"
    elif continuation.is_file():
        how = (f"train on from its continuation with a budget of its own: --resume {continuation} "
               "--trainer.max_time ... (or --trainer.max_steps) --trainer.default_root_dir NEW")
    elif not decaying(checkpoint):  # nothing to undo: another budget goes on from here (check_budget)
        how = "resume it with a larger --trainer.max_steps or --trainer.max_time"
    else:
        how = (f"its learning rate has decayed and it has no {CONTINUE}: start a new run from its weights "
               f"with --init_from {path} --trainer.default_root_dir NEW")
    finished = f"{path} is a finished run ({spent})"
    raise FinishedRun(f"--resume {resume}: {finished}: nothing is left to train with this budget; {how}", finished,
                      path)


def saved_step(root: Path) -> int | None:
    """The step ``root``'s ``last.ckpt`` was written after, or None where there is none (or it
    cannot be read)."""
    try:
        return read_checkpoint(root / CHECKPOINT_DIR / LAST, mmap=True).get("global_step")
    except CheckpointError:
        return None


def last_good_checkpoint(root: Path) -> str:
    """Where to continue from after a non-finite loss, in words."""
    step = saved_step(root)
    if step is None:
        return "no checkpoint was written yet: lower --model.peak_lr or set --trainer.gradient_clip_val and start again"
    return (f"the last good checkpoint is {root / CHECKPOINT_DIR / LAST} (after step {step}): continue with --resume "
            "last, perhaps with a lower --model.peak_lr or --trainer.gradient_clip_val")


def stopped_at(root: Path, step: int, signum: int, resume: str | None, during: str | None = None) -> str:
    """What a run stopped by the signal ``signum`` after ``step`` steps kept, and how to go on, in
    words; ``resume``: the run's ``--resume``, which says whether the same command goes on; ``during``:
    where it stopped at once, in words (``interrupt.StopSignals``), if not at a step's end."""
    what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"preempted ({signal.Signals(signum).name})"
    what = what if during is None else f"{what} {during}"
    saved = saved_step(root)
    if saved is None:
        return f"training {what} after step {step}, before any checkpoint was written: start it again"
    how = "rerun the same command to go on" if resume == AUTO else \
        "go on with the same command and --resume auto (or --resume last)"
    return f"training {what} after step {step}; {root / CHECKPOINT_DIR / LAST} holds step {saved}: {how}"


def stored_model_config(source: Path) -> ModelConfig:
    """The model of a checkpoint, or of a packed continuation (from its manifest: nothing joined)."""
    if is_packed(source):
        return ModelConfig.from_dict(json.loads((source / MANIFEST).read_text())["model_config"])
    return model_config_of(read_checkpoint(source, mmap=True))


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m imagetx.training.resume",
        description="Print the model settings (KEY=VALUE, one a line) a run of PRESET adds to resume SOURCE: "
                    "none for a checkpoint of the preset's own model; the grown fields for a grown one.")
    parser.add_argument("verb", choices=["settings"])
    parser.add_argument("source", type=Path, help="a checkpoint, or a packed continuation folder")
    parser.add_argument("--preset", type=Path, required=True, help="the training preset (YAML) the run starts from")
    options = parser.parse_args(args)
    try:
        preset = preset_model_config(options.preset)
        stored = stored_model_config(options.source)
    except (OSError, KeyError, TypeError, ValueError, CheckpointError, yaml.YAMLError) as error:
        raise SystemExit(f"error: {options.source} with {options.preset}: {error}") from None
    for setting in settings_to_resume(stored, preset):
        print(setting)


if __name__ == "__main__":
    main()
