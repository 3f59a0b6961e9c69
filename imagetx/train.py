"""``python -m imagetx.train``: LightningCLI training with YAML presets (docs/model.md §8).

    python -m imagetx.train --config configs/quick.yaml [--data.root DIR] [--trainer.max_steps N]
                            [--resume auto|last|PATH] [--init_from WEIGHTS] [--wandb auto|online|offline|disabled]
                            [--checkpoint_every_n_steps N] [--checkpoint_every_minutes M] [--collective_timeout S]

No subcommand: it always fits. The data takes the model's image size and classes from
``--model.config`` (linked; a folder is converted to that size), so they are set once.
Every run writes, under ``trainer.default_root_dir``:
``checkpoints/`` (``last.ckpt`` and the best by ``val/bpd``), ``csv/version_N/``
(metrics and the resolved ``config.yaml``), ``samples/`` (PNG grids) and ``wandb/``.
Throughput comes from Lightning's ThroughputMonitor: ``train/device/samples_per_sec``
is images/s per device (``train/samples_per_sec``, all devices, with more than one),
``train/time`` the seconds spent training, validations left out, ``train/device/flops_per_sec``
the model's FLOP/s (imagetx/model/flops.py) and, on a device whose peak is known,
``train/device/mfu`` (imagetx/training/throughput.py).

Crashes: ``last.ckpt`` is rewritten (atomically) at every validation, every
``--checkpoint_every_n_steps`` optimiser steps, every ``--checkpoint_every_minutes`` and at the step
where training stops, so a killed run loses at most that many steps or minutes; ``--resume last``
continues it exactly where the checkpoint was taken (data/datamodule.py: the training order;
training/module.py: the dropout of each step), and ``--resume auto`` does where there is a
``last.ckpt`` and starts the run where there is none: the one command a requeued job reruns.
Ctrl-C, SIGTERM and SIGUSR1 end the step under way on every process, write ``last.ckpt`` there, say
so in one line and exit 128 + the signal (130, 143, 138; training/interrupt.py); outside a training
step (validation, the sanity check, a step that compiles) they end the run at once. A process that
waits ``--collective_timeout`` seconds for the others (one hung or dead) ends the run in one line.

From the command line, training on the CPU takes one torch thread per core that other jobs leave
free, and says so in one line (training/threads.py; ``OMP_NUM_THREADS`` decides instead).
A setting that would fail only once training started (``--trainer.max_time``, ``--data.batch_size``)
is refused first, and a run that fails before writing anything leaves no run folder behind.
"""

from __future__ import annotations

from argparse import ArgumentError
from dataclasses import fields
from operator import attrgetter
import logging
import shlex
import signal
import sys
import warnings
from pathlib import Path

import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, Timer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

from .cli.common import ConfigError, HelpFormatter, Stopped, program, run_or_exit
from .cli.config_guard import guard_configs
from .cli.errors import describe_parse_error
from .cli.shipped import resolve_config_args
from .data.datamodule import ImageDataModule
from .data.options import DataOptions
from .errors import UserError
from .io.atomic import check_writable, exclusive, remove_stale_temporaries
from .io.checkpoint import CHECKPOINT_DIR, LAST
from .model.config import ModelConfig
from .model.flops import count_flops
from .training.budget import BudgetHorizon, run_budget
from .training.callbacks import ContinuationCheckpoint, LastCheckpoint, RunBestCheckpoint, count_images
from .training.interrupt import StopRequested, StopSignals, requeue, stop_signals_end_the_step
from .training.checkpoint_io import AtomicCheckpointIO
from .training.module import ImageTransformerModule
from .training.no_gpu import check_gpu_settings
from .training.nonfinite import NonFiniteLossError
from .training.distributed import CollectiveTimeout, DEFAULT_COLLECTIVE_TIMEOUT, ddp_with_timeout, timed_out
from .training.resume import (AUTO, FinishedRun, checkpoint_to_resume, last_good_checkpoint, refuse_finished,
                              stopped_at)
