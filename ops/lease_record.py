"""A GPU-trained model's lineage: what each lease added to it (ops/README.md, "Every lease adds to one
model"). Two models are trained so: pretrained/cifar10_gpu and pretrained/superres_gpu (--into).

    python ops/lease_record.py summary RUN_DIR OUT.json [--device cuda]   # on the lent machine
    python ops/lease_record.py home FILES_AT [FILES_AT ...] [--into pretrained/cifar10_gpu] [--note TEXT ...]
                                    [--device-minutes M]
    python ops/lease_record.py card [--into pretrained/cifar10_gpu]          # the card again, from the lineage

``summary`` (run by ``ops/gpu_lease.sh finish``) reads the run's last checkpoint and metrics:
steps (from where this lease started to its end), images seen by the model since its first lease,
training minutes (and those up to its continuation, from that checkpoint's timer), images/s, MFU,
peak memory, the val curve, the GPU and torch. ``home`` takes what the lease brought back, from
every call's folder that brought some (ops/outbox.py: the decayed bf16 model in parts, the packed
continuation, results.tar) and checks the model's and the continuation's parts against their
records before anything is replaced. What a user loads goes into the shipped-weights folder (``--into``,
pretrained/NAME: weights, config.json, the grids and the model card, README.md with the Hub's
metadata, ops/lease_cards.py); the training history into the model's lineage folder, lineage/NAME
beside pretrained/ (ops/lease_cards.py, ``lineage_folder``): the continuation, the lease's logs in
leases/lease_N/, and the lease appended to ``lineage.json``, from which the card is written. Nothing
of the previous lease is kept but its line in the lineage and its logs: git holds the earlier files.
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
from imagetx.io.parts import MANIFEST_SUFFIX, read_parts  # noqa: E402
from imagetx.training.continuation import CONTINUE, MANIFEST, TIMER_STATE, unpack  # noqa: E402
from ops.lease_cards import is_superres, lineage_folder, write_card  # noqa: E402

GPU_MODEL = REPO / "pretrained" / "cifar10_gpu"  # the shipped-weights folder a lease goes home to by default
THROUGHPUT = {"images_per_s": "train/device/samples_per_sec", "mfu": "train/device/mfu",
              "peak_memory_gib": "train/device/peak_memory_gib"}


def metric_rows(run: Path) -> list[dict]:
    rows = []
    for metrics in sorted(run.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        rows += list(csv.DictReader(metrics.open()))
    return rows


def training_seconds(checkpoint: dict) -> float | None:
    """The training time Lightning's Timer had counted when ``checkpoint`` was written (None without it)."""
    return checkpoint.get("callbacks", {}).get(TIMER_STATE, {}).get("time_elapsed", {}).get("train")


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
    continuation = run / "checkpoints" / CONTINUE
    # The training minutes up to the continuation: what this lease adds to the path of the next
    # lease's weights (the rest of its minutes, its decay, is left behind with its own weights).
    to_continuation = training_seconds(load_weights_only(continuation, mmap=True)) if continuation.exists() else None
    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else device,
        "torch": torch.__version__,
        "first_step": meta.get("first_step", 0), "last_step": last["global_step"],
        "images_seen": meta.get("images_seen"),
        # the data's one training-time choice the model's config does not hold (the card says so)
        "random_flip": bool(last.get("datamodule_hyper_parameters", {}).get("random_flip")),
        "training_minutes": round((training_seconds(last) or 0.0) / 60, 1),
        "minutes_to_continuation": None if to_continuation is None else round(to_continuation / 60, 4),
        **medians,
        "val_curve": [(int(row["step"]), float(row["val/bpd"])) for row in rows if row.get("val/bpd")],
    }


def scores(results: Path, superres: bool) -> dict:
    """The lease's val bits/dim (None where its scoring did not come back). A super-resolution model's
    is of the shipped weights with exact_box_means; beside it, without the bounds, and without them
    given another image's 8x8 input (gpu_lease.sh finish)."""
    def read(name: str, key: str = "bpd"):
        path = results / name
        return json.loads(path.read_text())[key] if path.exists() else None

    if not superres:
        return {"val_bpd": read("eval_val.json")}
    return {"val_bpd": read("eval_val_bounded.json"), "val_bpd_without_bounds": read("eval_val.json"),
            "val_bpd_other_input": read("input_use.json", "bpd_other_image_input")}


def model_shape(config_file: Path) -> dict:
    """The shape of the model whose config.json is ``config_file``: layers, width, heads, filter, dropout and
    parameters (counted on the model it builds)."""
    from imagetx.io.weights import read_config
    from imagetx.model.superres import build_model

    config = read_config(config_file)
    parameters = sum(p.numel() for p in build_model(config).parameters())
    return {"n_layers": config.n_layers, "d_model": config.d_model, "n_heads": config.attention.n_heads,
            "d_filter": config.d_filter, "dropout": config.dropout, "parameters": parameters}


def growth(before: Path, after: dict, step: int) -> dict | None:
    """Where the lease's model has another shape than the shipped one it went on from (its continuation was
    grown, imagetx/training/grow.py: ``gpu_lease.sh grow``): the growth at the lease's first step, from the
    shape of ``before`` (the shipped config.json) to ``after`` (the lease's model's ``model_shape``); None
    where nothing grew or there was no model before."""
    if not before.exists():
        return None
    old = model_shape(before)
    return None if old == after else {"step": step, "from": old, "to": after}


MODEL = "model.safetensors"


def brought_back(folders: list[Path]) -> dict[str, Path]:
    """Each file the lease's calls brought back, by name (a name sent again: the later call's copy)."""
    found = {}
    for folder in folders:
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder of files a call brought back")
        found.update({path.name: path for path in sorted(folder.iterdir()) if path.is_file()})
    return found


