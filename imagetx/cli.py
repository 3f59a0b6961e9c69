"""What the commands (train, evaluate, sample, export) share: parsing with jsonargparse, the
check of ``--device``, and one way to fail on bad input (train parses through LightningCLI,
with the Trainer below).

Bad input (a setting, a file, a checkpoint, a request the model cannot serve) ends the
command with one line ``error: <the problem and the fix>`` on stderr and exit code 2;
``IMAGETX_DEBUG=1`` raises instead, with the whole traceback.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from argparse import ArgumentError, RawDescriptionHelpFormatter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import lightning as L
import torch
import yaml
from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace
from jsonargparse.typing import register_type

from .checkpoint import CheckpointError
from .data import ImageDataModule
from .sources import DataError, Reader

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting the parser rejected (unknown key, wrong type, missing file)."""


# FloatingPointError: a run stopped by non-finite steps (NonFiniteLossError, nonfinite.py), or a
# model whose outputs are not finite asked to sample (sampler.py): one line, like bad input.
BAD_INPUT = (ConfigError, DataError, CheckpointError, FloatingPointError, OSError, ValueError)


def run_or_exit(command: Callable[[], T]) -> T:
    """``command()``, turning bad input into one ``error:`` line and exit code 2."""
    try:
        return command()
    except BAD_INPUT as error:
        if os.environ.get("IMAGETX_DEBUG"):
            raise
        print("error: " + " ".join(str(error).split()), file=sys.stderr)
        sys.exit(2)


