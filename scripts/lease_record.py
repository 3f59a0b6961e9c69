"""The GPU model's lineage: what each lease added to it (docs/gpu.md, "Every lease adds to one model").

    python scripts/lease_record.py summary RUN_DIR OUT.json [--device cuda]   # on the lent machine
    python scripts/lease_record.py home FILES_AT [--into pretrained/cifar10_gpu] [--note TEXT ...]  # here, after it
    python scripts/lease_record.py card [--into pretrained/cifar10_gpu]          # the card again, from the lineage

``summary`` (run by ``scripts/gpu_lease.sh finish``) reads the run's last checkpoint and metrics:
steps (from where this lease started to its end), images seen by the model since its first lease,
training minutes, images/s, MFU, peak memory, the val curve, the GPU and torch. ``home`` takes
what the lease brought back (the decayed bf16 model, the packed continuation, results.tar),
checks the continuation's parts against its manifest, installs all of it into the shipped-weights
folder, appends the lease to ``lineage.json`` and writes the model card (README.md, with the
Hub's metadata) from the whole lineage. Nothing of the previous lease is kept in the folder but
its line in the lineage: git holds the earlier files.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import shutil
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from imagetx.io.checkpoint import load_weights_only  # noqa: E402
from imagetx.io.errors import CheckpointError  # noqa: E402
from imagetx.training.continuation import CONTINUE, MANIFEST, unpack  # noqa: E402

GPU_MODEL = REPO / "pretrained" / "cifar10_gpu"  # the shipped-weights folder a lease goes home to
THROUGHPUT = {"images_per_s": "train/device/samples_per_sec", "mfu": "train/device/mfu",
              "peak_memory_gib": "train/device/peak_memory_gib"}


def metric_rows(run: Path) -> list[dict]:
    rows = []
    for metrics in sorted(run.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        rows += list(csv.DictReader(metrics.open()))
    return rows


def summary(run: Path, device: str) -> dict:
    import torch

    last = load_weights_only(run / "checkpoints" / "last.ckpt", mmap=True)
    meta = last["imagetx"]
    rows = metric_rows(run)
    # The throughput columns' median over the lease (the first readings include compilation).
    medians = {}
    for name, column in THROUGHPUT.items():
        values = [float(row[column]) for row in rows if row.get(column)]
        medians[name] = round(statistics.median(values), 4) if values else None
    timer = last.get("callbacks", {}).get("Timer", {}).get("time_elapsed", {})
    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else device,
        "torch": torch.__version__,
        "first_step": meta.get("first_step", 0), "last_step": last["global_step"],
        "images_seen": meta.get("images_seen"),
        "training_minutes": round(timer.get("train", 0.0) / 60, 1),
        **medians,
        "val_curve": [(int(row["step"]), float(row["val/bpd"])) for row in rows if row.get("val/bpd")],
    }


def home(files_at: Path, into: Path, notes: list[str] | None = None) -> dict:
    """Install a lease's results into ``into``; returns the lease's lineage entry. ``notes``: what the
    figures alone do not say (a test that failed, a step run by hand), kept in the lineage and the card."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        with tarfile.open(files_at / "results.tar") as tar:
            tar.extractall(scratch, filter="data")  # plain files only, nothing outside scratch
        lease = json.loads((scratch / "lease.json").read_text())
        evaluation = scratch / "eval_val.json"
        lease["val_bpd"] = json.loads(evaluation.read_text())["bpd"] if evaluation.exists() else None
        continuation = into / "continuation"
        if (scratch / MANIFEST).exists():  # check the parts before anything of the old lineage is replaced
            staged = scratch / "continuation"
            staged.mkdir()
            shutil.copy(scratch / MANIFEST, staged)
            for part in json.loads((scratch / MANIFEST).read_text())["parts"]:
                shutil.copy(files_at / part, staged)
            unpack(staged, scratch / CONTINUE)  # raises if a part is missing or changed
            shutil.rmtree(continuation, ignore_errors=True)
            shutil.copytree(staged, continuation)
            lease["continuation_step"] = json.loads((scratch / MANIFEST).read_text())["step"]
        else:
            lease["continuation_step"] = None  # the next lease goes on from the continuation already here
        into.mkdir(parents=True, exist_ok=True)
        shutil.copy(files_at / "model.safetensors", into)
        shutil.copy(scratch / "config.json", into)
        lineage_path = into / "lineage.json"
        lineage = json.loads(lineage_path.read_text()) if lineage_path.exists() else []
        lease["lease"] = len(lineage) + 1
        if notes:
            lease["notes"] = list(notes)
        folder = into / "leases" / f"lease_{lease['lease']}"
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.csv", "train.log"):
            if (scratch / name).exists():
                shutil.copy(scratch / name, folder)
        for grid in (scratch / "grids").glob("*.png") if (scratch / "grids").exists() else []:
            shutil.copy(grid, into)
        lineage.append(lease)
        lineage_path.write_text(json.dumps(lineage, indent=1) + "\n")
        write_card(into, lineage)
    return lease


def lineage_rows(lineage: list[dict]) -> str:
    """The card's table rows: one a lease; the newest lease's val bits/dim (the shipped model's) in bold."""
    def bpd(lease: dict) -> str:
        if lease.get("val_bpd") is None:
            return "–"
        return f"**{lease['val_bpd']:.3f}**" if lease is lineage[-1] else f"{lease['val_bpd']:.3f}"

    def number(value, form: str) -> str:
        return "–" if value is None else format(value, form)

    return "\n".join(
        f"| {lease['lease']} | {lease['date']} | {lease['device']} | {lease['training_minutes']} | "
        f"{lease['first_step']:,} → {lease['last_step']:,} | {lease['images_seen']:,} | {bpd(lease)} | "
        f"{number(lease.get('images_per_s'), ',.0f')} | {number(lease.get('mfu'), '.1%')} | "
        f"{number(lease.get('peak_memory_gib'), '.1f')} | {number(lease.get('continuation_step'), ',')} |"
        for lease in lineage)