from .training.run_folder import refuse_another_run
from .training.threads import choose_training_threads
from .training.throughput import ThroughputWithPeak
from .training.tracking import WANDB_MODES, KeepWandbRun, continue_wandb_run, make_loggers
from .training.trainer import Trainer
from .training.warm_start import start_from


# What the data takes from the model (ImageDataModule.FROM_MODEL): {data key: model option}.
LINKED = {f"data.{key}": f"--model.config.{key}" for key in ImageDataModule.FROM_MODEL}


class NothingToDo(Exception):
    """``--resume auto`` in a folder whose run has finished: the same command, rerun, succeeds."""


def clean_up_checkpoints(folder: Path) -> None:
    """Remove what a run killed mid-write left in ``folder`` (its checkpoints/), one process at a
    time: every process of a run starts with this, and another may be joining a packed continuation
    there meanwhile (``continuation.unpack``, under the same lock), which a removal would break.
    No process of the run writes a checkpoint before all have started (DDP's first collective)."""
    if folder.is_dir():
        with exclusive(folder):
            remove_stale_temporaries(folder)


def check_max_time(value) -> None:
    """``--trainer.max_time`` as Lightning's Timer reads it, or one ConfigError naming the forms it
    takes: Lightning refused ``3min`` or ``00:03:00`` only while building the trainer, in a
    50-line traceback, after the run folder was made."""
    if value is None:
        return
    try:
        Timer(duration=value)
    except (MisconfigurationException, TypeError, ValueError):
        raise ConfigError(f"--trainer.max_time {value!r} is not a duration: give days:hours:minutes:seconds, e.g. "
                          "00:00:03:00 for 3 minutes, or a mapping such as '{minutes: 3}'") from None


def check_data_settings(data) -> None:
    """The data settings the loaders would refuse only once training has started, after the loggers
    made the run's csv/ and wandb/ folders: refused first, in one line."""
    for key, least, what in (("batch_size", 1, "training images per step and device"),
                             ("eval_batch_size", 1, "images per validation batch (or leave it out: batch_size)"),
                             ("num_workers", 0, "data-loading worker processes (0: none)")):
        value = data.get(key)
        if value is not None and value < least:
            raise ConfigError(f"--data.{key} {value} is invalid: give the {what}, {least} or more")


def missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: what making it makes."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing


def remove_if_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: a run that failed before writing
    anything leaves no run folder behind; one that wrote something keeps all of it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone)
            return


def val_size_origin(args: list[str]) -> tuple[str, str] | None:
    """Where the command line ``args`` last set ``data.val_size``, and the data source in effect
    there: ``("--data.val_size", source)`` for the flag, ``(FILE, source)`` for a ``--config`` file
    (the source that file names, else the one in effect before it). None where nothing sets it, or
    where a whole ``--data`` value might."""
    source, origin = DataOptions.source, None
    for i, word in enumerate(args):
        key, equals, value = word.partition("=")
        value = value if equals else (args[i + 1] if i + 1 < len(args) else "")
        if key in ("--config", "-c"):
            try:
                with open(value, encoding="utf-8") as handle:
                    data = (yaml.safe_load(handle) or {}).get("data") or {}
            except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
                continue  # the parser has read it; what it could not read it has refused
            if isinstance(data, dict):
                source = data.get("source", source)
                origin = (value, source) if "val_size" in data else origin
        elif key == "--data.source":
            source = value
        elif key == "--data.val_size":
            origin = (key, source)
        elif key == "--data":
            return None
    return origin


def check_data_first(cli: LightningCLI) -> None:
    """Read (a folder: convert) and check the training and val images before the loggers start, so
    that a run whose data is missing or wrong leaves no CSV version folder or W&B run behind. One
    process only: with several, Lightning's ``prepare_data`` decides which process converts."""
    if cli.trainer.world_size == 1:
        cli.datamodule.prepare_data()
        cli.datamodule.rebuild = False  # rebuilt now: Lightning's own prepare_data reads the conversion
        for split in ("train", "val"):
            cli.datamodule.dataset(split)


