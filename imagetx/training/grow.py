"""Growing a model deeper, computing the same function: inside a run (``GrowDepth``, a callback) or
between runs (a continuation grown into a new one, the command below).

Added layers come after the last (a pre-norm model) as identity layers: their residual writers
(``TransformerLayer.residual_writers``) at zero, the rest as initialised, so the grown model's
bits/dim equal the source's and the new layers add nothing until they learn to (``deepen``).
docs/experiments.md entry 35: at equal FLOPs, twice the depth from 40 epochs on ended 0.105 bits/dim
below the model continued as it was, and 0.046 below the deep model trained from step 0.

* ``GrowDepth(layers, at_fraction=..., at_images=...)``, in a run's ``trainer.callbacks``: the model
  grows at that fraction of the run's budget (its ``max_time`` where it has one, else its
  ``max_steps``) or once the lineage has seen that many training images, in place, in every
  process; the optimiser goes on with the new tensors (Adam's moments kept for the others, theirs
  from zero) after a re-warm-up of ``rewarmup_steps``, as a continuation's (module.py). A
  checkpoint written after the growth holds the grown model and resumes as such (module.py,
  ``on_load_checkpoint``); one written before it grows when the run comes to the same point.
* ``python -m imagetx.training.grow SOURCE OUT --layers N [--dropout P] [--seed S]``: a continuation
  (a packed folder or a ``continue.ckpt``) grown into the packed continuation OUT, its step, data
  position and images seen kept, Adam's moments dropped (the new tensors have none), and the
  settings a run resuming from it needs printed with the command to run next. ``--dropout P`` sets
  the configuration's dropout (a regulariser switched on part-way through a lineage).

A post-norm model (the paper's presets) has no identity layer (a layer that adds nothing still
normalises its input), so it cannot grow this way: refused in one line naming the pre-norm recipe.
Every new tensor draws from ``seed``: the same growth grows the same model.

Kept: ``--init_from`` starts a new run (step 0, a new warm-up) and copies weights only; a growth
keeps the run's step, schedule and images seen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from ..errors import UserError
from ..io.checkpoint import load_weights_only, model_config_of
from ..io.errors import CheckpointError
from ..io.older import current_names
from ..io.parts import mib_to_part_bytes
from ..model.config import ModelConfig
from ..model.flops import count_flops
from ..model.superres import build_model
from ..model.transformer import ImageTransformer, TransformerLayer, layer_sizes, zero_start
from .budget import SHARE_CHECK_EVERY, BudgetHorizon, budget_timer
from .continuation import MANIFEST, is_packed, pack, slim_moments, unpack
from .resume import settings_to_resume, training_flags

PREFIX = "model."  # the LightningModule's name for the network: its tensors in a checkpoint's state_dict
GROWN = "grown"  # where a checkpoint's metadata keeps the record of each growth
RECIPE = "configs/cifar10_recipe.yaml"  # the pre-norm recipe that grows inside its run


def grown_config(config: ModelConfig, layers: int | None = None, dropout: float | None = None) -> ModelConfig:
    """``config`` with ``layers`` decoder layers and ``dropout``, each where given; a ValueError for
    fewer layers, a super-resolution model, or added layers in a post-norm model."""
    if layers is not None and layers < config.n_layers:
        raise UserError(f"--layers {layers}: fewer than the model's {config.n_layers}; growing only adds layers")
    if layers not in (None, config.n_layers):
        if config.superres is not None:  # its layers also read the low-resolution input
            raise UserError("a super-resolution model cannot grow: growing is built for a plain decoder")
        if config.norm != "pre":
            raise UserError(f"a post-norm model (norm: {config.norm}) cannot grow: a layer that adds nothing still "
                            f"normalises its input, so no added layer computes the identity; grow a pre-norm model "
                            f"(norm: pre), as {RECIPE} is")
    changes = {"n_layers": layers, "dropout": dropout}
    return dataclasses.replace(config, **{key: value for key, value in changes.items() if value is not None}).validate()


def deepen(model: ImageTransformer, layers: int, seed: int) -> ImageTransformer:
    """``model`` with ``layers`` decoder layers, in place: identity layers added after its last, on
    its device and in its dtype, each new tensor drawn under ``seed`` (the caller's random state
    untouched) and every residual writer at zero. Its ``config`` becomes the grown one."""
    config = grown_config(model.config, layers)
    last = model.layers[-1].self_attn  # what every decoder layer shares: the pattern's index, the rotary angles
    parameter = next(model.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        added = [TransformerLayer(**layer_sizes(config), index=last.index, rotary=last.rotary, kernel=last.kernel)
                 for _ in range(layers - len(model.layers))]
    for layer in added:
        zero_start(layer.residual_writers())
        model.layers.append(layer.to(parameter.device, parameter.dtype))
    model.config = config
    return model


def shape(config: ModelConfig, model: nn.Module) -> dict:
    """A model's shape as a growth's record keeps it."""
    return {"n_layers": config.n_layers, "d_model": config.d_model, "n_heads": config.attention.n_heads,
            "head_size": config.head_size, "d_filter": config.d_filter, "dropout": config.dropout,
            "tensors": len(model.state_dict()), "parameters": sum(p.numel() for p in model.parameters())}


def growth_record(step: int, images_seen: int | None, seed: int, before: dict, after: dict) -> dict:
    return {"step": step, "images_seen": images_seen, "seed": seed, "from": before, "to": after}


# ----- inside a run ------------------------------------------------------------------------------------------


class GrowDepth(Callback):
    """Grows the run's decoder to ``layers`` layers (``deepen``) once, at the end of the optimiser step
    where ``at_fraction`` of the run's budget has passed (of ``trainer.max_time`` where the run has
    one, else of ``trainer.max_steps``) or the lineage has seen ``at_images`` training images
    (``images_seen``, kept across continuations): give one of the two. Every process decides at the
    same step (a time budget: rank 0's clock, broadcast every ``SHARE_CHECK_EVERY`` steps) and grows
    the same layers from ``seed``. The optimiser is built again over the grown model (module.py's
    ``configure_optimizers``) with Adam's moments kept for the tensors it had and the schedule's step,
    and the learning rate warms up again over ``rewarmup_steps`` from that step; a time budget's
    decay is fitted again to the grown model's step time (budget.py). Runs on one device and under
    DDP (re-wrapped over the grown model); another strategy is refused at the start."""

    def __init__(self, layers: int, at_fraction: float | None = None, at_images: int | None = None,
                 seed: int = 0) -> None:
        if (at_fraction is None) == (at_images is None):
            raise UserError("GrowDepth: give one of at_fraction (of the run's budget) and at_images (training images)")
        if at_fraction is not None and not 0 <= at_fraction < 1:
            raise UserError(f"GrowDepth: at_fraction {at_fraction} is not in [0, 1): the share of the budget before "
                             "the growth")
        if at_images is not None and at_images < 0:
            raise UserError(f"GrowDepth: at_images {at_images} is negative")
        self.layers, self.at_fraction, self.at_images, self.seed = layers, at_fraction, at_images, seed

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        grown_config(pl_module.config, max(self.layers, pl_module.config.n_layers))  # a ValueError, before any step
        if pl_module.config.n_layers > self.layers:
            raise UserError(f"GrowDepth(layers={self.layers}): the model already has {pl_module.config.n_layers} "
                            "layers; growing only adds layers")
        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            raise UserError(f"GrowDepth: growing inside a run is built for one device and for DDP, not for "
                            f"{type(trainer.strategy).__name__}; grow between runs (python -m imagetx.training.grow)")

    def due(self, trainer: L.Trainer, pl_module) -> bool:
        """Whether the growth's point has come, the same verdict in every process."""
        if self.at_images is not None:
            return pl_module.images_seen >= self.at_images  # counted alike in every process
        timer = budget_timer(trainer)
        if timer is None:
            return trainer.max_steps > 0 and trainer.global_step >= round(self.at_fraction * trainer.max_steps)
        if trainer.global_step % SHARE_CHECK_EVERY:
            return False
        elapsed = timer.time_elapsed()
        return trainer.strategy.broadcast(elapsed >= self.at_fraction * (elapsed + timer.time_remaining()), src=0)

    def planned(self, trainer: L.Trainer, pl_module, end: int) -> str | None:
        """Where the growth falls against ``end``, the step the run's budget reaches, in words (None:
        grown already): a recipe whose budget ends before its growth trains the model it started with."""
        if pl_module.config.n_layers >= self.layers:
            return None
        if self.at_images is None:
            step, point = round(self.at_fraction * end), f"{self.at_fraction:.0%} of the budget"
        else:
            per_step = pl_module.batch_images * trainer.world_size * trainer.accumulate_grad_batches
            step = trainer.global_step + max(-(-(self.at_images - pl_module.images_seen) // per_step), 0)
            point = f"{self.at_images:,} training images"
        verdict = "inside the budget" if step <= end else "past the budget's end: this run will not grow"
        return (f"the model grows to {self.layers} layers at about step {step:,} ({point}): {verdict} "
                f"(about step {end:,} on this machine)")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.config.n_layers < self.layers and self.due(trainer, pl_module):
            self.grow(trainer, pl_module)

    def grow(self, trainer: L.Trainer, pl_module) -> None:
        step = trainer.global_step
        before = shape(pl_module.config, pl_module.model)
        old_optimizer, old_scheduler = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
        deepen(pl_module.model, self.layers, self.seed)
        pl_module.compile_added(pl_module.model.layers[before["n_layers"]:])
        pl_module.hparams["config"] = pl_module.config.to_dict()
        pl_module.grown.append(growth_record(step, pl_module.images_seen, self.seed, before,
                                             shape(pl_module.config, pl_module.model)))
        if isinstance(trainer.strategy, DDPStrategy):  # its gradient buckets hold the tensors it was built with
            trainer.strategy.model = pl_module
            trainer.strategy.configure_ddp()
        pl_module.rewarmup = (step, pl_module.rewarmup_length)
        for callback in trainer.callbacks:
            if isinstance(callback, BudgetHorizon):
                callback.forget_timings(pl_module)  # the grown model's steps cost more
        trainer.strategy.setup_optimizers(trainer)  # configure_optimizers over the grown model
        optimizer, scheduler = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
        for parameter, state in old_optimizer.state.items():  # the same tensor objects: the old layers'
            optimizer.state[parameter] = state
        scheduler.load_state_dict(old_scheduler.state_dict())  # its step count
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * pl_module.lr_multiplier(step)
        pl_module.flops = count_flops(pl_module.model, pl_module.device)
        pl_module.print(f"grown at step {step}: {before['n_layers']} -> {self.layers} decoder layers, identity layers "
                        f"(the same function; {before['parameters']:,} -> {pl_module.grown[-1]['to']['parameters']:,} "
                        f"parameters); the learning rate warms up again over {pl_module.rewarmup_length} steps")


# ----- between runs ---------------------------------------------------------------------------------------------


def grow_checkpoint(checkpoint: dict, layers: int | None = None, dropout: float | None = None, seed: int = 0) -> dict:
    """A continuation checkpoint's grown copy: its network deepened (``deepen``), its configuration
    the grown one, Adam's moments dropped (``slim_moments`` none: the new tensors have none) and its
    parameter list as long as the grown model's; the loops, schedule, step and images seen kept."""
    meta = checkpoint["imagetx"]
    if not meta.get("continuation"):
        raise CheckpointError("the source is not a continuation checkpoint: grow the continue.ckpt a run writes "
                              "before its decay, or a packed continuation")
    source = model_config_of(checkpoint)
    target = grown_config(source, layers, dropout)
    model = build_model(source)
    try:
        model.load_state_dict(current_names({name[len(PREFIX):]: value for name, value in
                                             checkpoint["state_dict"].items()}, model))
    except RuntimeError as error:
        raise CheckpointError(f"the source's tensors are not its configuration's model: {error}") from None
    before = shape(source, model)
    deepen(model, target.n_layers, seed).config = target
    state = model.state_dict()
    grown = dict(checkpoint)
    grown["state_dict"] = {PREFIX + name: value for name, value in state.items()}
    grown["imagetx"] = {**meta, "model_config": target.to_dict()}
    record = growth_record(checkpoint["global_step"], meta.get("images_seen"), seed, before, shape(target, model))
    grown["imagetx"][GROWN] = [*meta.get(GROWN, []), record]
    grown["optimizer_states"] = [dict(optimizer) for optimizer in checkpoint["optimizer_states"]]
    slim_moments(grown, "none")
    for optimizer in grown["optimizer_states"]:
        # One parameter group (a decoder without a low-resolution input): every tensor, in the model's order.
        if len(optimizer["param_groups"]) != 1:
            raise CheckpointError("the source's optimiser has several parameter groups (a low-resolution input's "
                                  "own rate): growing it is not built")
        optimizer["param_groups"] = [{**optimizer["param_groups"][0], "params": list(range(len(state)))}]
    return grown


def train_overrides(source: ModelConfig, grown: dict) -> list[str]:
    """The command-line settings a run resuming from the grown checkpoint ``grown`` needs beyond the
    ``source``'s configuration (resume.py refuses a configuration other than the checkpoint's)."""
    return training_flags(settings_to_resume(model_config_of(grown), source))


def read_continuation(source: Path) -> dict:
    """The continuation checkpoint at ``source``: a packed folder (joined and checked) or a file."""
    if not is_packed(source):
        return load_weights_only(source)
    with tempfile.TemporaryDirectory() as folder:
        return load_weights_only(unpack(source, Path(folder) / "joined.ckpt", option="grow"))


def grow(source: str | Path, out: str | Path, layers: int | None = None, dropout: float | None = None, seed: int = 0,
         part_bytes: int | None = None) -> dict:
    """Grow the continuation at ``source`` into the packed continuation ``out``; returns its manifest,
    with the grown shape (``grown``) and the overrides a run resuming from it needs (``train_overrides``)."""
    checkpoint = read_continuation(Path(source))
    grown = grow_checkpoint(checkpoint, layers, dropout, seed)
    with tempfile.TemporaryDirectory() as folder:
        joined = Path(folder) / "continue.ckpt"
        torch.save(grown, joined)
        manifest = pack(joined, out, "none", part_bytes)
    manifest[GROWN] = grown["imagetx"][GROWN][-1]
    manifest["train_overrides"] = train_overrides(model_config_of(checkpoint), grown)
    (Path(out) / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def next_command(out: Path, overrides: list[str]) -> str:
    """The training command that goes on from the grown continuation ``out``."""
    return shlex.join(["python", "-m", "imagetx.train", "--config", "CONFIG", "--resume", str(out), *overrides,
                       "--trainer.max_time", "DD:HH:MM:SS", "--trainer.default_root_dir", "NEW_RUN_FOLDER"])


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imagetx.training.grow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a packed continuation folder, or a continue.ckpt")
    parser.add_argument("out", type=Path, help="the grown packed continuation's folder")
    parser.add_argument("--layers", type=int, help="decoder layers of the grown model (identity layers added)")
    parser.add_argument("--dropout", type=float, help="the grown model's dropout")
    parser.add_argument("--seed", type=int, default=0, help="seeds the new tensors (default 0)")
    parser.add_argument("--part-mib", dest="part_bytes", type=mib_to_part_bytes, default=None,
                        help="parts of at most this many MiB (default: one)")
    options = parser.parse_args(args)
    if options.out.exists() and any(options.out.iterdir()):
        parser.error(f"{options.out} is not empty: grow into a new folder")
    try:
        manifest = grow(options.source, options.out, options.layers, options.dropout, options.seed, options.part_bytes)
    except UserError as error:  # CheckpointError among them; any other error is a bug: its traceback
        raise SystemExit(f"error: {error}") from None
    grown = manifest[GROWN]
    print(f"grown at step {grown['step']}: {grown['from']['n_layers']} -> {grown['to']['n_layers']} layers, dropout "
          f"{grown['to']['dropout']} ({grown['from']['parameters']:,} -> {grown['to']['parameters']:,} parameters), "
          f"into {options.out}")
    print(f"go on with: {next_command(options.out, manifest['train_overrides'])}")
    print(json.dumps({key: manifest[key] for key in ("step", "images_seen", GROWN, "train_overrides")}))


if __name__ == "__main__":
    main()
