"""What older files hold, read as today's: the model configuration in the forms files of this
imagetx's lineage store (``model_config``), and weights under older parameter names and layouts
(``current_names``).

A super-resolution model's weights have had five forms of names. Today the model composes the
decoder (``decoder.layers.3.self_attn...``), each of whose layers holds its cross-attention
(``decoder.layers.3.cross_attn.q.weight``, ``decoder.layers.3.cross_norm``) and, post-norm, the norm
after its cell add (``decoder.layers.3.c_norm``), beside the encoder, the cell sums and the cell adds
(``cell_adds.3.proj.weight``). First the model held the decoder and its readings of the encoder
beside it (``readings.3.cross_attn.q.weight``); then the model was the decoder (no ``decoder.``) and
each layer held its reading's parts itself (``layers.3.cell_add.proj.weight``), then under
``reading`` (``layers.3.reading.cell_add.proj.weight``: the names the codec's fingerprint hashes),
then as today without ``decoder.``.

Every model's attention projections had other names and, fused, another order (``PROJECTIONS``):
``to_qkv`` with its output features in (head, part, e) order, where today's ``qkv`` has them in
(part, head, e) order, the order of the (B, h, T, e) layout (model/attention.py).

Shipped folders, checkpoints and continuations written then are read through ``current_names``;
a continuation's Adam moments of the reordered projections through ``reordered_projections``.
The optimiser lists the parameters in the order it always has
(``training.module.parameter_groups``), so its state (matched by order) goes on. The codec's
model fingerprint hashes the weights in an older form (``older_state``: the projections' and the
readings'), as it always has, so that every compressed file names its model as it did.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from ..model.attention import CrossAttention, SelfAttention
from ..model.config import GEOMETRY, AttentionConfig, ModelConfig, SuperResolutionConfig

# The parts of a super-resolution model's decoder layers that read the encoder, each with its
# name today without the decoder's prefix ({i}: the layer's index), and the older forms of their
# names: first under ``readings.<i>.``, then in the layer itself, then under ``layers.<i>.reading.``.
READING_PARTS = {"cross_attn": "layers.{i}.cross_attn.", "cross_norm": "layers.{i}.cross_norm.",
                 "cell_add": "cell_adds.{i}.", "cell_norm": "layers.{i}.c_norm."}
PARTS = "|".join(READING_PARTS)
OLDER_READING = re.compile(rf"(?:readings|layers)\.(\d+)\.(?:reading\.)?((?:{PARTS})\..*)")
TODAY_READING = re.compile(r"(?:layers|cell_adds)\.(\d+)\.(.*)")
# A super-resolution model's name for its decoder, and for the parts it holds beside it.
DECODER = "decoder."
BESIDE_DECODER = ("encoder.", "cell_remainder.", "cell_adds.")


# An attention projection's older name -> (today's, the parts its output features fuse: q, k and v).
PROJECTIONS = {"to_qkv": ("qkv", 3), "to_kv": ("kv", 2), "to_q": ("q", 1), "to_out": ("proj", 1)}


def current_names(state: dict[str, Tensor], model: nn.Module, prefix: str = "") -> dict[str, Tensor]:
    """``state`` (names under ``prefix``: "model." in a training checkpoint) of ``model`` with
    older names and projection layouts made today's, in the same order; today's state as it is."""
    state = reading_names(state, prefix)
    older = older_projections(state, model, prefix)
    today = {}
    for name, value in state.items():
        name, order = older.get(name, (name, None))
        today[name] = value if order is None else in_today_order(value, *order)
    return today


def reordered_projections(state: dict[str, Tensor], model: nn.Module, prefix: str = "") -> dict[str, tuple[int, int]]:
    """Today's names of the fused projections that ``state`` holds in the older order, each with
    its heads and parts: what Adam's moments of those tensors need too (``in_today_order``)."""
    older = older_projections(reading_names(state, prefix), model, prefix)
    return {today: order for today, order in older.values() if order is not None}


def older_projections(state: dict[str, Tensor], model: nn.Module,
                      prefix: str) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """{older name: (today's name, (heads, parts) of a fused projection whose output features are
    to be reordered, else None)} of the attention projections ``state`` stores under their older
    names. A tensor of another shape than ``model``'s is renamed only: the check of every tensor
    against the model then names it (``io.weights.check_tensors``)."""
    attentions = attention_modules(model)
    found = {}
    for name, value in state.items():
        owner, projection = projection_of(name.removeprefix(prefix)) if name.startswith(prefix) else ("", "")
        if projection in PROJECTIONS and owner in attentions:
            today, parts = PROJECTIONS[projection]
            fused = parts > 1 and value.shape == getattr(attentions[owner], today).weight.shape
            found[name] = (f"{prefix}{owner}.{today}.weight", (attentions[owner].n_heads, parts) if fused else None)
    return found


