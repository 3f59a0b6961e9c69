"""Continuation checkpoints: the state of a warmup–stable–decay run (schedule.py) just before its
decay, from which a later run goes on at the peak learning rate, with a decay of its own.

A run with ``model.optimizer: adamw_wsd`` writes ``checkpoints/continue.ckpt`` after its last
update at the peak (``callbacks.ContinuationCheckpoint``); its decayed weights at the end are the
model to use. This module is the file's format, torch only: packing and unpacking it without
Lightning's import. Continuing:

    python -m imagetx.train --config ... --resume runs/x/checkpoints/continue.ckpt \\
        --trainer.max_time 00:00:20:00 --trainer.default_root_dir runs/x2

goes on from that step, data position and optimiser state, and fits a new schedule (stable,
then the decay) to the new budget: ``max_time`` is the new run's own time; ``max_steps`` counts,
as Lightning's, from the first run's start.

To travel and be kept (docs/gpu.md, "Going on from a run"), a continuation is packed into a
**folder**: the checkpoint with the optimiser's moments slimmed (``MOMENTS``), in parts of a size a
transfer or a file host takes, and ``continuation.json`` (step, images seen, the whole file's size and SHA-256).
``--resume`` takes the folder too: the parts are joined and checked first (``unpack``).

    python -m imagetx.training.continuation pack CKPT FOLDER [--moments none] [--part-mib N]

Kept: Lightning has no packed format; a run cut in two at the decay's start and continued through
it ended level with the uncut run (3.864 against 3.868 bits/dim; docs/training.md, "What training
is built from").
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path

import torch

from ..errors import UserError
from ..io.atomic import atomic_write, exclusive
from ..io.checkpoint import load_weights_only
from ..io.errors import CheckpointError
from ..io.parts import mib_to_part_bytes, read_parts, write_parts

CONTINUE = "continue.ckpt"
MANIFEST = "continuation.json"
# Lightning's Timer keeps the time a run has trained under this key of checkpoint["callbacks"];
# a continuation drops it, so that its max_time is its own.
TIMER_STATE = "Timer"
# How a packed continuation keeps Adam's moments, with the float32 weights: fp32 as trained
# (12 bytes a parameter), bf16 both (8), second: only the second moment, in bf16 (6: the first
# restarts from zero and is back within ~1/(1-beta1) = 10 steps), none: Adam starts afresh with a
# re-warm-up of model.rewarmup_steps (4). Measured on the CPU (docs/results.md, "A schedule that can
# be continued"): none and fp32 ended within 0.002 bits/dim of each other, second 0.009 above
# (one seed each), so the default is none: the smallest, 28 MiB for the GPU recipe's model.
MOMENTS = ("fp32", "bf16", "second", "none")


def slim_moments(checkpoint: dict, moments: str) -> None:
    """Keep Adam's moments in ``checkpoint`` as ``moments`` says (``MOMENTS``), in place."""
    if moments not in MOMENTS:
        raise UserError(f"--moments {moments}: choose one of {', '.join(MOMENTS)}")
    for optimizer in checkpoint["optimizer_states"]:
        if moments == "none":
            optimizer["state"] = {}
            continue
        for state in optimizer["state"].values():
            if moments == "second":
                state.pop("exp_avg")
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and moments != "fp32":
                    state[key] = state[key].to(torch.bfloat16)
    checkpoint["imagetx"]["continuation_moments"] = moments


def continued_moments(checkpoint: dict) -> bool:
    """Adam's moments as training needs them (float32, a zero first moment where it was not
    kept), in place, when resuming from a packed continuation; False when none were kept."""
    for optimizer in checkpoint.get("optimizer_states", []):
        for state in optimizer["state"].values():
            if "exp_avg_sq" in state:
                state["exp_avg_sq"] = state["exp_avg_sq"].float()
                state["exp_avg"] = state["exp_avg"].float() if "exp_avg" in state else torch.zeros_like(
                    state["exp_avg_sq"])
    return checkpoint["imagetx"].get("continuation_moments", "fp32") != "none"


def pack(checkpoint_path: str | Path, folder: str | Path, moments: str = "none", part_bytes: int | None = None) -> dict:
    """Write the continuation checkpoint at ``checkpoint_path`` into ``folder``: parts of at most
    ``part_bytes`` (None: one part) and ``continuation.json``; returns the manifest."""
    checkpoint = load_weights_only(checkpoint_path)
    if not checkpoint.get("imagetx", {}).get("continuation"):
        raise CheckpointError(f"{checkpoint_path} is not a continuation checkpoint: pack the {CONTINUE} that a "
                              "run with --model.optimizer adamw_wsd writes before its decay")
    slim_moments(checkpoint, moments)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    data = buffer.getvalue()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = write_parts(data, folder, CONTINUE, part_bytes)
    meta = checkpoint["imagetx"]
    manifest = {"step": checkpoint["global_step"], "images_seen": meta.get("images_seen"), "moments": moments,
                "model_config": meta["model_config"], **written}
    atomic_write(folder / MANIFEST, lambda handle: handle.write(json.dumps(manifest, indent=1).encode()))
    return manifest


def is_packed(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


def unpack(folder: str | Path, to: str | Path, option: str = "--resume") -> Path:
    """Join a packed continuation's parts into the checkpoint file ``to``, refusing (one
    CheckpointError line, naming the ``option`` that gave the folder) a folder whose parts are
    missing, cut short or changed. Every process of a run calls it: the first joins the file, the
    others find it joined (the same size and SHA-256) and leave it."""
    folder, to = Path(folder), Path(to)
    to.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(to.parent):  # the folder itself: train.clean_up_checkpoints takes the same lock
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            if to.is_file() and joined_already(to, manifest):
                return to
        except (OSError, KeyError, TypeError, json.JSONDecodeError):
            pass  # read again below, where the failure is named
        return join(folder, to, option)


def joined_already(path: Path, manifest: dict) -> bool:
    """Whether ``path`` holds the file that ``manifest`` describes (its size, then its SHA-256)."""
    if path.stat().st_size != int(manifest["bytes"]):
        return False
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == manifest["sha256"]


def join(folder: Path, to: Path, option: str) -> Path:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        data = read_parts(folder, manifest)
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{option} {folder}: the packed continuation cannot be read ({error}); "
                              "bring its continuation.json and every part back together") from error
    except ValueError as error:
        raise CheckpointError(f"{option} {folder}: its parts do not add up to the file continuation.json "
                              "describes: a part is missing, cut short or changed") from error
    to.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(to, lambda handle: handle.write(data))
    return to


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imagetx.training.continuation",
                                     description="Pack a continuation checkpoint into a folder of parts.")
    parser.add_argument("verb", choices=["pack"])
    parser.add_argument("checkpoint", help=f"the {CONTINUE} a run wrote")
    parser.add_argument("folder", help="where the parts and continuation.json go")
    parser.add_argument("--moments", choices=MOMENTS, default="none", help="how Adam's moments are kept")
    parser.add_argument("--part-mib", dest="part_bytes", type=mib_to_part_bytes, default=None,
                        help="parts of at most this many MiB (default: one)")
    options = parser.parse_args(args)
    try:
        manifest = pack(options.checkpoint, options.folder, options.moments, options.part_bytes)
    except CheckpointError as error:
        raise SystemExit(f"error: {error}") from None
    print(json.dumps({key: manifest[key] for key in ("step", "images_seen", "moments", "bytes", "parts")}))


if __name__ == "__main__":
    main()
