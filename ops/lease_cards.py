"""The model card of a model trained a GPU lease at a time (ops/lease_record.py), written from
its lineage: the Hub's metadata (the newest lease's val bits/dim), one table row a lease, each
lease's val curve and notes, the newest lease's grids. Two kinds of model have one: generation
(`pretrained/cifar10_gpu`) and super-resolution (`pretrained/superres_gpu`, whose rows also give
the score with another image's 8×8 input: what the input is worth).

A model's folder holds what a user loads (weights, config, card, pictures); its training history
(`lineage.json`, each lease's logs, the continuation the next lease goes on from) lives beside
pretrained/ in `lineage/NAME/` (``lineage_folder``)."""

from __future__ import annotations

import json
from pathlib import Path

LINEAGE = "lineage"  # the folder beside pretrained/ that holds each lease-trained model's history, one folder a model


def lineage_folder(model: Path) -> Path:
    """Where the history of the model in ``model`` (pretrained/NAME) lives: lineage/NAME, beside pretrained/."""
    return model.parent.parent / LINEAGE / model.name


def is_superres(config: dict) -> bool:
    """Whether a model configuration (config.json as a dict) is a super-resolution model's: it encodes
    an 8×8 input (a ``superres`` section). gpu_lease.sh finish and lease_record.py home both ask this."""
    return config.get("superres") is not None


def number(value, form: str) -> str:
    return "–" if value is None else format(value, form)


def lineage_rows(lineage: list[dict], superres: bool) -> str:
    """The card's table rows: one a lease; the newest lease's val bits/dim (the shipped model's) in bold."""
    def bpd(lease: dict) -> str:
        if lease.get("val_bpd") is None:
            return "–"
        return f"**{lease['val_bpd']:.3f}**" if lease is lineage[-1] else f"{lease['val_bpd']:.3f}"

    def row(lease: dict) -> str:
        other = f" {number(lease.get('val_bpd_other_input'), '.3f')} |" if superres else ""
        return (f"| {lease['lease']} | {lease['date']} | {lease['device']} | {lease['training_minutes']} / "
                f"{number(lease.get('device_minutes'), '.1f')} | "
                f"{lease['first_step']:,} → {lease['last_step']:,} | {lease['images_seen']:,} | {bpd(lease)} |{other} "
                f"{number(lease.get('images_per_s'), ',.0f')} | {number(lease.get('mfu'), '.1%')} | "
                f"{number(lease.get('peak_memory_gib'), '.1f')} | {number(lease.get('continuation_step'), ',')} |")

    def grown_row(lease: dict) -> str:
        """The growth a lease went on from, a row of its own: same lineage, new shape (no minutes of its own:
        its seconds on the lent machine are the lease's, in the lease's row)."""
        blanks = " – |" * (7 if superres else 6)  # images seen to continuation: the columns after steps
        grown = lease["grown"]
        return f"| grown | {lease['date']} | – | – | at step {grown['step']:,}: {grown_shapes(grown)} |{blanks}"

    return "\n".join(grown_row(lease) + "\n" + row(lease) if lease.get("grown") else row(lease) for lease in lineage)


def grown_shapes(grown: dict) -> str:
    """A growth's shapes in words: what changed, and the parameters."""
    old, new = grown["from"], grown["to"]
    words = {"n_layers": "layers", "d_model": "d", "n_heads": "heads", "d_filter": "filter", "dropout": "dropout"}
    changed = [f"{words[key]} {old[key]} → {new[key]}" for key in words if old[key] != new[key]]
    return f"{', '.join(changed)} ({millions(old['parameters'])} → {millions(new['parameters'])} parameters)"


def millions(parameters: int) -> str:
    return f"{parameters / 1e6:.1f} M"


def described_network(shape: dict) -> str:
    """The GPU recipe's network in words, in the shape of the shipped model (``lease_record.model_shape``)."""
    return (f"{shape['n_layers']} layers, d {shape['d_model']}, {shape['n_heads']} heads, rotary 2D positions, "
            "one-row query blocks with the row above as memory, DMOL with 10 logistics")


def table(lineage: list[dict], superres: bool) -> str:
    score = "val bits/dim given the 8×8 input | given another image's |" if superres else "val bits/dim |"
    columns = f"| lease | date | GPU | training / device minutes | steps | images seen | {score} images/s | MFU | " \
              "peak GiB | continuation at step |"
    return f"{columns}\n{'|---' * (columns.count('|') - 1)}|\n{lineage_rows(lineage, superres)}"