def older_state(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state in the older form (``PROJECTIONS``, ``as_reading``), in the same order: the
    names and layout the codec's model fingerprint has always hashed."""
    older = {today: (name, parts) for name, (today, parts) in PROJECTIONS.items()}
    attentions = attention_modules(model)
    state = {}
    for name, value in model.state_dict().items():
        owner, projection = projection_of(name)
        if projection in older and owner in attentions:
            older_name, parts = older[projection]
            name = f"{owner}.{older_name}.weight"
            value = in_older_order(value, attentions[owner].n_heads, parts) if parts > 1 else value
        state[as_reading(name)] = value
    return state


def attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """{path: module} of ``model``'s attention layers, whose projections changed names and order."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, (SelfAttention, CrossAttention))}


def projection_of(name: str) -> tuple[str, str]:
    """(the owner's path, the module's name) of a weight's ``name`` ("layers.0.self_attn",
    "to_qkv" of "layers.0.self_attn.to_qkv.weight"); ("", "") for another tensor."""
    path, _, tensor = name.rpartition(".")
    owner, _, module = path.rpartition(".")
    return (owner, module) if tensor == "weight" else ("", "")


def in_today_order(weight: Tensor, heads: int, parts: int) -> Tensor:
    """A fused projection's (parts·h·e, d) weight, or a moment of it, from (head, part, e) order of
    its output features to (part, head, e)."""
    return rearrange(weight, "(h p e) d -> (p h e) d", h=heads, p=parts).contiguous()


def in_older_order(weight: Tensor, heads: int, parts: int) -> Tensor:
    """``in_today_order``'s inverse: (part, head, e) order back to (head, part, e)."""
    return rearrange(weight, "(p h e) d -> (h p e) d", h=heads, p=parts).contiguous()


