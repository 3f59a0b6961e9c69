"""The road to 2.90 on the CPU (issue 93, docs/experiments.md entry 35): when the GPU model grows and how
it is regularised, decided by a proxy in the lineage's regime, many epochs of a small subset.

    .venv/bin/python -m experiments.road_runs start    # the runner, detached: resumes what is unfinished
    .venv/bin/python -m experiments.road_runs status   # the plan, each run's state, the live processes
    .venv/bin/python -m experiments.road_runs stop     # ends the runner and its runs (checkpoints stay)
    .venv/bin/python -m experiments.road_runs table [--plot PNG]  # experiments/road_table.py, in the copy

The proxy: entry 33's GPU recipe shrunk to the CPU (2 layers of d 128, 4 heads of 32, filter 256, peak
8e-3, warm-up 180, batch 8, float32) on the first 1,720 training images, which gives it the GPU model's
parameters per training image (281,700 / 1,720 = 164; 7.4 M / 45,000 = 164), scored on the same 5,000
val images as every other run. One trunk of 50 epochs (the lineage's 47 today) whose continuation (step
8,600, 40 epochs: the lineage's newest continuation is at 42) is the branch point of every arm; each arm
goes on from it as a lease does (packed, no Adam moments, 100 steps of re-warm-up), with its own
decay over its last 20 %, to 150 epochs of the base shape's FLOPs: a grown arm ends at the same added
FLOPs, so fewer epochs. Validation over all 5,000 val images every 10 epochs (2,150 steps), the
training loss of every step in metrics.csv.

Fixed steps, one thread a run, at most two runs at a time (``PARALLEL``), each resumable: a run checkpoints
every 500 steps (about 5 minutes) and its job copies the newest checkpoint and the metrics up to it into the
tracked ``experiments/road_results/`` (``ckpt/NAME/``, ``NAME.steps.csv.gz``), from which a later session
goes on when ``runs/`` is gone. A finished run's figures: ``road_results/NAME.json``; the plan and
progress: ``road_results/STATUS.md``; the table and plot: ``road_runs table`` (experiments/road_table.py).
Everything runs from a copy of the code at ``COMMIT`` with this study's files laid over it
(``runs/road/code``), so that the work going on in the tree cannot change a run half-way.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# The working tree: this file's, or, in the copy of the code the runs use (runs/road/code), the one named
# by ROAD_REPO, which ``environment`` passes on.
REPO = Path(os.environ.get("ROAD_REPO") or Path(__file__).resolve().parents[1])
COMMIT = "0387453243b55783f1054fa562d5144f311d10be"  # the tree's HEAD when the study began
OVERLAY = ["experiments/road_runs.py", "experiments/road_table.py",
           "experiments/subset_shards.py"]  # this study's files, laid over the copy as they are now
# the library file the study added, laid over the copy as every grown arm ran it (the commit that added
# it): the library's later changes (its command line, its imports of files newer than COMMIT) stay out.
# The wide arms' wrapper too: the library dropped attention-width growth since (issue 110: entry 35 found
# it no better than going on), and with it the wrapper, kept here at the commit the arms ran.
PINNED = {"imagetx/training/grow.py": "e5eeda9", "experiments/road_wide_attention.py": "e5eeda9"}
ROAD = REPO / "runs" / "road"
CODE, RUNS, GROWN = ROAD / "code", ROAD / "runs", ROAD / "grown"
RESULTS = REPO / "experiments" / "road_results"
SOURCE = REPO.parent / "shared" / "cifar10"  # the 50,000 training images; the last 5,000 are val
PYTHON = REPO / ".venv" / "bin" / "python"
PARALLEL = 2  # runs at once: the machine's two cores, one thread each
POLL_S = 60  # how often a job copies its newest checkpoint and the runner rewrites STATUS.md
RETRIES = 2  # a run that stops short of its steps this many times in a row is marked failed

# ----- the proxy and its regime ---------------------------------------------------------------------
PROXY_PARAMETERS = 281_700  # the shrunk recipe below, counted (imagetx.model.superres.build_model)
GPU_PARAMETERS_PER_IMAGE = 7_400_548 / 45_000  # pretrained/cifar10_gpu over its training images: 164
BATCH = 8
# 281,700 / 164 = 1,713 images; 1,720 is the nearest multiple of the batch (215 steps an epoch, none dropped)
SUBSET_IMAGES = 1720
EPOCH = SUBSET_IMAGES // BATCH  # steps
VAL_EVERY = 10 * EPOCH  # validation over all 5,000 val images every 10 epochs
TRUNK_STEPS = 50 * EPOCH  # the lineage's epochs today (47)
BRANCH = TRUNK_STEPS - round(0.2 * TRUNK_STEPS)  # the trunk's continuation: just before its decay (20 %)
END = 150 * EPOCH  # where ten more leases at twice today's speed would take the lineage
SUBSET = ROAD / f"cifar10_{SUBSET_IMAGES}"
# Entry 33's shrunk recipe: cifar10_dmol_25min.yaml at 2 layers of d 128, heads of 32, filter 2·d.
RECIPE = ["--config", "configs/cifar10_dmol_25min.yaml", "--data.val_size", "5000", "--wandb", "disabled",
          "--trainer.max_time", "null", "--trainer.precision", "32-true", "--model.compile", "false",
          "--model.config.n_layers", "2", "--model.config.d_model", "128", "--model.config.d_filter", "256",
          "--model.config.attention.n_heads", "4", "--model.peak_lr", "0.008", "--model.warmup_steps", "180",
          "--data.batch_size", "8", "--trainer.log_every_n_steps", "1", "--checkpoint_every_n_steps", "500",
          "--trainer.callbacks", "null"]
# every 10 epochs, all 5,000 val images in batches of 50
LONG = ["--data.eval_batch_size", "50", "--trainer.val_check_interval", str(VAL_EVERY),
        "--trainer.limit_val_batches", "1.0"]
# Entry 33's table: 2,000 steps on the 45,000 images, 8 val batches of 32 every 250 steps, then all 5,000.
ROW_STEPS = 2000
ROW = ["--data.eval_batch_size", "32", "--trainer.val_check_interval", "250", "--trainer.limit_val_batches", "8"]
# The paper's 2D local attention as T2T sets it by default (configs/cifar10_2d.yaml): query blocks of
# 16 x 16, the 16 rows above and 32 columns either side as memory.
LOCAL_2D = ["--model.config.attention.kind", "local_2d", "--model.config.attention.query_block_shape", "[16,16]",
            "--model.config.attention.memory_flange", "[16,32]"]
BASE_HEADS, BASE_LAYERS = 4, 2


@dataclass
class Run:
    """One run of the plan. kind: trunk (from step 0 to ``end_epochs``; the one named trunk is the branch),
    arm (from the trunk's continuation, grown or regularised, to equal added FLOPs), scratch (a grown shape
    from step 0 for the trunk's and an arm's FLOPs), row (entry 33's table: 2,000 steps of the 45,000 images)."""

    name: str
    kind: str
    what: str
    seed: int = 0
    layers: int = BASE_LAYERS
    heads: int = BASE_HEADS
    dropout: float = 0.0
    flip: bool = False
    extra: list[str] = field(default_factory=list)
    end_epochs: int = 150  # an arm's end, in epochs of the base shape's FLOPs
    # a regulariser chosen from finished runs (``best_regulariser``); a run waits until it is known
    regulariser: str | None = None

    @property
    def folder(self) -> Path:
        return RUNS / self.name


# The regularisers alone from the branch point (item 2): the best of them regularises the grown arms and
# gets a second seed. Flips with the better dropout (flipdrop_s0) is not waited for: both dropouts alone
# ended far above arm 1 (0.1: +0.377), flips 0.0035 below it (entry 35), so the grown arm's regulariser is
# known a run earlier; a combination that won would be a grown arm of its own.
SINGLE = {"flip_s0": dict(flip=True), "drop01_s0": dict(dropout=0.1), "drop02_s0": dict(dropout=0.2)}

# In order of what decides most: arm 1 and the regularisers, the grown arms and their second seeds
# beside arm 1's, the short trunk (the projection's early slope), then what the rule for the grown lineage
# still waits on: dropout 0.2 (the single regularisers' last, which the regulariser of the grown arm waits
# for) beside depth from scratch, and the grown arm with the best regulariser (whether the grown lineage
# flips). Then what the study lists that no run has covered yet: the 2D row (item 5), a second seed of
# the grown arm with the regulariser (it changed the recipe) and the wide arm with it (item 3c). Last,
# what confirms without deciding: the best regulariser's second seed, flips with dropout, the earlier
# decays, width's second seed and width from scratch (at equal added FLOPs twice the width ended 0.002
# below arm 1 against twice the depth's 0.104, entry 35).
# A run starts when a slot is free and what it needs has finished.
PLAN = [
    Run("trunk", "trunk", "50 epochs from step 0; continuation at 40 epochs (the branch point)", end_epochs=50),
    Run("cont_s0", "arm", "1: continue as is (dropout 0)"),
    Run("flip_s0", "arm", "2: random flips", flip=True),
    Run("drop01_s0", "arm", "2: dropout 0.1", dropout=0.1),
    Run("deep_s0", "arm", "3a: twice the depth (identity layers)", layers=2 * BASE_LAYERS),
    Run("wide_s0", "arm", "3b: twice the attention width (new heads' output at zero)", heads=2 * BASE_HEADS),
    Run("cont_s1", "arm", "1, seed 1", seed=1),
    Run("deep_s1", "arm", "3a, seed 1", seed=1, layers=2 * BASE_LAYERS),
    # before the lineage's regime: the slope of arm 1's decayed val below 50 epochs, against which the slope
    # above 50 is measured (the projection of the leases, road_table.py); an hour, and the rule needs it
    Run("trunk_e25", "trunk", "25 epochs from step 0 (the trunk's schedule, shorter)", end_epochs=25),
    Run("drop02_s0", "arm", "2: dropout 0.2", dropout=0.2),
    Run("scratch_deep", "scratch", "4: twice the depth from step 0, the trunk's + an arm's FLOPs", layers=4),
    Run("deepreg_s0", "arm", "3c: twice the depth + the best regulariser", layers=2 * BASE_LAYERS, regulariser="best"),
    Run("row2d_s0", "row", "5: 2D local attention, entry 33's table", extra=LOCAL_2D),
    Run("row2d_s1", "row", "5: 2D local attention, seed 1", seed=1, extra=LOCAL_2D),
    Run("deepreg_s1", "arm", "3c, seed 1", seed=1, layers=2 * BASE_LAYERS, regulariser="best"),
    Run("widereg_s0", "arm", "3c: twice the width + the best regulariser", heads=2 * BASE_HEADS, regulariser="best"),
    Run("bestreg_s1", "arm", "2: the best regulariser, seed 1", seed=1, regulariser="best"),
    Run("flipdrop_s0", "arm", "2: flips + the better dropout", flip=True, regulariser="dropout"),
    # arm 1 decayed earlier: the lineage's curve of decayed val against epochs, each point a lease's end
    Run("cont_e75_s0", "arm", "1, decayed at 75 epochs", end_epochs=75),
    Run("cont_e100_s0", "arm", "1, decayed at 100 epochs", end_epochs=100),
    Run("wide_s1", "arm", "3b, seed 1", seed=1, heads=2 * BASE_HEADS),
    Run("scratch_wide", "scratch", "4: twice the width from step 0, the trunk's + an arm's FLOPs", heads=8),
]
BY_NAME = {run.name: run for run in PLAN}


# ----- FLOPs and steps ---------------------------------------------------------------------------------

def proxy_model(layers: int = BASE_LAYERS, heads: int = BASE_HEADS, d_model: int = 128, d_filter: int = 256,
                kernel: str = "sdpa", **attention):
    """The recipe's DMOL model (cifar10_dmol_25min.yaml, of the code that builds it) at this shape, with
    ``heads`` heads of 32 in its decoder self-attention (``widen_attention``) and the attention ``kernel``:
    a field of the attention's configuration in the code the runs use (commit COMMIT), an option of
    ``build_model`` since."""
    import dataclasses

    import yaml

    import imagetx
    from imagetx.model.config import AttentionConfig, ModelConfig
    from imagetx.model.superres import build_model
    preset = Path(imagetx.__file__).resolve().parents[1] / "configs" / "cifar10_dmol_25min.yaml"
    config = yaml.safe_load(preset.read_text())["model"]["config"]
    config.update(n_layers=layers, d_model=d_model, d_filter=d_filter)
    config["attention"] = {**config["attention"], "n_heads": d_model // 32, **attention}  # the recipe's heads of 32
    if "kernel" in {f.name for f in dataclasses.fields(AttentionConfig)}:
        config["attention"]["kernel"] = kernel
        model = build_model(ModelConfig(**config))
    else:
        model = build_model(ModelConfig(**config), kernel)
    return widen_attention(model, heads)


def widen_attention(model, heads: int):
    """``model`` with ``heads`` heads of its head size in every decoder self-attention layer, in place (new
    projections as ``nn.Linear`` initialises them): what the wide arms trained, as the library's
    ``imagetx.training.grow.widen_attention`` built it at commit e5eeda9 (the library has dropped it since)."""
    from torch import nn

    d = model.config.d_model
    for layer in model.layers:
        attention = layer.self_attn
        if heads != attention.n_heads:
            width = heads * attention.head_size
            attention.qkv = nn.Linear(d, 3 * width, bias=False)
            attention.proj = nn.Linear(width, d, bias=False)
            attention.n_heads = heads
    return model


def flops_per_image(layers: int = BASE_LAYERS, heads: int = BASE_HEADS, d_model: int = 128, d_filter: int = 256,
                    kernel: str = "sdpa", device: str = "cpu", **attention) -> int:
    """Training FLOPs of one image (``imagetx.model.flops``) of ``proxy_model``; with more heads than
    d_model / 32, the attention's pairs are counted at the wider width, which ``count_flops`` (reading
    d_model) does not know of."""
    from imagetx.model.flops import count_flops

    base_heads = d_model // 32
    flops = count_flops(proxy_model(layers, heads, d_model, d_filter, kernel, **attention), device)
    return flops.training + 3 * flops.attention * (heads - base_heads) // base_heads


def run_steps(run: Run) -> int:
    """The last step of ``run``: the trunk's 50 epochs; an arm at the base shape to END, a grown one to the
    same added FLOPs; from scratch, the trunk's to the branch and an arm's FLOPs; a row, entry 33's."""
    if run.kind == "trunk":
        return run.end_epochs * EPOCH
    if run.kind == "row":
        return ROW_STEPS
    ratio = flops_per_image() / flops_per_image(run.layers, run.heads)
    if run.kind == "arm":
        return BRANCH + round((run.end_epochs * EPOCH - BRANCH) * ratio)
    return round(END * ratio)


# ----- what has finished, and the regulariser it chose -------------------------------------------------

def result(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def best_regulariser() -> tuple[str, dict] | None:
    """The single regulariser (``SINGLE``) with the lowest decayed val, once each has finished: (its arm's
    name, its settings); None before; ("none", {}) where none beat continuing as is (cont_s0)."""
    scores = {name: result(name) for name in [*SINGLE, "cont_s0"]}
    if any(value is None for value in scores.values()):
        return None
    best = min(SINGLE, key=lambda name: scores[name]["val_bpd"])
    if scores[best]["val_bpd"] >= scores["cont_s0"]["val_bpd"]:
        return "none", {}
    return best, dict(SINGLE[best])


def better_dropout() -> float | None:
    """The dropout of the two dropout arms with the lower decayed val, once both have finished."""
    scores = {p: result(name) for p, name in ((0.1, "drop01_s0"), (0.2, "drop02_s0"))}
    if any(value is None for value in scores.values()):
        return None
    return min(scores, key=lambda p: scores[p]["val_bpd"])


def resolved(run: Run) -> Run | None:
    """``run`` with its regulariser chosen, None while the runs that choose it have not finished; a run
    whose best regulariser is none is not needed (``skipped``)."""
    if run.regulariser is None:
        return run
    if run.regulariser == "dropout":
        p = better_dropout()
        return None if p is None else Run(**{**run.__dict__, "dropout": p, "regulariser": None})
    best = best_regulariser()
    if best is None:
        return None
    settings = {key: value for key, value in best[1].items() if value is not None}
    return Run(**{**run.__dict__, **settings, "regulariser": None, "what": f"{run.what} ({best[0]})"})


def skipped(run: Run) -> bool:
    """A run with the best regulariser, where none beat continuing as is."""
    best = best_regulariser() if run.regulariser == "best" else None
    return best is not None and best[0] == "none"


# ----- commands --------------------------------------------------------------------------------------

def module_command(run: Run, module: str) -> list[str]:
    """python -m MODULE, through the wide-attention wrapper where the run's heads are more than the base's."""
    if run.heads != BASE_HEADS:
        return [str(PYTHON), "-m", "experiments.road_wide_attention", str(run.heads), module]
    return [str(PYTHON), "-m", module]


def train_command(run: Run, resume: str | None) -> list[str]:
    steps = run_steps(run)
    root = SOURCE if run.kind == "row" else SUBSET
    command = [*module_command(run, "imagetx.train"), *RECIPE, *(ROW if run.kind == "row" else LONG),
               "--data.root", str(root), "--trainer.max_steps", str(steps), "--trainer.default_root_dir",
               str(run.folder), "--seed_everything", str(run.seed)]
    if run.layers != BASE_LAYERS:
        command += ["--model.config.n_layers", str(run.layers)]
    if run.dropout:
        command += ["--model.config.dropout", str(run.dropout)]
    if run.flip:
        command += ["--data.random_flip", "true"]
    command += run.extra
    if resume:
        command += ["--resume", resume]
    return command


def grow_command(run: Run) -> list[str]:
    """The trunk's continuation grown into this arm's start (layers, heads, dropout; seeded by the arm)."""
    command = [str(PYTHON), "-m", "imagetx.training.grow", str(RESULTS / "ckpt" / "trunk_continuation"),
               str(GROWN / run.name), "--seed", str(run.seed)]
    if run.layers != BASE_LAYERS:
        command += ["--layers", str(run.layers)]
    if run.heads != BASE_HEADS:
        command += ["--attention-heads", str(run.heads)]
    if run.dropout:
        command += ["--dropout", str(run.dropout)]
    return command


def evaluate_command(run: Run, split: str) -> list[str]:
    root = SOURCE if run.kind == "row" else SUBSET
    return [*module_command(run, "imagetx.evaluate"), "--ckpt", str(run.folder / "checkpoints" / "last.ckpt"),
            "--data.root", str(root), "--val_size", "5000", "--split", split, "--batch_size", "50", "--device", "cpu"]


# ----- the copy of the code, the subset ------------------------------------------------------------------

def lay_over() -> None:
    """This study's files over the copy: the newest of its own (a run going already has read its own),
    the library's at their pinned commit."""
    for name in OVERLAY:
        shutil.copy(REPO / name, CODE / name)
    for name, commit in PINNED.items():
        (CODE / name).write_bytes(subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{name}"], check=True,
                                                 capture_output=True).stdout)


def prepare() -> None:
    """The copy of the code at COMMIT with this study's files over it, and the subset's shard."""
    if not (CODE / "imagetx").exists():
        CODE.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", COMMIT], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(CODE)], input=archive, check=True)
    lay_over()
    if not (SUBSET / "train-0.npz").exists():
        subprocess.run([str(PYTHON), "-m", "experiments.subset_shards", str(SOURCE), str(SUBSET), "--train",
                        str(SUBSET_IMAGES)], cwd=CODE, check=True, env=environment())
    RUNS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ckpt").mkdir(parents=True, exist_ok=True)


def environment() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
            "PYTHONPATH": str(CODE), "ROAD_REPO": str(REPO)}


# ----- a run's metrics, kept where a later session finds them ---------------------------------------------

def metric_rows(folder: Path) -> list[dict]:
    """Every metrics.csv row of a run, its versions in order (a resumed run writes a new version)."""
    rows = []
    for path in sorted(folder.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        with path.open() as handle:
            rows += list(csv.DictReader(handle))
    return rows


def read_steps(path: Path) -> dict[str, dict[int, float]]:
    """The kept metrics of a run (``NAME.steps.csv.gz``): {"train": {step: bpd}, "val": {step: bpd}}."""
    kept = {"train": {}, "val": {}}
    if path.exists():
        with gzip.open(path, "rt") as handle:
            for row in csv.reader(handle):
                kept[row[0]][int(row[1])] = float(row[2])
    return kept


def merged_steps(run: Run, upto: int | None = None) -> dict[str, dict[int, float]]:
    """The run's training loss at every step and its validations: those kept in road_results, then
    this session's metrics.csv (a step logged again after a resume takes its newest value), up to
    ``upto`` (the step the kept checkpoint holds), all where None."""
    kept = read_steps(RESULTS / f"{run.name}.steps.csv.gz")
    for row in metric_rows(run.folder):
        step = int(row["step"])
        for column, key in (("train/bpd", "train"), ("val/bpd", "val")):
            if row.get(column):
                kept[key][step] = float(row[column])
    if upto is not None:
        kept = {key: {step: value for step, value in values.items() if step <= upto} for key, values in kept.items()}
    return kept


def write_steps(run: Run, steps: dict[str, dict[int, float]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for key in ("train", "val"):
        for step in sorted(steps[key]):
            writer.writerow([key, step, f"{steps[key][step]:.5f}"])
    path = RESULTS / f"{run.name}.steps.csv.gz"
    temporary = path.with_suffix(".tmp")
    with gzip.open(temporary, "wt") as handle:
        handle.write(buffer.getvalue())
    temporary.replace(path)


def checkpoint_step(path: Path) -> int | None:
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # absent, or being written: the next poll reads it
        return None


def keep_progress(run: Run) -> None:
    """The run's newest last.ckpt and its metrics up to that step, into road_results (atomically)."""
    last = run.folder / "checkpoints" / "last.ckpt"
    kept = RESULTS / "ckpt" / run.name / "last.ckpt"
    step = checkpoint_step(last)
    if step is None or step == checkpoint_step(kept):
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(last, kept.with_suffix(".tmp"))
    if checkpoint_step(kept.with_suffix(".tmp")) != step:  # rewritten while copied: the next poll
        return
    write_steps(run, merged_steps(run, upto=step))
    kept.with_suffix(".tmp").replace(kept)


def keep_branch_point() -> None:
    """The trunk's continuation, packed (no Adam moments, as a lease keeps it), once it is written."""
    packed = RESULTS / "ckpt" / "trunk_continuation"
    written = RUNS / "trunk" / "checkpoints" / "continue.ckpt"
    if (packed / "continuation.json").exists() or checkpoint_step(written) != BRANCH:
        return
    subprocess.run([str(PYTHON), "-m", "imagetx.training.continuation", "pack", str(written), str(packed)],
                   cwd=CODE, env=environment(), check=True)


# ----- one run, start to figures (``job``) ----------------------------------------------------------------

def alive(pid_file: Path, marker: str) -> int | None:
    """The process id in ``pid_file`` where that process is alive and its command line holds ``marker``."""
    try:
        pid = int(pid_file.read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
        return None
    return pid if marker in command else None


def window_means(train: dict[int, float], end: int) -> list[tuple[int, float]]:
    """The mean training loss of every 10 epochs (steps (k·VAL_EVERY, (k+1)·VAL_EVERY]), and of the last
    part to ``end``, each at its last step."""
    windows: dict[int, list[float]] = {}
    for step, value in train.items():
        # Lightning logs the loss of update s at step s - 1 (its count before the update)
        edge = min(end, -(-(step + 1) // VAL_EVERY) * VAL_EVERY)
        windows.setdefault(edge, []).append(value)
    return [(edge, sum(values) / len(values)) for edge, values in sorted(windows.items())]


def job(name: str) -> None:
    """Train ``name`` to its steps (starting, resuming, or waiting on a process that trains it already),
    then score its decayed weights and write road_results/NAME.json."""
    run = resolved(BY_NAME[name])
    if run is None:
        sys.exit(f"{name}: the runs that choose its regulariser have not finished")
    try:
        train_and_score(run)
    except Exception as error:  # noted, so that the runner does not start it again and again
        mark_failed(run, f"{type(error).__name__}: {error}")
        raise


def train_and_score(run: Run) -> None:
    steps = run_steps(run)
    log = run.folder / "train.log"
    run.folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    failures = 0
    while checkpoint_step(run.folder / "checkpoints" / "last.ckpt") != steps:
        pid = alive(run.folder / "run.pid", str(run.folder))
        if pid is None:
            command = train_command(run, start_from(run))
            with log.open("a") as handle:
                handle.write(f"$ {' '.join(command)}\n")
            with log.open("a") as handle:
                process = subprocess.Popen(command, cwd=CODE, env=environment(), stdout=handle,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            (run.folder / "run.pid").write_text(str(process.pid))
            while process.poll() is None:
                time.sleep(POLL_S)
                track(run)
            if checkpoint_step(run.folder / "checkpoints" / "last.ckpt") != steps:
                failures += 1
                if failures >= RETRIES:
                    mark_failed(run, f"training exited {process.returncode} short of its steps {failures} times: "
                                     f"see {log}")
                    return
        else:  # a training process begun before this job (by hand, or by a job that ended)
            while alive(run.folder / "run.pid", str(run.folder)):
                time.sleep(POLL_S)
                track(run)
            if checkpoint_step(run.folder / "checkpoints" / "last.ckpt") != steps:
                failures += 1
                if failures >= RETRIES:
                    mark_failed(run, f"training stopped short {failures} times: see {log}")
                    return
    track(run)
    finish(run, steps, time.time() - started)


def start_from(run: Run) -> str | None:
    """--resume for the run's next training process: its own last.ckpt (restored from road_results where
    this session has none), else, for an arm, its grown start from the trunk's continuation."""
    last = run.folder / "checkpoints" / "last.ckpt"
    kept = RESULTS / "ckpt" / run.name / "last.ckpt"
    if not last.exists() and kept.exists():
        last.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(kept, last)
    if last.exists():
        return "last"
    if run.kind != "arm":
        return None
    shutil.rmtree(GROWN / run.name, ignore_errors=True)
    subprocess.run(grow_command(run), cwd=CODE, env=environment(), check=True,
                   stdout=(run.folder / "grow.log").open("w"), stderr=subprocess.STDOUT)
    return str(GROWN / run.name)


def track(run: Run) -> None:
    keep_progress(run)
    if run.name == "trunk":
        keep_branch_point()


def mark_failed(run: Run, why: str) -> None:
    (RESULTS / f"{run.name}.failed").write_text(why + "\n")


def evaluate(run: Run, split: str) -> float:
    done = subprocess.run(evaluate_command(run, split), cwd=CODE, env=environment(), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{run.name}: evaluate --split {split} exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["bpd"]


def finish(run: Run, steps: int, seconds: float) -> None:
    """The figures of a run trained to its steps: its validations, training loss every 10 epochs, the decayed
    weights' val (all 5,000) and training-set bits/dim (its own training images, no flips, no dropout)."""
    kept = merged_steps(run)
    first = BRANCH if run.kind == "arm" else 0
    val_points = sorted(kept["val"].items())
    # a validation is logged at the step count before the update it follows: step s + 1 updates
    final_val = val_points[-1][1] if val_points and val_points[-1][0] + 1 >= steps and run.kind != "row" else None
    if final_val is None:
        final_val = evaluate(run, "val")
    train_bpd = None if run.kind == "row" else evaluate(run, "train")
    per_image = flops_per_image(run.layers, run.heads, **({} if run.kind != "row" else row_attention(run)))
    base = flops_per_image()
    summary = {
        "name": run.name, "kind": run.kind, "what": run.what, "seed": run.seed, "layers": run.layers,
        "heads": run.heads, "dropout": run.dropout, "flip": run.flip, "first_step": first, "steps": steps,
        "epochs_at_end": steps / EPOCH, "flops_per_image": per_image,
        "added_flops_in_base_epochs": (steps - first) * per_image / (EPOCH * base),
        "val_curve": [(step + 1, (step + 1) / EPOCH, value) for step, value in val_points],
        "train_windows": [(edge, edge / EPOCH, mean) for edge, mean in window_means(kept["train"], steps)
                          if edge > first],
        "val_bpd": final_val, "train_bpd_decayed": train_bpd,
        "gap": None if train_bpd is None else final_val - train_bpd,
        "command": " ".join(train_command(run, "PACKED" if run.kind == "arm" else None)),
        "wall_seconds_this_session": round(seconds), "finished": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    (RESULTS / f"{run.name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    # a finished run needs no checkpoint to go on (the trunk's continuation is kept apart: every arm starts there)
    shutil.rmtree(RESULTS / "ckpt" / run.name, ignore_errors=True)


def row_attention(run: Run) -> dict:
    """The attention settings of a row's extra overrides, as flops_per_image takes them."""
    pairs = dict(zip(run.extra[::2], run.extra[1::2]))
    prefix = "--model.config.attention."
    return {key[len(prefix):]: json.loads(value) if value.startswith("[") else value for key, value in pairs.items()}


# ----- the runner ----------------------------------------------------------------------------------------

def state(run: Run) -> str:
    if result(run.name):
        return "done"
    if (RESULTS / f"{run.name}.failed").exists():
        return "failed"
    if alive(RUNS / run.name / "job.pid", f"job {run.name}"):
        return "running"
    if run.kind == "arm" and not (RESULTS / "ckpt" / "trunk_continuation" / "continuation.json").exists():
        return "waiting for the branch point"
    if skipped(run):
        return "not needed (no regulariser beat continuing as is)"
    if resolved(run) is None:
        return "waiting for the regularised arms"
    return "ready"


def start_job(run: Run) -> None:
    folder = RUNS / run.name
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "job.log").open("a") as handle:
        process = subprocess.Popen([str(PYTHON), "-m", "experiments.road_runs", "job", run.name], cwd=CODE,
                                   env=environment(), stdout=handle, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    (folder / "job.pid").write_text(str(process.pid))


def progress(run: Run) -> str:
    """Step / steps of a run, from its newest checkpoint (this session's, else the kept one)."""
    step = checkpoint_step(run.folder / "checkpoints" / "last.ckpt") or checkpoint_step(
        RESULTS / "ckpt" / run.name / "last.ckpt")
    try:
        steps = run_steps(run)
    except Exception:
        steps = None
    return f"{step if step is not None else '–'} / {steps if steps is not None else '?'}"


def write_status() -> None:
    lines = [
        "# The road to 2.90: the study's state (issue 93, docs/experiments.md entry 35)", "",
        f"Written {datetime.datetime.now().isoformat(timespec='seconds')} by `experiments/road_runs.py` "
        f"(pid {os.getpid()}). Go on in a later session with one command:", "",
        "```bash", ".venv/bin/python -m experiments.road_runs start   # skips finished runs, resumes the rest",
        ".venv/bin/python -m experiments.road_runs status", "```", "",
        f"Proxy: entry 33's shrunk recipe (281,700 parameters) on {SUBSET_IMAGES:,} training images "
        f"({PROXY_PARAMETERS / SUBSET_IMAGES:.0f} parameters an image; the GPU model "
        f"{GPU_PARAMETERS_PER_IMAGE:.0f}), {EPOCH} steps of 8 an epoch; trunk to step {TRUNK_STEPS:,} (50 epochs), "
        f"branch point {BRANCH:,} (40 epochs), arms to step {END:,} (150 epochs) or the same added FLOPs; "
        f"val over all 5,000 val images every {VAL_EVERY:,} steps. Two runs at a time, one thread each.", "",
        "| run | what | state | step / last step | hours (expected, whole run) | val (decayed) | job pid |",
        "|---|---|---|---|---|---|---|"]
    left = 0.0
    for run in PLAN:
        done = result(run.name)
        pid = alive(RUNS / run.name / "job.pid", f"job {run.name}")
        val = f"{done['val_bpd']:.4f}" if done else "–"
        hours = expected_hours(run)
        left += 0 if done else hours
        lines.append(f"| {run.name} | {run.what} | {state(run)} | {progress(run)} | {hours:.1f} | {val} | "
                     f"{pid or '–'} |")
    lines += ["", f"Expected: about {left:.0f} hours of one core for the runs not finished, {left / PARALLEL:.0f} "
              f"wall hours two at a time (the pace of {STEP_S} s a base step and {VALIDATION_S / 60:.0f} minutes a "
              "validation, measured on the trunk beside other work; a run already going has part of its hours behind "
              "it). The order is the plan's (`PLAN` in experiments/road_runs.py; its comment says why)."]
    lines += ["", "Kept for a later session: `ckpt/trunk_continuation/` (the branch point, packed), "
              "`ckpt/NAME/last.ckpt` (each unfinished run's newest checkpoint) and `NAME.steps.csv.gz` (its "
              "metrics up to that step); "
              f"{kept_size() / 2**20:.1f} MiB in `ckpt/` now. Figures of finished runs: `NAME.json`; the table and "
              "plot: `.venv/bin/python -m experiments.road_table`."]
    (RESULTS / "STATUS.md").write_text("\n".join(lines) + "\n")


# Measured on this machine (the trunk, one thread beside other work): 0.48 s a training step of the base
# shape, and 4 minutes to validate on the 5,000 val images; a grown shape costs its FLOPs' share more.
STEP_S, VALIDATION_S = 0.48, 240


def expected_hours(run: Run) -> float:
    """The wall hours a run takes from its start, at the base shape's measured pace scaled by its FLOPs."""
    steps = run_steps(run)
    first = BRANCH if run.kind == "arm" else 0
    if run.kind == "row":  # a row's cost is its attention's; 8 batches of 32 val images every 250 steps
        scale = flops_per_image(**row_attention(run)) / flops_per_image()
        return (steps * STEP_S * scale + (steps // 250) * VALIDATION_S * 256 / 5000 * scale) / 3600
    scale = flops_per_image(run.layers, run.heads) / flops_per_image()
    validations = (steps - first) // VAL_EVERY + 2  # and the final val and train scores
    return ((steps - first) * STEP_S * scale + validations * VALIDATION_S * scale) / 3600


def kept_size() -> int:
    return sum(path.stat().st_size for path in (RESULTS / "ckpt").rglob("*") if path.is_file())


def startable(states: dict[str, str]) -> list[str]:
    """The ready runs that may start, in plan order: a run waiting for the branch point holds back every
    run after it (so that no later run takes a slot the arms need); one waiting for the regularised arms'
    figures is passed over until they are in."""
    names = []
    for run in PLAN:
        if states[run.name] == "ready":
            names.append(run.name)
        elif states[run.name] == "waiting for the branch point":
            break
    return names


def runner() -> None:
    """Start ready runs in plan order while fewer than PARALLEL run; rewrite STATUS.md; end when none is
    left to start or running."""
    while True:
        states = {run.name: state(run) for run in PLAN}
        running = sum(value == "running" for value in states.values())
        for name in startable(states)[:max(0, PARALLEL - running)]:
            start_job(BY_NAME[name])
            states[name] = "running"
        write_status()
        if not any(value in ("running", "ready") or value.startswith("waiting") for value in states.values()):
            return
        time.sleep(POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verb", choices=["start", "run", "job", "status", "stop", "table"])
    parser.add_argument("name", nargs="?", help="job: the run")
    options, rest = parser.parse_known_args()
    if options.verb == "table":  # in the copy of the code the runs use: the tree's may be mid-change
        lay_over()
        # the paths given are the caller's, whose folder is not the copy's
        rest = [str(Path(word).resolve()) if before in ("--plot", "--json") else word
                for before, word in zip(["", *rest], rest)]
        sys.exit(subprocess.run([str(PYTHON), "-m", "experiments.road_table", *rest], cwd=CODE,
                                env=environment()).returncode)
    lock = ROAD / "runner.pid"
    if options.verb == "start":
        if alive(lock, "road_runs"):
            sys.exit(f"the runner is going already (pid {lock.read_text()})")
        prepare()
        with (ROAD / "runner.log").open("a") as handle:
            process = subprocess.Popen([str(PYTHON), "-m", "experiments.road_runs", "run"], cwd=CODE,
                                       env=environment(), stdout=handle, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        lock.write_text(str(process.pid))
        print(f"runner started (pid {process.pid}); its state: experiments/road_results/STATUS.md")
    elif options.verb == "run":
        runner()
    elif options.verb == "job":
        job(options.name)
    elif options.verb == "status":
        write_status()
        print((RESULTS / "STATUS.md").read_text())
    else:
        for pid_file in [lock, *RUNS.glob("*/job.pid"), *RUNS.glob("*/run.pid")]:
            pid = alive(pid_file, "road_runs" if pid_file.name != "run.pid" else str(pid_file.parent))
            if pid:
                os.kill(pid, signal.SIGTERM)
                print(f"stopped {pid_file.parent.name} ({pid})")


if __name__ == "__main__":
    main()
