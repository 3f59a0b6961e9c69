"""Growing a model in its lineage: a continuation made deeper or its attention wider, computing the
same function, so that the next run goes on from the source's bits/dim in the larger shape.

    python -m imagetx.training.grow SOURCE OUT [--layers N] [--attention-heads H] [--dropout P] [--seed S]

SOURCE: a packed continuation folder (lineage/NAME/continuation) or a ``continue.ckpt``; OUT: a
packed continuation folder of the grown model (Adam's moments: none, so the run that goes on from it
re-warms up over ``rewarmup_steps``, as every run resumed from a continuation without them does).
What grows:

* ``--layers N``: decoder layers added after the source's last (a pre-norm model), as ``--init_from``
  adds them (warm_start.py): identity layers, their residual writers at zero, the rest as initialised.
* ``--attention-heads H``: more heads of the same head size in every decoder self-attention layer
  (T2T's attention width 512 at d 256 is 16 heads of 32): the new heads' query, key and value rows
  as initialised, their columns of the output projection at zero, so they add nothing until they
  learn to. ``ModelConfig`` ties the heads to ``d_model / n_heads``, so no configuration describes
  such a model yet: ``widen_attention`` builds it from the configuration's model, the grown
  checkpoint records ``attention_heads``, and only code that widens the model it builds can train
  or score it (``experiments/road_wide_attention.py``). The lineage needs an attention width in the
  model's configuration before it can take this growth.
* ``--dropout P``: no tensors, the configuration's dropout (a regulariser switched on part-way
  through a lineage, from the continuation's step on).

The run that goes on from OUT passes the grown shape as overrides (``--resume`` checks that its
configuration is the continuation's); they are printed, and kept in the manifest as
``train_overrides``. Every new tensor draws from ``--seed``: the same command grows the same model.

Kept: ``--init_from`` starts a new run (step 0, a new warm-up, a new step count) and copies weights
only; a lineage grows in the middle of its run, from the continuation's step and images seen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..io.checkpoint import load_weights_only, model_config_of
from ..io.errors import CheckpointError
from ..io.parts import mib_to_part_bytes
from ..model.attention import SelfAttention
from ..model.config import ModelConfig
from ..model.superres import build_model
from ..model.transformer import ImageTransformer, zero_start
from .continuation import MANIFEST, is_packed, pack, slim_moments, unpack
from .resume import settings_to_resume, training_flags

PREFIX = "model."  # the LightningModule's name for the network: its tensors in a checkpoint's state_dict
# Where a checkpoint's metadata keeps the decoder self-attention heads of a model grown wider than its
# configuration's n_heads (``widen_attention``), and the record of each growth.
ATTENTION_HEADS = "attention_heads"
GROWN = "grown"


def decoder_attention(model: ImageTransformer) -> list[SelfAttention]:
    """Every decoder layer's self-attention (an encoder's has no pattern and keeps its heads)."""
    return [layer.self_attn for layer in model.layers]


def widen_attention(model: ImageTransformer, heads: int) -> ImageTransformer:
    """``model`` with ``heads`` heads of its head size in every decoder self-attention layer, in
    place: new projections, as ``nn.Linear`` initialises them (the caller seeds torch). The head
    size, and with it the rotary angles and the decoding cache's shape, stay the configuration's."""
    own = model.config.attention.n_heads
    if heads < own:
        raise ValueError(f"attention heads {heads}: fewer than the model's {own}; growing only adds heads")
    if heads == own:
        return model
    d = model.config.d_model
    for attention in decoder_attention(model):
        width = heads * attention.head_size
        weight = attention.to_qkv.weight
        attention.to_qkv = nn.Linear(d, 3 * width, bias=False).to(weight.device, weight.dtype)
        attention.to_out = nn.Linear(width, d, bias=False).to(weight.device, weight.dtype)
        attention.n_heads = heads
    return model


def model_heads(checkpoint: dict) -> int:
    """The decoder self-attention heads of the model in ``checkpoint``: its configuration's, or those it
    was grown to (``ATTENTION_HEADS``)."""
    return int(checkpoint["imagetx"].get(ATTENTION_HEADS) or model_config_of(checkpoint).attention.n_heads)


def grown_config(config: ModelConfig, layers: int | None = None, dropout: float | None = None) -> ModelConfig:
    """``config`` with ``layers`` decoder layers and ``dropout``, each where given; a ValueError for
    fewer layers, or for added layers in a post-norm model (which cannot start them as the identity)."""
    if layers is not None and layers < config.n_layers:
        raise ValueError(f"--layers {layers}: fewer than the source's {config.n_layers}; growing only adds layers")
    if layers not in (None, config.n_layers) and config.norm != "pre":
        raise ValueError(f"--layers {layers}: only a pre-norm model (norm: pre) can add layers as identity layers")
    changes = {"n_layers": layers, "dropout": dropout}
    return dataclasses.replace(config, **{key: value for key, value in changes.items() if value is not None}).validate()


def head_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A fused q/k/v projection's weight (heads·3·e, d), in ``project_heads``'s (head, part, e) order,
    as (heads, 3·e, d): one block of rows a head."""
    return weight.reshape(heads, -1, weight.shape[-1])


