"""What the commands (train, evaluate, sample, export) share: parsing with jsonargparse, the
check of ``--device``, and one way to fail on bad input (train parses through LightningCLI).

Bad input (a ``UserError``: a setting, a file, a checkpoint, a request the model cannot serve)
ends the command with one line ``error: <the problem and the fix>`` on stderr and exit code 2;
``IMAGETX_DEBUG=1`` raises instead, with the whole traceback. Any other error is a bug in imagetx
and shows its traceback. A command stopped by Ctrl-C ends with one line ``stopped: ...`` and exit
code 130; a training run stopped by another signal (SIGTERM, SIGUSR1: training/interrupt.py) with
exit code 128 + that signal's number, as shells report it.
"""

from __future__ import annotations

import os
import signal
import sys
from argparse import ArgumentError, RawDescriptionHelpFormatter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace
from jsonargparse.typing import register_type

from ..errors import UserError, shown
from .config_guard import guard_configs
from .errors import describe_parse_error

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class ConfigError(UserError):
    """A setting the parser rejected (unknown key, wrong type, missing file)."""


# What a command shows as one line: UserError (a setting, a file, a request the model cannot serve:
# ConfigError, CheckpointError, CodecError, PictureError and the data sources' DataError derive from
# it); FloatingPointError, a run stopped by non-finite steps (NonFiniteLossError, nonfinite.py) or a
# model whose outputs are not finite asked to sample (sampler.py); OSError, a file missing, unreadable
# or not writable. Anything else (a plain ValueError among them) is a bug in imagetx: its traceback.
# errors.py imports nothing, so that a command refuses a bad argument before torch and the data
# sources are imported (``python -X importtime``: they are most of a cold start).
BAD_INPUT = (UserError, FloatingPointError, OSError)


# The exit code of a command stopped by a signal, as shells report one: 128 + the signal's number
# (Ctrl-C: 130; SIGTERM: 143).
SIGNAL_EXIT_BASE = 128
INTERRUPTED_EXIT = SIGNAL_EXIT_BASE + signal.SIGINT


class Stopped(KeyboardInterrupt):
    """A command stopped by the signal ``signum``, its words what was kept and how to go on."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum


def run_or_exit(command: Callable[[], T]) -> T:
    """``command()``, turning bad input (``BAD_INPUT``) into one ``error:`` line and exit code 2, and
    Ctrl-C into one ``stopped:`` line (the interrupt's own words, where a command gave it some: what was kept
    and how to go on) and exit code ``INTERRUPTED_EXIT`` (a ``Stopped`` by another signal: 128 + its number)."""
    try:
        return command()
    except BAD_INPUT as error:
        if os.environ.get("IMAGETX_DEBUG"):
            raise
        # one line, whatever a file's name in it holds (a terminal escape, a bidi override: shown)
        print("error: " + shown(" ".join(str(error).split())), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:
        if os.environ.get("IMAGETX_DEBUG"):
            raise
        print("stopped: " + (" ".join(str(interrupt).split()) or "interrupted (Ctrl-C)"), file=sys.stderr)
        sys.exit(SIGNAL_EXIT_BASE + getattr(interrupt, "signum", signal.SIGINT))


def check_device(device: str | torch.device) -> None:
    """A device this machine has, or a UserError saying which to use instead."""
    import torch  # here, not above: a bad argument is refused before torch is imported (BAD_INPUT)

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise UserError(f"--device {device!r} is not a device name ({error}); use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                        f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")


def check_not_taken(out: Path, files: list[Path], force: bool) -> None:
    """Refuse to write over ``files`` (in the folder ``--out`` names) unless ``force``: they may be
    the user's, or results of an earlier run worth keeping. Checked before any work."""
    taken = [str(path) for path in files if path.exists()]
    if taken and not force:
        raise UserError(f"--out {out} already holds {' and '.join(taken)}: add --force to replace "
                        f"{'them' if len(taken) > 1 else 'it'}, or choose another --out")


def check_given_rows(rows: int, image_size: int) -> None:
    """``--rows`` for completion (sample and evaluate alike): 0..image_size - 1, since all rows given
    would leave nothing to complete or score; a UserError saying so otherwise."""
    if not 0 <= rows < image_size:
        raise UserError(f"--rows {rows} is invalid: give 0..{image_size - 1} rows "
                        f"(all {image_size} rows given would leave nothing to complete)")


class Number(float):
    """A float option that also reads 'nan' and 'inf' (jsonargparse's float does not), so
    that the command can refuse them with its own message."""


register_type(Number, serializer=float, deserializer=Number)


class HelpFormatter(DefaultHelpFormatter, RawDescriptionHelpFormatter):
    """jsonargparse's ``--help``, with the command's docstring laid out as written."""


PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds imagetx/


def program() -> str:
    """The command as the user ran it, for usage lines: ``python -m imagetx.sample`` (argparse would
    say ``sample.py``, or ``__main__.py`` for the demo) or the console script (``imagetx-sample``)."""
    path = Path(sys.argv[0])
    if path.suffix != ".py":
        return path.name
    try:
        module = path.resolve().relative_to(PACKAGE_ROOT).with_suffix("")
    except ValueError:
        return path.name
    return "python -m " + ".".join(module.parts).removesuffix(".__main__")


def parser_for(description: str) -> ArgumentParser:
    """A jsonargparse parser with ``--config FILE``; errors raise instead of printing usage. What its
    configs may import and expand is kept to what a command needs (config_guard.py)."""
    guard_configs()
    parser = ArgumentParser(prog=program(), description=description, exit_on_error=False,
                            formatter_class=HelpFormatter)
    parser.add_argument("--config", action="config", help="a YAML file of these settings")
    return parser


def parse(parser: ArgumentParser, args: list[str] | None, command: str) -> Namespace:
    """The parsed ``args`` (default: the command line), or a ConfigError of one line."""
    try:
        return parser.parse_args(args)
    except ArgumentError as error:
        raise ConfigError(describe_parse_error(error, parser, args, command)) from error