def reading_names(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """``state`` with a super-resolution model's older names (its readings', its decoder's) made today's."""
    names = [name.removeprefix(prefix) for name in state if name.startswith(prefix)]
    if not any(name.startswith("encoder.") for name in names):
        return state
    return {rename(name, prefix): value for name, value in state.items()}


def rename(name: str, prefix: str) -> str:
    """One parameter's name today: a reading's (in any older form) as ``READING_PARTS`` names it, and
    every part of the decoder under ``DECODER``."""
    if not name.startswith(prefix):
        return name
    own = name.removeprefix(prefix).removeprefix(DECODER)
    found = OLDER_READING.fullmatch(own)
    if found:
        index, (part, rest) = found.group(1), found.group(2).split(".", 1)
        own = READING_PARTS[part].format(i=index) + rest
    return prefix + (own if own.startswith(BESIDE_DECODER) else DECODER + own)


def as_reading(name: str) -> str:
    """Today's name of a parameter -> its name without ``DECODER`` and, a reading's, under
    ``layers.<i>.reading.``: the form the codec's fingerprint hashes."""
    name = name.removeprefix(DECODER)
    found = TODAY_READING.fullmatch(name)
    if found:
        index = found.group(1)
        for part, today in READING_PARTS.items():
            if name.startswith(today.format(i=index)):
                return f"layers.{index}.reading.{part}.{name.removeprefix(today.format(i=index))}"
    return name


# ----- the model configuration -------------------------------------------------------------------

# The last commit of imagetx that reads what this one refuses (a file of its time reads there):
# relative positions that lost to rotary ones and were removed ...
REMOVED_RELATIVE_POSITIONS = ("table", "distance", "rotary_distance")
LAST_COMMIT_WITH_THEM = "0bb0603"
# ... and local cross-attention (a radius of low-res cells around each step, which the cell add
# reads as well in 17 % less time); a saved null radius (every cell) is today's cross-attention.
REMOVED_CROSS_ATTENTION_RADIUS = "cross_attention_radius"
LAST_COMMIT_WITH_RADIUS = "1ba98d3"
# How attention runs, stored in the configuration until it became a build option (``build_model``),
# with the values every stored model had; another value is refused, naming the option.
RUN_OPTIONS = {"kernel": ("auto", "--model.attention_kernel"), "flex_block_size": (128, "--model.flex_block_size")}
# The one-level form of files written before the sections: each field that now lives in a
# section, under its name there (the kernel, then a field of the attention section, as
# ``attention_kernel``).
FLAT_NAMES = {
    **{name: ("attention", name) for name in ("n_heads", "query_block_length", "memory_blocks", "query_block_shape",
                                              "memory_flange", "relative_positions", "flex_block_size")},
    "attention_kernel": ("attention", "kernel"),
    **{name: ("superres", name) for name in ("encoder_layers", "low_res_size", "low_res_reading",
                                             "cell_remainder_input", "exact_box_means", "low_res_zero_start")},
}


def model_config(values: dict[str, Any]) -> ModelConfig:
    """The configuration a file stores, in any form a file of this imagetx's lineage holds: today's
    (``ModelConfig.to_dict``); with the attention kernel and its tiles in the attention section and
    another kind's geometry beside its own (files before they left it); or one level, every
    section's fields beside the rest (files before the sections: the lineage's continuations)."""
    values = dict(values)
    if isinstance(values.get("attention"), str) or any(name in values for name in FLAT_NAMES):
        values = nested(values)
    attention = dict(values.get("attention") or {})
    for name, (stored, option) in RUN_OPTIONS.items():
        if name in attention and attention.pop(name) != stored:
            raise UserError(f"attention.{name} is how a model runs, no longer part of its configuration: "
                            f"leave it out and give {option} instead")
    kind = attention.get("kind", AttentionConfig.kind)
    for other, names in GEOMETRY.items():
        for name in names if other != kind else ():
            attention.pop(name, None)
    if attention.get("relative_positions") in REMOVED_RELATIVE_POSITIONS:
        raise UserError(f"attention.relative_positions {attention['relative_positions']!r} was removed (rotary "
                        f"positions learn faster at no kernel cost): read this file with commit "
                        f"{LAST_COMMIT_WITH_THEM} of imagetx")
    return ModelConfig.from_dict({**values, "attention": attention})


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """The one-level form -> the sectioned one. There, ``encoder_layers`` 0 was a plain decoder."""
    if values.pop(REMOVED_CROSS_ATTENTION_RADIUS, None) is not None:
        raise UserError(f"{REMOVED_CROSS_ATTENTION_RADIUS} was removed (the cell add reads the step's own low-res "
                        f"pixel as well, faster): read this file with commit {LAST_COMMIT_WITH_RADIUS} of imagetx")
    sections: dict[str, dict[str, Any]] = {"attention": {}, "superres": {}}
    if isinstance(values.get("attention"), str):
        sections["attention"]["kind"] = values.pop("attention")
    for name, (section, field_name) in FLAT_NAMES.items():
        if name in values:
            sections[section][field_name] = values.pop(name)
    superres_given = values.get("superres") is not None
    for section, moved in sections.items():
        given = values.get(section)
        if given is not None and (not isinstance(given, dict) or set(given) & set(moved)):
            raise UserError(f"ModelConfig.{section} is given both as a section and field by field: give it once")
        values[section] = {**(given or {}), **moved}
    superres = sections["superres"]
    if not superres_given and not superres.get("encoder_layers", 0):  # one level, no encoder: a plain decoder
        for name in ("low_res_reading", "cell_remainder_input", "exact_box_means", "low_res_zero_start"):
            if superres.get(name, getattr(SuperResolutionConfig, name)) != getattr(SuperResolutionConfig, name):
                raise UserError(f"ModelConfig.{name}={superres[name]!r} is invalid: needs a low-resolution input: "
                                "set encoder_layers > 0")
        values["superres"] = None
    return values


def one_level(config: ModelConfig) -> dict[str, Any]:
    """``config`` in the one-level form, with the run options at the values every stored model had
    and both kinds' geometry: what the codec's model fingerprint hashes (codec/container.py), as it
    hashed it for files compressed before today's form."""
    out = config.to_dict()
    attention, superres = out.pop("attention"), out.pop("superres")
    run_options = {name: stored for name, (stored, _) in RUN_OPTIONS.items()}
    attention = {**asdict(AttentionConfig()), **attention, **run_options}
    attention = {name: list(value) if isinstance(value, tuple) else value for name, value in attention.items()}
    sections = {"attention": attention,
                "superres": superres or {**asdict(SuperResolutionConfig()), "encoder_layers": 0}}
    out["attention"] = attention["kind"]
    for name, (section, field_name) in FLAT_NAMES.items():
        out[name] = sections[section][field_name]
    if attention.get("head_size") is not None:  # a width of the attention's own: none before the field
        out["head_size"] = attention["head_size"]
    if not out["num_transforms"]:  # no transform input (data/transforms.py): none before the field
        del out["num_transforms"]
    return out