def gather(found: dict[str, Path], names: list[str], folders: list[Path], into: Path) -> None:
    """Copy the files ``names`` from what came back into ``into``; one line naming the fix for any missing."""
    missing = [name for name in names if name not in found]
    if missing:
        raise ValueError(f"{', '.join(missing)} not among the files in {', '.join(map(str, folders))}: "
                         "`bash ops/gpu_lease.sh more` on the lent machine (while it is warm) sends what "
                         "`finish` had no room for; give home every call's folder")
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(found[name], into / name)


def home(folders: list[Path], into: Path, notes: list[str] | None = None, suite_record: Path | None = None,
         device_minutes: float | None = None) -> dict:
    """Install a lease's results, from the folders of the calls that brought them back (``folders``),
    into ``into`` (pretrained/NAME) and its lineage folder (lineage/NAME); returns the lease's lineage
    entry. ``notes``: what the figures alone do not say (a test that failed,
    a step run by hand), kept in the lineage and the card. ``suite_record``: where a record of the whole
    CUDA suite's pass goes, when the lease ran it (ops/cuda_suite.py). ``device_minutes``: the lease's
    device time (the device tool's held seconds at its last call, / 60), which the card shows beside
    the training minutes."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        found = brought_back(folders)
        gather(found, ["results.tar"], folders, scratch / "tar")
        with tarfile.open(scratch / "tar" / "results.tar") as tar:
            tar.extractall(scratch, filter="data")  # plain files only, nothing outside scratch
        lease = json.loads((scratch / "lease.json").read_text())
        config = json.loads((scratch / "config.json").read_text())
        superres = is_superres(config)
        lease.update(scores(scratch, superres))
        if superres:  # shipped with the bounds: the same weights, samples keep their input's box means
            config["superres"]["exact_box_means"] = True
        history = lineage_folder(into)
        continuation = history / "continuation"
        # The model and the continuation checked against their parts' records before anything is replaced.
        record = json.loads((scratch / (MODEL + MANIFEST_SUFFIX)).read_text())  # the model's parts (finish)
        gather(found, record["parts"], folders, scratch / "model_parts")
        (scratch / MODEL).write_bytes(read_parts(scratch / "model_parts", record))
        if (scratch / MANIFEST).exists():
            staged = scratch / "continuation"
            staged.mkdir()
            shutil.copy(scratch / MANIFEST, staged)
            gather(found, json.loads((scratch / MANIFEST).read_text())["parts"], folders, staged)
            unpack(staged, scratch / CONTINUE)  # raises if a part is cut short or changed
            shutil.rmtree(continuation, ignore_errors=True)
            shutil.copytree(staged, continuation)
            lease["continuation_step"] = json.loads((scratch / MANIFEST).read_text())["step"]
        else:
            lease["continuation_step"] = None  # the next lease goes on from the continuation already here
        into.mkdir(parents=True, exist_ok=True)
        (scratch / "shipped_config.json").write_text(json.dumps(config, indent=2) + "\n")
        lease["shape"] = model_shape(scratch / "shipped_config.json")  # the card's sentence on the model
        grown = growth(into / "config.json", lease["shape"], lease["first_step"])
        if grown:  # the lineage's row for it (same lineage, new shape): ops/lease_cards.py
            lease["grown"] = grown
        shutil.copy(scratch / MODEL, into)
        (into / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        lineage_path = history / "lineage.json"
        lineage = json.loads(lineage_path.read_text()) if lineage_path.exists() else []
        lease["lease"] = len(lineage) + 1
        if notes:
            lease["notes"] = list(notes)
        if device_minutes is not None:
            lease["device_minutes"] = device_minutes
        folder = history / "leases" / f"lease_{lease['lease']}"
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.csv", "train.log", "step_candidates.json"):  # the last where the lease measured them
            if (scratch / name).exists():
                shutil.copy(scratch / name, folder)
        grids = scratch / ("grids_bounded" if superres else "grids")  # the shipped model's
        for grid in grids.glob("*.png") if grids.exists() else []:
            shutil.copy(grid, into)
        if (scratch / "step_check.json").exists():  # the first call's speed check (scripts/step_check.py)
            lease["step_check"] = json.loads((scratch / "step_check.json").read_text())
        if suite_record is not None and (scratch / "cuda_suite_passed.json").exists():
            shutil.copy(scratch / "cuda_suite_passed.json", suite_record)
        lineage.append(lease)
        lineage_path.write_text(json.dumps(lineage, indent=1) + "\n")
        write_card(into, lineage)
    return lease


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("summary", help="on the lent machine: the lease's figures as JSON")
    s.add_argument("run", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--device", default="cuda")
    h = verbs.add_parser("home", help="here: install what a lease brought back")
    h.add_argument("files_at", type=Path, nargs="+", help="the folder of each call's files (finish's, and wait's "
                   "or more's where they brought some)")
    h.add_argument("--into", type=Path, default=GPU_MODEL)
    h.add_argument("--note", action="append", help="a line for the lineage and the card (repeatable)")
    h.add_argument("--suite-record", type=Path, help="where a whole CUDA suite pass's record goes, if the lease ran it")
    h.add_argument("--device-minutes", type=float,
                   help="the lease's device minutes (held at its last call), for the card")
    c = verbs.add_parser("card", help="here: write the model card again from its lineage folder's lineage.json")
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
            lease = home(options.files_at, options.into, options.note, options.suite_record, options.device_minutes)
            print(f"lease {lease['lease']} installed in {options.into}: val bits/dim {lease['val_bpd']}, "
                  f"steps {lease['first_step']} → {lease['last_step']}")
    except (CheckpointError, OSError, KeyError, ValueError, tarfile.TarError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