def step_check_sentence(check: dict) -> str:
    """The lease's speed check of the training step (scripts/step_check.py), in one line."""
    mfu = "–" if check.get("mfu") is None else f"{check['mfu']:.1%}"
    kernels = "; ".join(f"{k['name'][:60]} {k['ms_per_step']:.1f} ms" for k in check.get("top_kernels", [])[:3])
    return (f"Speed check (the step alone, random images, {check.get('device_name', '?')}): "
            f"{check['images_per_s']:,.0f} images/s at batch {check['batch']}, MFU {mfu}, "
            f"{check['peak_mib'] / 1024:.1f} GiB, {check['compiled_graphs']} compiled graphs, "
            f"{check['graph_breaks']} graph breaks; costliest kernels a step: {kernels or '–'}.")


def lineage_notes(lineage: list[dict]) -> str:
    """Each lease's val curve (step: bits/dim, training's validations in bf16) and its notes."""
    lines = []
    for lease in lineage:
        curve = ", ".join(f"{step:,}: {bpd:.3f}" for step, bpd in lease.get("val_curve", []))
        unbounded = lease.get("val_bpd_without_bounds")
        without = "" if unbounded is None else f" The shipped weights without exact_box_means: {unbounded:.3f}."
        lines.append(f"- Lease {lease['lease']}: validations during training (step: val bits/dim) {curve or '–'}.{without}")
        if lease.get("random_flip"):
            lines.append("  - Trained with random left-right flips of its training images (`data.random_flip`).")
        if lease.get("grown"):
            lines.append(f"  - Went on from the previous lease's continuation grown at step {lease['grown']['step']:,} "
                         f"(`bash ops/gpu_lease.sh grow`, imagetx/training/grow.py: the same function, a larger "
                         f"shape): {grown_shapes(lease['grown'])}.")
        if lease.get("step_check"):
            lines.append(f"  - {step_check_sentence(lease['step_check'])}")
        lines += [f"  - {note}" for note in lease.get("notes", [])]
    return "\n".join(lines)


def metadata(name: str, task: str, task_name: str, bpd: float | None) -> str:
    """The Hub's front matter, with the model-index result where there is a val bits/dim."""
    index = "" if bpd is None else f"""model-index:
- name: imagetx-{name.replace('_', '-')}
  results:
  - task:
      type: {task}
      name: {task_name}
    dataset:
      type: cifar10
      name: CIFAR-10
      split: CIFAR-10 val (training images 45,000-49,999)
    metrics:
    - type: bits_per_dim
      name: val bits/dim
      value: {bpd:.3f}
"""
    return f"""---
library_name: imagetx
license: mit
pipeline_tag: {task}
tags:
- image-transformer
- autoregressive
- pixel-model
datasets:
- cifar10
metrics:
- bits_per_dim
{index}---
"""


def how_a_lease_runs(name: str) -> str:
    return f"""Each lease runs ops/README.md's call plan ("A lease, call by call"; `ops/gpu_lease.sh`):
`bash ops/lease_files.sh prepare` here; on the lent machine `setup`, `tests` beside `warm`,
`launch MAX_TIME` and `finish`; then `bash ops/lease_files.sh home FILES_AT` here, which writes
this folder (weights, config, this card and its pictures) and the model's training history in the
repository's `{LINEAGE}/{name}/`: `lineage.json`, each lease's `leases/lease_N/metrics.csv` and
`train.log`, and `continuation/`, the state the next lease goes on from."""


def generation_card(name: str, lineage: list[dict], minutes: str) -> str:
    shape = lineage[-1]["shape"]  # the shipped model's (lease_record.model_shape)
    grown = [str(lease["lease"]) for lease in lineage if lease.get("grown")]
    source = "`configs/cifar10_dmol_25min.yaml`" + (
        f"'s model as grown at lease{'s' * (len(grown) > 1)} {', '.join(grown)}" if grown else "")
    return f"""{metadata(name, "unconditional-image-generation", "Unconditional image generation", lineage[-1].get("val_bpd"))}
# `{name}`: the paper's CIFAR-10 DMOL model, trained a GPU lease at a time

{source} ({described_network(shape)}; {millions(shape['parameters'])} parameters),
trained on CIFAR-10 training images 0–44,999 with warmup–stable–decay: each lease goes on from the previous lease's
continuation (the state before its decay, in the repository's `{LINEAGE}/{name}/continuation/`)
and ends with a decay of its own; `model.safetensors` (bf16) is the newest lease's decayed model.
{len(lineage)} lease(s), {minutes}. Val bits/dim: all 5,000 val images (training images
45,000–49,999, never trained on), scored by `python -m imagetx.evaluate` from these bf16 weights.

```bash
python -m imagetx.evaluate --ckpt pretrained/{name} --data.root ../shared/cifar10 --split val
python -m imagetx.sample --ckpt pretrained/{name} --task generate --count 16 --out samples
python -m imagetx.sample --ckpt pretrained/{name} --task complete --images photo.png --out samples
```

{table(lineage, superres=False)}

{lineage_notes(lineage)}

Samples of the newest lease's model (seed 0; drawn on its GPU unless its notes say otherwise):
64 images drawn from nothing (`generate.png`), and 8 val images completed from their top 16 rows,
3 samples each beside the original (`complete.png`).

![64 samples](generate.png)

![completions](complete.png)

{how_a_lease_runs(name)}
"""


