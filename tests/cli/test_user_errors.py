"""A user's error and a bug look different (issue 112, item 8): a ``UserError`` (or a subclass)
ends a command with one ``error:`` line and exit code 2; any other exception, a plain ValueError
among them, is a bug in imagetx and shows its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import imagetx.evaluate
from helpers import one_error_line
from imagetx.cli.common import BAD_INPUT, ConfigError
from imagetx.codec.container import CodecError
from imagetx.data.images import PictureError
from imagetx.data.sources import DataError
from imagetx.errors import UserError
from imagetx.io.errors import CheckpointError

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--ckpt", "model.ckpt", "--device", "cpu"]


def failing(error: BaseException):
    def load_model(*args, **kwargs):
        raise error
    return load_model


def test_the_user_errors_are_user_errors_and_still_what_they_were():
    for kind in (ConfigError, CheckpointError, CodecError, PictureError, DataError):
        assert issubclass(kind, UserError) and issubclass(kind, ValueError), kind
    assert issubclass(DataError, RuntimeError)  # as it always was
    assert not issubclass(ValueError, BAD_INPUT)


def test_a_user_error_is_one_line_and_exit_code_2(monkeypatch, capsys):
    monkeypatch.setattr(imagetx.evaluate, "load_model", failing(UserError("--ckpt model.ckpt: give another")))
    assert one_error_line(capsys, imagetx.evaluate.main, ARGS) == "error: --ckpt model.ckpt: give another"


def test_an_internal_value_error_raised_inside_a_command_is_not_shown_as_bad_input(monkeypatch, capsys):
    monkeypatch.setattr(imagetx.evaluate, "load_model", failing(ValueError("an invariant of imagetx broke")))
    with pytest.raises(ValueError, match="an invariant of imagetx broke"):  # not SystemExit(2)
        imagetx.evaluate.main(ARGS)
    assert "error:" not in capsys.readouterr().err


def test_an_internal_value_error_prints_its_traceback_and_exit_code_1():
    # In a process of its own (cli/common.py imports no torch: a fraction of a second).
    code = ("from imagetx.cli.common import run_or_exit\n"
            "def command():\n    raise ValueError('an invariant of imagetx broke')\n"
            "run_or_exit(command)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" in done.stderr and "ValueError: an invariant of imagetx broke" in done.stderr, done.stderr
    assert "error:" not in done.stderr.replace("ValueError:", "")
