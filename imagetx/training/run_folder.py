"""Whose a run folder is: the checkpoints it holds, and which one ``--resume auto`` goes on from.

A folder whose ``checkpoints/`` holds any checkpoint (``last.ckpt``, a ``best-{step}.ckpt``, a
continuation) holds a run, and that run's files are its own: a new run there would overwrite them
(its ``best-{step}.ckpt`` at the same steps) and prune them (Lightning's ModelCheckpoint deletes the
best it replaces), so it is refused in one line (``refuse_another_run``). ``--resume auto`` goes on
from ``last.ckpt``, or, where that is gone (deleted, a dangling link), from the newest whole checkpoint
of the run (``newest_whole``); a folder at ``last.ckpt``'s place, or a run with no whole checkpoint
left, is refused in one line. Within a run, ``callbacks.RunBestCheckpoint`` prunes only the run's own
best checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from ..io.checkpoint import CHECKPOINT_DIR, LAST, read_checkpoint
from ..io.errors import CheckpointError
from ..io.weights import listed
from .continuation import CONTINUE, is_packed
from .resume_state import check_training_state

SUFFIX = ".ckpt"  # every checkpoint a run writes (atomic.py's temporaries end in .tmp)
JOINED = "continued-from.ckpt"  # a packed continuation, joined, under the new run's checkpoints/
# Where a new budget starts from (continuation.py), not where the run stood: resumed, either would
# start that budget again, so --resume auto never goes back to one of them on its own.
STARTS = (CONTINUE, JOINED)


def run_checkpoints(folder: Path) -> list[Path]:
    """The checkpoints of the run in ``folder`` (a run's ``checkpoints/``), in name order: every
    ``*.ckpt`` entry, a dangling link or a folder of that name too (either is where a checkpoint was)."""
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.name.endswith(SUFFIX))


def whole_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path`` where it is whole (readable, imagetx's, with the
    training state a resume restores, resume_state.check_training_state); None where it is not."""
    if not path.is_file():
        return None
    try:
        checkpoint = read_checkpoint(path, mmap=True)
        check_training_state(path, checkpoint)
    except CheckpointError:
        return None
    return checkpoint["global_step"]


def newest_whole(folder: Path) -> Path | None:
    """The whole checkpoint of ``folder``'s run at the latest step (``last.ckpt`` among equals),
    not counting the starts of a new budget (``STARTS``); None where there is none."""
    steps = [(step, path.name == LAST, path) for path in run_checkpoints(folder) if path.name not in STARTS
             for step in [whole_step(path)] if step is not None]
    return max(steps)[2] if steps else None


def auto_checkpoint(root: Path) -> Path | None:
    """What ``--resume auto`` goes on from in the run folder ``root``: its ``last.ckpt``, else the
    newest whole checkpoint of its run, else None where it holds no run (a new one starts). A
    CheckpointError where ``last.ckpt`` is a folder, or where the run has no whole checkpoint."""
    folder = root / CHECKPOINT_DIR
    last = folder / LAST
    if last.is_file():
        return last
    if last.is_dir():
        raise CheckpointError(f"--resume auto: {last} is a folder, where the run's last checkpoint goes: move it out "
                              "of the way, then rerun")
    held = run_checkpoints(folder)
    if not held:
        return None
    newest = newest_whole(folder)
    if newest is None:
        raise CheckpointError(f"--resume auto: {root} holds a run ({listed([path.name for path in held])}) but no "
                              "whole checkpoint of it to go on from: resume one with --resume PATH, or start a new "
                              "run with --trainer.default_root_dir NEW")
    return newest


def refuse_another_run(root: Path, resume: str | None) -> None:
    """Refuse, before anything is written, to start a new run in ``root`` where it holds one: no
    ``--resume`` (a new run), ``--resume`` of a checkpoint from elsewhere (another run's), or of a
    continuation (``STARTS``: a new run from it, whose ``last.ckpt`` would replace the decayed model's
    in its own folder). ``--resume last`` or ``auto``, or another checkpoint of this folder's run, go
    on with the run it holds."""
    folder = root / CHECKPOINT_DIR
    # A packed continuation's joined file is this run's own start: every process of the run joins
    # it (continuation.unpack), the first before the others have looked.
    joining = resume is not None and is_packed(Path(resume))
    held = [path for path in run_checkpoints(folder) if not (joining and path.name == JOINED)]
    own = resume in ("last", "auto") or (resume is not None and Path(resume).name not in STARTS
                                          and Path(resume).resolve().parent == folder.resolve())
    if not held or own:
        return
    go_on = "--resume last" if (folder / LAST).is_file() else "--resume auto (its newest checkpoint)"
    started = "a new run" if resume is None else f"--resume {resume}, a new run from that checkpoint,"
    raise CheckpointError(f"{root} already holds a run ({listed([str(path) for path in held])}) and {started} "
                          f"would overwrite or delete its checkpoints: continue it with {go_on}, or start the new "
                          "run in a new folder with --trainer.default_root_dir NEW")