def lineage_notes(lineage: list[dict]) -> str:
    """Each lease's val curve (step: bits/dim, training's validations in bf16) and its notes."""
    lines = []
    for lease in lineage:
        curve = ", ".join(f"{step:,}: {bpd:.3f}" for step, bpd in lease.get("val_curve", []))
        lines.append(f"- Lease {lease['lease']}: validations during training (step: val bits/dim) {curve or '–'}.")
        lines += [f"  - {note}" for note in lease.get("notes", [])]
    return "\n".join(lines)


def write_card(into: Path, lineage: list[dict] | None = None) -> None:
    """``into``/README.md from ``lineage`` (default: the folder's own lineage.json)."""
    if lineage is None:
        lineage = json.loads((into / "lineage.json").read_text())
    (into / "README.md").write_text(card(lineage))


def eval_metadata(bpd: float | None) -> str:
    """The Hub's model-index front matter for a val bits/dim; none without one."""
    return "" if bpd is None else f"""model-index:
- name: imagetx-cifar10-gpu
  results:
  - task:
      type: unconditional-image-generation
      name: Unconditional image generation
    dataset:
      type: cifar10
      name: CIFAR-10
      split: CIFAR-10 val (training images 45,000-49,999)
    metrics:
    - type: bits_per_dim
      name: val bits/dim
      value: {bpd:.3f}
"""


def card(lineage: list[dict]) -> str:
    """The model card: the Hub's metadata (val bits/dim of the newest lease) and the lineage."""
    metadata = eval_metadata(lineage[-1].get("val_bpd"))
    minutes = sum(lease.get("training_minutes") or 0 for lease in lineage)
    return f"""---
library_name: imagetx
license: mit
pipeline_tag: unconditional-image-generation
tags:
- image-transformer
- autoregressive
- pixel-model
datasets:
- cifar10
metrics:
- bits_per_dim
{metadata}---

# `cifar10_gpu`: the paper's CIFAR-10 DMOL model, trained a GPU lease at a time

`configs/cifar10_dmol_25min.yaml` (14 layers, d 256, 8 heads, rotary 2D positions, one-row query
blocks with the row above as memory, DMOL with 10 logistics; 7.4 M parameters), trained on CIFAR-10
training images 0–44,999 with warmup–stable–decay: each lease goes on from the previous lease's
continuation (the state before its decay, `continuation/`) and ends with a decay of its own;
`model.safetensors` (bf16) is the newest lease's decayed model. {len(lineage)} lease(s),
{minutes:.1f} GPU minutes of training so far. Val bits/dim: all 5,000 val images (training images
45,000–49,999, never trained on), scored by `python -m imagetx.evaluate` from these bf16 weights.

```bash
python -m imagetx.evaluate --ckpt pretrained/cifar10_gpu --data.root ../shared/cifar10 --split val
python -m imagetx.sample --ckpt pretrained/cifar10_gpu --task generate --count 16 --out samples
python -m imagetx.sample --ckpt pretrained/cifar10_gpu --task complete --images photo.png --out samples
```

| lease | date | GPU | training minutes | steps | images seen | val bits/dim | images/s | MFU | peak GiB | continuation at step |
|---|---|---|---|---|---|---|---|---|---|---|
{lineage_rows(lineage)}

{lineage_notes(lineage)}

Samples of the newest lease's model, on its GPU (seed 0): 64 images drawn from nothing
(`generate.png`), and 8 val images completed from their top 16 rows, 3 samples each beside the
original (`complete.png`).

![64 samples](generate.png)

![completions](complete.png)

Each lease runs docs/gpu.md's call plan ("A lease, call by call"; `scripts/gpu_lease.sh`):
`bash scripts/lease_files.sh prepare` here; on the lent machine `setup`, `tests` beside `warm`,
`launch MAX_TIME` and `finish`; then `bash scripts/lease_files.sh home FILES_AT` here, which writes
this folder, its lineage (`lineage.json`, each lease's `leases/lease_N/metrics.csv` and
`train.log`) and this card.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("summary", help="on the lent machine: the lease's figures as JSON")
    s.add_argument("run", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--device", default="cuda")
    h = verbs.add_parser("home", help="here: install what a lease brought back")
    h.add_argument("files_at", type=Path)
    h.add_argument("--into", type=Path, default=GPU_MODEL)
    h.add_argument("--note", action="append", help="a line for the lineage and the card (repeatable)")
    c = verbs.add_parser("card", help="here: write the model card again from lineage.json")
    c.add_argument("--into", type=Path, default=GPU_MODEL)
    options = parser.parse_args(argv)
    try:
        if options.verb == "summary":
            options.out.write_text(json.dumps(summary(options.run, options.device), indent=1))
            print(f"lease summary in {options.out}")
        elif options.verb == "card":
            write_card(options.into)
            print(f"card written: {options.into / 'README.md'}")
        else:
            lease = home(options.files_at, options.into, options.note)
            print(f"lease {lease['lease']} installed in {options.into}: val bits/dim {lease['val_bpd']}, "
                  f"steps {lease['first_step']} → {lease['last_step']}")
    except (CheckpointError, OSError, KeyError, ValueError, tarfile.TarError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