class CountedModelSummary(ModelSummary):
    """Lightning's model summary, its "Total FLOPs" and the network's row (``model``) the forward
    FLOPs of one training batch as imagetx/model/flops.py counts them (exactly, from the attention
    the model computes): Lightning measures FLOPs only on a module's ``example_input_array`` and
    says 0 without one. Rows inside the network (a ``max_depth`` above 1) are not counted: "n/a"."""

    NETWORK = "model"  # the LightningModule's attribute that holds the ImageTransformer

    def on_fit_start(self, trainer, pl_module) -> None:
        self.flops = count_flops(pl_module.model, pl_module.device).forward * trainer.datamodule.batch_size
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data, *args, total_flops: int, **kwargs) -> None:
        columns = dict(summary_data)
        if "FLOPs" in columns:
            counted = {self.NETWORK: get_human_readable_count(self.flops)}
            columns["FLOPs"] = [counted.get(name, "n/a" if name.startswith(f"{self.NETWORK}.") else value)
                                for name, value in zip(columns["Name"], columns["FLOPs"])]
        super().summarize(list(columns.items()), *args, total_flops=self.flops, **kwargs)


class NoTips(logging.Filter):
    """Drops Lightning's advertisements ("💡 Tip: ... litlogger", "... litmodels"): they say nothing
    about the run, and a newcomer reads them as something to act on; its "Trainer already configured
    with model summary callbacks", on every run: the summary is imagetx's (CountedModelSummary), on
    purpose; and its "Detected KeyboardInterrupt, attempting graceful shutdown ...", which the one
    ``stopped:`` line of a training stopped by Ctrl-C replaces (``train``)."""

    DROPPED = ("💡 Tip", "Trainer already configured with model summary callbacks", "Detected KeyboardInterrupt")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith(self.DROPPED)


# where Lightning's rank_zero_info logs: lightning_utilities' logger, which lightning.fabric and then
# lightning.pytorch replace with their own as they are imported
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
              "lightning_utilities.core.rank_zero"):
    logging.getLogger(_name).addFilter(NoTips())


def quiet_known_warnings() -> None:
    """Warnings of other libraries that every run printed, each harmless here; filtered
    by its own words only, so that any other warning still shows. (Python drops a repeated filter.)"""
    # Lightning's CombinedLoader builds torch's leaf TreeSpec under its deprecated name (torch warns,
    # twice a run); the object is the same. Lightning's to change.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    # ModelCheckpoint on a resumed run's folder, or on a continued run's that holds the joined
    # continuation: imagetx refuses a new run in a folder that holds one (refuse_another_run), so
    # what is there is this run's own.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")


