"""jsonargparse's complaints as one line: ``key.path: problem``, or the closest valid key to an
unknown one. jsonargparse states its errors as text only, so the key path and the problem are
read from that text (``condensed``, through compat.py, which knows its wording); the keys a user
gave are read from the flags and the ``--config`` files (``given_keys``)."""

from __future__ import annotations

import ast
import difflib
import sys
from argparse import ArgumentError
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentParser

from ..compat import (EXPECTED_CLASS, PARSE_ERROR_NOISE, denied_import_path, option_names, parse_error_choice,
                      parse_error_key_path, parse_error_line, parse_error_required)
from ..io.shipped import resolve
from ..training.bounded_yaml import ExpansionRefused, safe_load
from .config_guard import refusal


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
    problem = config_file_problem(args) or refused_import(error)
    problem = problem or next((f"{key} is set from {linked[key]}: set that instead" for key in given if key in linked),
                              None)
    problem = problem or unknown_key(given, known) or missing(str(error), parser) or condensed(str(error))
    fix = "fix the YAML file or the --flag; " if config_files(args) else ""  # no YAML named: none to fix
    return f"{problem} ({fix}python -m imagetx.{command} --help lists the options)"


def missing(message: str, parser: ArgumentParser) -> str | None:
    """'--ckpt and --out are required' where argparse's ``message`` says they were not given (it
    names options without their dashes, as if positional: ckpt, out), else None."""
    names = parse_error_required(message)
    if names is None:
        return None
    options = option_names(parser)
    shown = [f"--{name}" if name in options else name.upper() for name in names]
    listed = ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]
    return f"{listed} {'is' if len(shown) == 1 else 'are'} required: give {'it' if len(shown) == 1 else 'them'}"


def config_files(args: list[str]) -> list[str]:
    """The files that ``args`` give to ``--config`` (or ``-c``), in order."""
    files = []
    for i, arg in enumerate(args):
        key, equals, value = arg.partition("=")
        if key in ("--config", "-c"):
            files.append(value if equals else (args[i + 1] if i + 1 < len(args) else ""))
    return files


def config_file_problem(args: list[str]) -> str | None:
    """What is wrong with the first ``--config`` file that is not a YAML mapping of settings, naming
    the file: missing, unreadable, not YAML (where and why, as the YAML reader says) or not
    ``key: value`` lines. jsonargparse's own message names a text, "<unicode string>", not the file."""
    for file in config_files(args):
        try:
            with open(file, encoding="utf-8") as handle:
                tree = safe_load(handle.read())
        except FileNotFoundError:
            with_suffix = resolve(f"{file}.yaml")  # configs/quick for configs/quick.yaml (a preset's name)
            if Path(with_suffix).is_file():
                return f"--config {file} does not exist: did you mean --config {file}.yaml?"
            return f"--config {file} does not exist: give the path of a YAML file of settings"
        except (OSError, UnicodeDecodeError) as error:
            return f"--config {file} cannot be read as text ({error}); give a YAML file of settings"
        except ExpansionRefused as error:
            return f"--config {file}: {error}"
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            context = getattr(error, "context", None)
            why = getattr(error, "problem", None) or str(error)
            return f"--config {file} is not valid YAML: {why}{where}" + (f" ({context})" if context else "")
        if tree is not None and not isinstance(tree, dict):
            return (f"--config {file} holds a YAML {type(tree).__name__}, not settings: write 'key: value' lines, "
                    "e.g. 'trainer:' with its settings indented below")
    return None


def refused_import(error: ArgumentError) -> str | None:
    """The one line refusing what a config named to import (config_guard.py), where the import
    policy is what failed the parse, else None."""
    path = denied_import_path(error)
    return None if path is None else refusal(path, ".".join(parse_error_key_path(str(error))))


def given_keys(args: list[str], known: set[str]) -> list[str]:
    """The dotted keys in ``args``: its ``--flags`` and the keys of its ``--config`` files."""
    keys, files = [], config_files(args)
    for arg in args:
        if arg.startswith("--") and arg not in ("--help", "--print_config"):
            key = arg.lstrip("-").partition("=")[0]
            if key != "config":
                keys.append(key.rstrip("+"))  # --key+ VALUE appends to a list
    for file in files:
        try:
            with open(file) as handle:
                keys += flat_keys(safe_load(handle.read()), "", groups_of(known))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
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


def not_a_choice(message: str) -> str | None:
    """"'VALUE' is not one of A, B, C (did you mean 'B'?)" where jsonargparse's ``message`` says a
    value is none of a Literal's choices, else None."""
    found = parse_error_choice(message)
    if found is None:
        return None
    listed, given = found
    try:
        choices = [str(choice) for choice in ast.literal_eval(f"[{listed}]")]
    except (ValueError, SyntaxError):
        return None
    close = difflib.get_close_matches(given, choices, n=1)
    return f"{given!r} is not one of {', '.join(choices)}" + (f" (did you mean {close[0]!r}?)" if close else "")


def condensed(message: str) -> str:
    """jsonargparse's multi-line complaint as 'key.path: problem'.

    jsonargparse gives its errors as text only, nesting one 'Parser key "..."' line per
    level (and, for an optional dataclass, a line per union member); the key path and the
    last line that states the problem are read from that text."""
    path = ".".join(parse_error_key_path(message))
    choice = not_a_choice(message)
    if choice is not None:
        return f"{path}: {choice}" if path else choice
    lines = [parse_error_line(line) for line in message.splitlines()]
    given = [line for line in lines if line.startswith("Given value:")]
    lines = [line for line in lines if line and not line.startswith(PARSE_ERROR_NOISE)]
    problem = EXPECTED_CLASS.sub(r"expected \1", lines[-1] if lines else message.strip())
    if given and "Got value" not in problem:
        problem += f". {given[0].replace('Given value', 'Got value')}"
    problem = problem.replace(". Got value:", ", got")
    return f"{path}: {problem}" if path else problem