def grown_state(stored: dict[str, torch.Tensor], source: ModelConfig, target: ModelConfig, source_heads: int,
                heads: int, seed: int) -> dict[str, torch.Tensor]:
    """The network's tensors (no prefix) of the ``target`` model with ``heads`` heads, grown from
    ``stored`` (a ``source`` model with ``source_heads``): the source's tensors where it has them
    (its heads first), the rest as a model built under ``seed`` initialises them, with every added
    layer's residual writers and every added head's output columns at zero."""
    torch.manual_seed(seed)
    model = widen_attention(build_model(target), heads)
    zero_start(linear for layer in list(model.layers)[source.n_layers:] for linear in layer.residual_writers())
    state = {name: value.clone() for name, value in model.state_dict().items()}
    for name, value in stored.items():
        if name not in state:
            raise CheckpointError(f"the grown model has no tensor {name}: the source is not a decoder of this kind")
        own = state[name]
        if value.shape == own.shape:
            own.copy_(value)
        elif name.endswith("self_attn.to_qkv.weight"):  # the source's heads first, the new ones as initialised
            head_rows(own, heads)[:source_heads].copy_(head_rows(value, source_heads))
        elif name.endswith("self_attn.to_out.weight"):  # the source's heads' columns, zeros for the new ones
            own.zero_()
            own[:, :value.shape[1]].copy_(value)
        else:
            raise CheckpointError(f"{name}: {tuple(value.shape)} in the source, {tuple(own.shape)} grown; "
                                  "only attention heads grow wider")
    return state


def grow_checkpoint(checkpoint: dict, layers: int | None = None, heads: int | None = None,
                    dropout: float | None = None, seed: int = 0) -> dict:
    """A continuation checkpoint's grown copy: its network grown (``grown_state``), its configuration
    the grown one, Adam's moments dropped (``slim_moments`` none: the new tensors have none) and its
    parameter list as long as the grown model's; the loops, schedule, step and images seen kept."""
    meta = checkpoint["imagetx"]
    if not meta.get("continuation"):
        raise CheckpointError("the source is not a continuation checkpoint: grow the continue.ckpt a run writes "
                              "before its decay, or a packed continuation")
    source = model_config_of(checkpoint)
    if source.superres is not None:  # its layers also read the low-resolution input: not built
        raise CheckpointError("the source is a super-resolution model: growing one is not built (a plain decoder only)")
    source_heads = model_heads(checkpoint)
    target = grown_config(source, layers, dropout)
    target_heads = source_heads if heads is None else heads
    if target_heads < source_heads:
        raise ValueError(f"--attention-heads {heads}: fewer than the source's {source_heads}; growing only adds heads")
    stored = {name[len(PREFIX):]: value for name, value in checkpoint["state_dict"].items()}
    state = grown_state(stored, source, target, source_heads, target_heads, seed)
    grown = dict(checkpoint)
    grown["state_dict"] = {PREFIX + name: value for name, value in state.items()}
    grown["imagetx"] = {**meta, "model_config": target.to_dict()}
    if target_heads != target.attention.n_heads:
        grown["imagetx"][ATTENTION_HEADS] = target_heads
    record = {"step": checkpoint["global_step"], "images_seen": meta.get("images_seen"), "seed": seed,
              "from": shape(source, source_heads, len(stored), sum(v.numel() for v in stored.values())),
              "to": shape(target, target_heads, len(state), sum(v.numel() for v in state.values()))}
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


def shape(config: ModelConfig, heads: int, tensors: int, parameters: int) -> dict:
    """A model's shape as the lineage records it."""
    return {"n_layers": config.n_layers, "d_model": config.d_model, "attention_heads": heads,
            "head_size": config.head_size, "d_filter": config.d_filter, "dropout": config.dropout,
            "tensors": tensors, "parameters": parameters}


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


def grow(source: str | Path, out: str | Path, layers: int | None = None, heads: int | None = None,
         dropout: float | None = None, seed: int = 0, part_bytes: int | None = None) -> dict:
    """Grow the continuation at ``source`` into the packed continuation ``out``; returns its manifest,
    with the grown shape (``grown``) and the overrides a run resuming from it needs (``train_overrides``)."""
    checkpoint = read_continuation(Path(source))
    grown = grow_checkpoint(checkpoint, layers, heads, dropout, seed)
    with tempfile.TemporaryDirectory() as folder:
        joined = Path(folder) / "continue.ckpt"
        torch.save(grown, joined)
        manifest = pack(joined, out, "none", part_bytes)
    manifest[GROWN] = grown["imagetx"][GROWN][-1]
    manifest["train_overrides"] = train_overrides(model_config_of(checkpoint), grown)
    if ATTENTION_HEADS in grown["imagetx"]:
        manifest[ATTENTION_HEADS] = grown["imagetx"][ATTENTION_HEADS]
    (Path(out) / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imagetx.training.grow", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a packed continuation folder, or a continue.ckpt")
    parser.add_argument("out", type=Path, help="the grown packed continuation's folder")
    parser.add_argument("--layers", type=int, help="decoder layers of the grown model (identity layers added)")
    parser.add_argument("--attention-heads", type=int, help="decoder self-attention heads of the head size")
    parser.add_argument("--dropout", type=float, help="the grown model's dropout")
    parser.add_argument("--seed", type=int, default=0, help="seeds the new tensors (default 0)")
    parser.add_argument("--part-mib", dest="part_bytes", type=mib_to_part_bytes, default=None,
                        help="parts of at most this many MiB (default: one)")
    options = parser.parse_args(args)
    if options.out.exists() and any(options.out.iterdir()):
        parser.error(f"{options.out} is not empty: grow into a new folder")
    try:
        manifest = grow(options.source, options.out, options.layers, options.attention_heads, options.dropout,
                        options.seed, options.part_bytes)
    except (CheckpointError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    print(json.dumps({key: manifest[key] for key in ("step", "images_seen", GROWN, "train_overrides")}))


if __name__ == "__main__":
    main()