class ImagetxCLI(LightningCLI):
    """LightningCLI with imagetx's own options, one-line parse errors and what every run has."""

    made_folders: list[Path] = []  # the run folder and its parents that this run made (before_instantiate_classes)
    given_args: list[str] = []  # the command line as parsed (parse_arguments)
    val_size_from: str | None = None  # the --config file that set data.val_size, in words (val_size_for_source)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--resume", type=str | None, default=None, help="continue a run: 'last' "
                            "(<default_root_dir>/checkpoints/last.ckpt), 'auto' (last.ckpt where there is one, else "
                            "start the run: the command a requeued job reruns), a checkpoint path, or a continuation "
                            "(checkpoints/continue.ckpt, or its packed folder) to train on with a new budget")
        parser.add_argument("--init_from", type=str | None, default=None, help="start a new run from the weights "
                            "of another model with this run's decoder (a weights folder, checkpoint or continuation), "
                            "e.g. a super-resolution model from an unconditional one; its optimiser and schedule start afresh")
        parser.add_argument("--wandb", type=str, default="auto",
                            help=f"W&B mode, one of {', '.join(WANDB_MODES)}; auto = online with a key, else offline")
        parser.add_argument("--wandb_project", type=str, default="imagetx", help="W&B project name")
        parser.add_argument("--checkpoint_every_n_steps", type=int, default=1000,
                            help="also write last.ckpt every N optimiser steps (a crash loses at most N steps); "
                                 "0 = only at validations")
        parser.add_argument("--checkpoint_every_minutes", type=float, default=10.0,
                            help="also write last.ckpt at the first step end M minutes after it was last written "
                                 "(a killed run loses at most M minutes); 0 = not on the clock")
        parser.add_argument("--collective_timeout", type=float, default=DEFAULT_COLLECTIVE_TIMEOUT,
                            help="with several processes (--trainer.strategy ddp): seconds a process waits for the "
                                 "others at a collective before the run ends, naming it (a hung or dead process)")
        parser.set_defaults({"trainer.default_root_dir": "runs/default"})
        # From the model as built, its config's defaults filled in (a config left out is None
        # until then).
        for key in ImageDataModule.FROM_MODEL:
            parser.link_arguments("model", f"data.{key}", compute_fn=attrgetter(f"config.{key}"),
                                  apply_on="instantiate")

    def parse_arguments(self, parser, args) -> None:
        self.given_args = list(sys.argv[1:] if args is None else args)
        guard_configs()  # what the configs may import and expand (cli/config_guard.py)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            model_keys = [f"model.config.{field.name}" for field in fields(ModelConfig)]
            raise ConfigError(describe_parse_error(error, parser, args, "train", model_keys, LINKED)) from error

    def before_instantiate_classes(self) -> None:
        for target, source in LINKED.items():  # the link would overwrite a value from a YAML file unsaid
            if target in self.config:
                raise ConfigError(f"{target} is set from {source}: drop it from the YAML file")
        every = self.config.checkpoint_every_n_steps
        if every < 0:
            raise UserError(f"--checkpoint_every_n_steps {every} is invalid: give N >= 1, or 0 for validations only")
        if self.config.checkpoint_every_minutes < 0:
            raise ConfigError(f"--checkpoint_every_minutes {self.config.checkpoint_every_minutes} is invalid: give "
                              "minutes > 0, or 0 for none on the clock")
        if self.config.collective_timeout <= 0:
            raise ConfigError(f"--collective_timeout {self.config.collective_timeout} is invalid: give seconds > 0 "
                              f"(default {DEFAULT_COLLECTIVE_TIMEOUT:.0f}: long enough to compile the model)")
        if self.config.resume is not None and self.config.init_from is not None:
            raise ConfigError("--resume and --init_from both given: --resume continues a run (its weights included); "
                              "--init_from starts a new one from another model's weights. Give one")
        check_max_time(self.config.trainer.max_time)
        check_data_settings(self.config.data)
        said = check_gpu_settings(self.config.trainer, bool(self.config.model.get("compile")))
        if said is not None:
            rank_zero_info(said)
        self.val_size_for_source()
        self.made_folders = missing_folders(Path(self.config.trainer.default_root_dir))
        root = check_writable(self.config.trainer.default_root_dir, "--trainer.default_root_dir")
        refuse_another_run(root, self.config.resume)  # one folder per run: its checkpoints are its own
        if self.config.resume is not None:
            max_time = self.config.trainer.max_time
            try:
                refuse_finished(self.config.resume, root, self.config.trainer.max_steps,
                                None if max_time is None else Timer(duration=max_time).time_remaining())
            except FinishedRun as finished:
                if self.config.resume == AUTO:  # the same command, rerun: what it finished, and how to score it
                    raise NothingToDo(f"{finished.finished}; nothing is left to train (--resume auto); evaluate "
                                      f"it with: {evaluate_command(finished.path, self.config.data)}") from None
                raise
        clean_up_checkpoints(root / CHECKPOINT_DIR)

    def val_size_for_source(self) -> None:
        """A ``data.val_size`` from a ``--config`` file holds for the source that file was written for:
        the presets' 5,000 is CIFAR-10's, and on ``--data.source folder`` (given after it) it would
        hold out more images than a small folder has, where the folder's own default (a tenth) fits.
        There the source's default is taken, said in one line; a ``--data.val_size`` flag always holds."""
        origin, data = val_size_origin(self.given_args), self.config.data
        if origin is None or origin[0] == "--data.val_size" or data.val_size is None:
            return
        file, source = origin
        if source == data.source:
            self.val_size_from = f"data.val_size in {file}; --data.val_size N overrides it"
            return
        rank_zero_info(f"data: val_size {data.val_size} in {file} is for --data.source {source}; --data.source "
                       f"{data.source} holds out its own default instead (--data.val_size N sets another)")
        data.val_size = None

    def remove_unused_folders(self) -> None:
        """The run folder (and parents) this run made, where a failure left them empty."""
        remove_if_empty(self.made_folders)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except BaseException:  # e.g. a model setting refused: no empty run folder left behind
            self.remove_unused_folders()
            raise
        if self.val_size_from is not None:
            self.datamodule.val_size_from = self.val_size_from

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The configured trainer plus what every run has: checkpoints, loggers, throughput."""
        configured = self.config_init.trainer
        root = Path(configured.default_root_dir)
        callbacks = configured.callbacks or []
        callbacks = [*callbacks] if isinstance(callbacks, list) else [callbacks]
        callbacks += [
            RunBestCheckpoint(dirpath=root / CHECKPOINT_DIR, filename="best-{step}", monitor="val/bpd", save_top_k=1,
                              auto_insert_metric_name=False, enable_version_counter=False),
            LastCheckpoint(root / CHECKPOINT_DIR, self.config.checkpoint_every_n_steps,
                           self.config.checkpoint_every_minutes),
            ContinuationCheckpoint(root / CHECKPOINT_DIR),
            LearningRateMonitor(logging_interval="step"),
            BudgetHorizon(),
            ThroughputWithPeak(batch_size_fn=count_images, window_size=10),
            StopSignals(),
            KeepWandbRun(),
        ]
        if configured.enable_model_summary is not False:  # (a summary callback with it False is refused)
            callbacks.append(CountedModelSummary())
        if configured.logger in (None, True):
            kwargs.setdefault("logger", make_loggers(root, self.config.wandb, self.config.wandb_project))
        kwargs.setdefault("plugins", configured.plugins or [AtomicCheckpointIO()])
        strategy = ddp_with_timeout(configured.strategy, self.config.collective_timeout)
        if strategy is not None:
            kwargs.setdefault("strategy", strategy)
        return super().instantiate_trainer(callbacks=callbacks, **kwargs)


# The usage line, short: argparse's lists every one of the ~170 settings (75 lines); the options
# below it say them all.
USAGE = "{program} [--config FILE] [--resume last|PATH] [--wandb MODE] [--GROUP.KEY VALUE ...]"


def make_cli(args: list[str] | None = None) -> ImagetxCLI:
    """The parsed command line, with model, data and trainer built (nothing trained yet)."""
    # auto_configure_optimizers=False: the module builds its own optimiser and schedule
    # (--model.optimizer, --model.peak_lr, ...); Lightning's generic --optimizer / --lr_scheduler
    # would only lead --help with options that change nothing.
    return ImagetxCLI(ImageTransformerModule, ImageDataModule, trainer_class=Trainer, run=False, args=args,
                      seed_everything_default=0, save_config_kwargs={"overwrite": True},
                      auto_configure_optimizers=False,
                      parser_kwargs={"prog": program(), "usage": USAGE.format(program=program()), "description": __doc__,
                                     "exit_on_error": False, "formatter_class": HelpFormatter})


def train(args: list[str] | None = None, choose_threads: bool = False) -> None:
    """Train as ``args`` say (None: the command line). ``choose_threads``: set torch's CPU threads
    for the run (training/threads.py); the command line does, a Python caller keeps its own."""
    quiet_known_warnings()
    try:
        cli = make_cli(args)
    except NothingToDo as finished:
        print(f"finished: {finished}")
        return
    try:
        run_training(cli, choose_threads)
    except BaseException:
        cli.remove_unused_folders()  # a run that failed (or was stopped) before writing anything
        raise


def run_training(cli: ImagetxCLI, choose_threads: bool) -> None:
    """``train``'s work once the command line is read: the checks, then Lightning's fit."""
    root = Path(cli.trainer.default_root_dir)
    ckpt_path = checkpoint_to_resume(cli.config.resume, root, cli.model.config, run_budget(cli.trainer),
                                     cli.datamodule.hparams, cli.trainer.world_size)
    if cli.config.init_from is not None:
        print(start_from(cli.model.model, cli.config.init_from))
    check_data_first(cli)
    continue_wandb_run(cli.trainer.loggers, ckpt_path)  # a resumed run logs on to its W&B run
    if choose_threads and cli.trainer.strategy.root_device.type == "cpu":
        rank_zero_info(choose_training_threads(cli.trainer.num_devices))
    stop = next(callback for callback in cli.trainer.callbacks if isinstance(callback, StopSignals))
    try:
        with stop_signals_end_the_step(stop):
            # checkpoint_to_resume has read the file weights-only; Lightning must read it no other way
            cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path, weights_only=True)
    except NonFiniteLossError as error:
        raise NonFiniteLossError(f"{error}; {last_good_checkpoint(root)}") from error
    except StopRequested:
        pass  # the validation Lightning runs at a stop skipped, or a stop at once: said below
    except SystemExit:
        if stop.step is None:
            raise
        # a second Ctrl-C, inside a step (Lightning exits 1): one line, 130
        raise Stopped(stopped_line(cli, stop.step, signal.SIGINT)) from None
    except BaseException as error:
        if timed_out(error):
            raise CollectiveTimeout(cli.trainer, cli.config.collective_timeout) from error
        if not (stop.signum is not None and cli.trainer.world_size > 1 and isinstance(error, RuntimeError)):
            raise
        # stopped too: a peer that stopped at once (interrupt.py) was gone from a collective
    # stopped by a signal: at a step's end (agreed, last.ckpt written there), at once, or after the
    # last step (the signal came while the run's end was being written: the run is whole)
    signum = stop.agreed or stop.signum
    if signum is not None:
        said = stopped_line(cli, cli.trainer.global_step, signum, stop.during)
        requeued = requeue(cli.trainer, signum)
        raise Stopped(said if requeued is None else f"{said}; {requeued}", signum)
    if cli.trainer.is_global_zero:
        last = root / CHECKPOINT_DIR / LAST
        print(f"checkpoints in {last.parent}; evaluate with: {evaluate_command(last, cli.config.data)}")


def stopped_line(cli: ImagetxCLI, step: int, signum: int, during: str | None = None) -> str:
    """What a run stopped by ``signum`` after ``step`` kept, how to go on (resume.stopped_at) and how to
    score what it kept: a user stopping a try wants its figure as much as its continuation."""
    root = Path(cli.trainer.default_root_dir)
    said = stopped_at(root, step, signum, cli.config.resume, during)
    last = root / CHECKPOINT_DIR / LAST
    return f"{said}; evaluate it with: {evaluate_command(last, cli.config.data)}" if last.is_file() else said


def evaluate_command(ckpt: Path, data) -> str:
    """The command that scores ``ckpt`` on the images this run validated on: its data options
    (those that differ from the defaults) and val split, so that it runs as printed."""
    words = ["python", "-m", "imagetx.evaluate", "--ckpt", str(ckpt)]
    for name in ("source", "root", "crop", "resize", "cache"):
        value = data.get(name)
        if value is not None and value != getattr(DataOptions, name):
            words += [f"--data.{name}", str(value)]
    if data.get("val_size") is not None:
        words += ["--val_size", str(data.val_size)]
    return shlex.join([*words, "--split", "val"])


def main(args: list[str] | None = None) -> None:
    """The command: ``args`` None reads the command line and chooses the CPU threads (threads.py);
    given from Python, torch's threads stay as the caller set them."""
    command_line = args is None
    given = sys.argv[1:] if args is None else args
    resolved = resolve_config_args(given)  # configs/quick.yaml: also from an installed wheel, from any folder
    if resolved != given and args is None:
        sys.argv[1:] = resolved  # (LightningCLI warns when given args while sys.argv has some)
    elif resolved != given:
        args = resolved
    try:
        run_or_exit(lambda: train(args, choose_threads=command_line))
    except CollectiveTimeout as error:
        print(f"error: {error}", file=sys.stderr)
        error.end_started_processes()
        sys.exit(1)


if __name__ == "__main__":
    main()