def superres_card(name: str, config: dict, lineage: list[dict], minutes: str) -> str:
    shape = lineage[-1]["shape"]  # the shipped model's (lease_record.model_shape)
    encoder_layers = config["superres"]["encoder_layers"]
    return f"""{metadata(name, "image-to-image", "Super-resolution 8×8 → 32×32", lineage[-1].get("val_bpd"))}
# `{name}`: 8×8 → 32×32 super-resolution on CIFAR-10, trained a GPU lease at a time

`configs/superres_gpu.yaml`: a {encoder_layers}-layer encoder over the 8×8 input's 192 sub-pixels and the GPU
recipe's decoder ({described_network(shape)}), each decoder layer adding a map of its pixel's low-res
encoding (the cell add, started at zero), each pixel reading what the rest of its cell must average
to (the cell remainder input); {millions(shape['parameters'])} parameters. Shipped with `exact_box_means`: every value is
drawn from what keeps its 4×4 cell's mean equal to the input's, so every sample averages back to
its input exactly. Trained on CIFAR-10 training images 0–44,999 with warmup–stable–decay, each
lease going on from the previous lease's continuation (in the repository's
`{LINEAGE}/{name}/continuation/`); `model.safetensors` (bf16) is the newest lease's decayed model.
{len(lineage)} lease(s), {minutes}.
Val bits/dim: all 5,000 val images (training images 45,000–49,999, never trained on), each
given its own 8×8 input (its 4×4 box means), scored by `python -m imagetx.evaluate` from these bf16
weights; "given another image's" is the same weights without the bounds (which give another
image's input no mass at all), each image scored with the next one's input
(`experiments/superres_input_use.py`): what the input is worth to the model.

```bash
python -m imagetx.evaluate --ckpt pretrained/{name} --data.root ../shared/cifar10 --split val
python -m imagetx.sample --ckpt pretrained/{name} --task superres --images small.png --out samples
python -m imagetx.sample --ckpt pretrained/{name} --task superres --data.root ../shared/cifar10 --count 16
```

{table(lineage, superres=True)}

{lineage_notes(lineage)}

16 val images, upsampled by the newest lease's model on its GPU (seed 0): the 8×8 input enlarged,
one sample at each of the temperatures 0.8, 0.9 and 1.0, and the original.

![16 val images: input, samples at 0.8, 0.9, 1.0, original](superres.png)

{how_a_lease_runs(name)}
"""


def minutes_sentence(lineage: list[dict]) -> str:
    """The GPU minutes of every lease, and those on the path to the shipped weights: each earlier
    lease up to its continuation (the next lease went on from there; its decay was left behind),
    then the newest lease whole. Equal GPU minutes between two models are minutes on their paths."""
    total = sum(lease.get("training_minutes") or 0 for lease in lineage)
    earlier = [lease.get("minutes_to_continuation") for lease in lineage[:-1]]
    if None in earlier:
        return f"{total:.1f} GPU minutes of training so far"
    path = sum(earlier) + (lineage[-1].get("training_minutes") or 0)
    return (f"{total:.1f} GPU minutes of training so far, {path:.1f} of them on the path to these weights "
            f"(each earlier lease up to its continuation, then the newest)")


def card(name: str, config: dict, lineage: list[dict]) -> str:
    """The model card of the folder ``name``, whose model has ``config`` (its config.json)."""
    if is_superres(config):
        return superres_card(name, config, lineage, minutes_sentence(lineage))
    return generation_card(name, lineage, minutes_sentence(lineage))


def write_card(into: Path, lineage: list[dict] | None = None) -> None:
    """``into``/README.md from ``lineage`` (default: the model's lineage.json, in ``lineage_folder(into)``)."""
    if lineage is None:
        lineage = json.loads((lineage_folder(into) / "lineage.json").read_text())
    config = json.loads((into / "config.json").read_text())
    (into / "README.md").write_text(card(into.name, config, lineage))