def check_device(device: str | torch.device) -> None:
    """A device this machine has, or a ValueError saying which to use instead."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"--device {device!r} is not a device name ({error}); use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")


class Number(float):
    """A float option that also reads 'nan' and 'inf' (jsonargparse's float does not), so
    that the command can refuse them with its own message."""


register_type(Number, serializer=float, deserializer=Number)


class HelpFormatter(DefaultHelpFormatter, RawDescriptionHelpFormatter):
    """jsonargparse's ``--help``, with the command's docstring laid out as written."""


class Trainer(L.Trainer):
    """Lightning's Trainer, with the batch limits typed ``int | float`` so that a YAML ``1``
    stays the count 1. Lightning's own annotation reaches the parser as ``float | int``
    (typing caches a Union by its members, whatever their order), which turns 1 into 1.0:
    every batch.

    Args:
        limit_train_batches: training batches per epoch: an int counts, a float is a fraction
        limit_val_batches: validation batches per validation: an int counts, a float is a fraction
        limit_test_batches: test batches: an int counts, a float is a fraction
        limit_predict_batches: prediction batches: an int counts, a float is a fraction
    """

    def __init__(self, *args, limit_train_batches: int | float | None = None,
                 limit_val_batches: int | float | None = None, limit_test_batches: int | float | None = None,
                 limit_predict_batches: int | float | None = None, **kwargs) -> None:
        super().__init__(*args, limit_train_batches=limit_train_batches, limit_val_batches=limit_val_batches,
                         limit_test_batches=limit_test_batches, limit_predict_batches=limit_predict_batches, **kwargs)


def parser_for(description: str) -> ArgumentParser:
    """A jsonargparse parser with ``--config FILE``; errors raise instead of printing usage."""
    parser = ArgumentParser(description=description, exit_on_error=False, formatter_class=HelpFormatter)
    parser.add_argument("--config", action="config", help="a YAML file of these settings")
    return parser


# The data settings evaluate and sample share with training, read from ImageDataModule's
# signature (names, types, defaults and help in one place); the rest are training's own, or
# the model's (for evaluate and sample, the checkpoint's model decides them).
TRAINING_ONLY_DATA = {"batch_size", "eval_batch_size", "num_workers", "random_flip", "download", "val_size"}


def add_data_arguments(parser: ArgumentParser) -> None:
    """The ``--data.*`` options that evaluate and sample share with training (``--val_size``
    is their own: the same meaning as ``--data.val_size`` in training)."""
    parser.add_class_arguments(ImageDataModule, "data", skip=TRAINING_ONLY_DATA | set(ImageDataModule.FROM_MODEL))
    parser.add_argument("--val_size", type=int | None, default=None,
                        help="images held out of training for val, as in training (default: the source's)")


def data_reader(args: Namespace, image_size: int) -> Reader:
    """The data that ``add_data_arguments`` names, for a model of ``image_size`` (a folder is
    converted to that size; whether other data fits is ``sources.check_fits``'s to say)."""
    data = args.data
    return Reader(data.source, data.root, args.val_size, image_size, crop=data.crop, resize=data.resize,
                  cache=data.cache, rebuild=data.rebuild)


def parse(parser: ArgumentParser, args: list[str] | None, command: str) -> Namespace:
    try:
        return parser.parse_args(args)
    except ArgumentError as error:
        raise ConfigError(describe_parse_error(error, parser, args, command)) from error


def describe_parse_error(error: ArgumentError, parser: ArgumentParser, args: list[str] | None, command: str,
                         more_keys: Iterable[str] = (), linked: dict[str, str] | None = None) -> str:
    """One line: a key set from another, an unknown key with the closest valid one, or
    jsonargparse's complaint.

    ``more_keys``: valid keys the parser's defaults do not list (the fields of a nested
    dataclass whose default is None); ``linked``: {key: the key it is set from}."""
    args = sys.argv[1:] if args is None else list(args)
    linked = linked or {}
    known = set(parser.get_defaults().keys()) | set(more_keys)
    given = given_keys(args, known | set(linked))
    problem = next((f"{key} is set from {linked[key]}: set that instead" for key in given if key in linked), None)
    problem = problem or unknown_key(given, known) or condensed(str(error))
    return f"{problem} (fix the YAML file or the --flag; python -m imagetx.{command} --help lists them)"


def given_keys(args: list[str], known: set[str]) -> list[str]:
    """The dotted keys in ``args``: its ``--flags`` and the keys of its ``--config`` files."""
    keys, files = [], []
    for i, arg in enumerate(args):
        if arg == "-c" or (arg.startswith("--") and arg not in ("--help", "--print_config")):
            key, _, value = arg.lstrip("-").partition("=")
            if key in ("config", "c"):
                files.append(value or (args[i + 1] if i + 1 < len(args) else ""))
            else:
                keys.append(key.rstrip("+"))  # --key+ VALUE appends to a list
    for file in files:
        try:
            with open(file) as handle:
                keys += flat_keys(yaml.safe_load(handle), "", groups_of(known))
        except (OSError, yaml.YAMLError):
            pass  # the parser's own error says what is wrong with the file
    return keys


def flat_keys(tree: Any, prefix: str, groups: set[str]) -> list[str]:
    """Dotted keys of nested dicts, descending only into known groups (a dict given as the
    value of a setting, e.g. a class_path and its init_args, is that setting's business)."""
    if not isinstance(tree, dict) or (prefix and prefix not in groups):
        return [prefix] if prefix else []
    return [key for name, value in tree.items() for key in flat_keys(value, f"{prefix}.{name}".lstrip("."), groups)]


def groups_of(known: set[str]) -> set[str]:
    """Every prefix of a known key that has keys below it ('model', 'model.config', ...)."""
    return {".".join(key.split(".")[:i]) for key in known for i in range(1, key.count(".") + 1)}


def unknown_key(given: Iterable[str], known: set[str]) -> str | None:
    """'group: unknown key 'name' (did you mean ...?)' for the first key that is not a setting."""
    groups = groups_of(known)
    for key in given:
        parts = key.split(".")
        for i in range(len(parts)):
            prefix = ".".join(parts[: i + 1])
            if prefix in known and prefix not in groups:
                break  # a setting: its value is checked by the parser
            if prefix in known or prefix in groups:
                continue
            parent = ".".join(parts[:i])
            siblings = {k[len(parent) + 1 :].split(".")[0] if parent else k.split(".")[0]
                        for k in known if not parent or k.startswith(parent + ".")}
            close = difflib.get_close_matches(parts[i], sorted(siblings), n=1)
            return (f"{parent}: " if parent else "") + f"unknown key '{parts[i]}'" + \
                (f" (did you mean '{close[0]}'?)" if close else "")
    return None


NOISE = ("Does not validate against", "Subtypes:", "Errors:", "Given value", "Expected a <class 'NoneType'>",
         "Problem with given class_path")


def condensed(message: str) -> str:
    """jsonargparse's multi-line complaint as 'key.path: problem'.

    jsonargparse gives its errors as text only, nesting one 'Parser key "..."' line per
    level (and, for an optional dataclass, a line per union member); the key path and the
    last line that states the problem are read from that text."""
    path = ".".join(re.findall(r'Parser key "([^"]+)"', message))
    lines = [re.sub(r'^-?\s*Parser key "[^"]+":\s*', "", line.strip()).lstrip("- ") for line in message.splitlines()]
    given = [line for line in lines if line.startswith("Given value:")]
    lines = [line for line in lines if line and not line.startswith(NOISE)]
    problem = re.sub(r"Expected a <class '([\w.]+)'>", r"expected \1", lines[-1] if lines else message.strip())
    if given and "Got value" not in problem:
        problem += f". {given[0].replace('Given value', 'Got value')}"
    problem = problem.replace(". Got value:", ", got")
    return f"{path}: {problem}" if path else problem
