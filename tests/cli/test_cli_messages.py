"""What the commands say: usage lines naming the command as it is run, help for every option,
a short train --help without Lightning's optimiser options that change nothing, and messages that
name the option the user gave (issue 50, item 8)."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_error_line, tiny_model
from imagetx import save_pretrained
from imagetx.data.images import MAX_FILE_BYTES, megabytes

REPO = Path(__file__).resolve().parents[2]
PARSERS = ["imagetx.sample", "imagetx.evaluate", "imagetx.export", "imagetx.demo.__main__"]


@pytest.mark.slow
def test_usage_names_the_command_and_train_help_leads_with_its_own_options():
    commands = {name: subprocess.Popen([sys.executable, "-m", f"imagetx.{name}", "--help"], cwd=REPO, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for name in ("train", "sample", "demo")}
    outputs = {name: process.communicate(timeout=600) for name, process in commands.items()}
    helps = {name: out for name, (out, _) in outputs.items()}  # (warnings of other packages go to stderr)
    for name, text in helps.items():
        assert text.startswith(f"usage: python -m imagetx.{name} "), (text[:200], outputs[name][1][-2000:])
    train = helps["train"]
    assert "--optimizer" not in train.replace("--model.optimizer", "") and "--lr_scheduler" not in train
    # no help for Lightning's optimizer and scheduler classes, which would add hundreds of lines; a one-line usage
    assert len(train.splitlines()) < 600 and train.splitlines()[0].count("[") == 4


@pytest.mark.parametrize("module", PARSERS)
def test_every_option_says_what_it_does(module):
    parser = importlib.import_module(module).build_parser()
    silent = [action.option_strings for action in parser._actions if not action.help]
    assert not silent, silent


def test_a_bad_sample_count_names_only_the_option_given(tmp_path, capsys):
    from imagetx.sample import main

    save_pretrained(tiny_model(), tmp_path / "m")
    line = one_error_line(capsys, main, ["--ckpt", str(tmp_path / "m"), "--samples", "0", "--task", "complete"])
    assert "--samples 0 is invalid" in line and "--count" not in line, line


@pytest.mark.parametrize("module,args,needle", [
    ("imagetx.decompress", ["x.itx"], "--ckpt and --out are required"),
    ("imagetx.decompress", [], "FILE, --ckpt and --out are required"),
    ("imagetx.compress", ["a.png", "--out", "a.itx"], "--ckpt is required"),
])
def test_a_missing_option_is_named_as_typed_and_no_yaml_is_blamed_where_none_was_given(capsys, module, args,
                                                                                        needle):
    line = one_error_line(capsys, importlib.import_module(module).main, args)
    assert needle in line and "YAML" not in line, line


def test_a_bad_key_in_a_yaml_file_names_the_file_as_the_place_to_fix(tmp_path, capsys):
    from imagetx.sample import main

    (tmp_path / "settings.yaml").write_text("cktp: x\n")
    line = one_error_line(capsys, main, ["--config", str(tmp_path / "settings.yaml")])
    assert "unknown key 'cktp'" in line and "fix the YAML file" in line, line


def test_a_taken_port_is_refused_naming_the_port_option(capsys):
    from imagetx.demo.__main__ import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_error_line(capsys, main, ["--port", str(port)])
    assert f"--port {port}" in line and "free port" in line and "GRADIO_SERVER_PORT" not in line, line


def test_the_upload_limit_is_stated_as_gradio_states_it():
    """Gradio's page refuses an upload over the limit itself, counting 2^20 bytes to its "Mb": the
    limit is a whole number of those, and imagetx's messages count the same way."""
    assert MAX_FILE_BYTES % 2**20 == 0 and megabytes(MAX_FILE_BYTES) == f"{MAX_FILE_BYTES // 2**20}.0 MB"


def test_the_default_sample_folder_is_ignored_by_git():
    assert subprocess.run(["git", "check-ignore", "-q", "samples/complete.png"], cwd=REPO).returncode == 0


@pytest.mark.parametrize("module,args,needle", [
    ("imagetx.sample", ["--ckpt", "m", "--task", "compelte"],
     "task: 'compelte' is not one of generate, complete, superres (did you mean 'complete'?)"),
    ("imagetx.evaluate", ["--ckpt", "m", "--split", "tset"], "split: 'tset' is not one of train, val, test "
                                                             "(did you mean 'test'?)"),
    ("imagetx.train", ["--data.source", "foldr"],
     "data.source: 'foldr' is not one of cifar10, imagenet, folder, litdata (did you mean 'folder'?)"),
    ("imagetx.sample", ["--ckpt", "m", "--task", "xyz"], "task: 'xyz' is not one of generate, complete, superres ("),
], ids=["sample-task", "evaluate-split", "train-data-source", "nothing-close"])
def test_a_mistyped_choice_is_named_with_the_choices_and_the_closest(capsys, module, args, needle):
    line = one_error_line(capsys, importlib.import_module(module).main, args)
    assert needle in line, line
    assert "typing.Literal" not in line and ("did you mean" in line) == (not args[-1] == "xyz"), line


@pytest.mark.parametrize("module,entry,args", [
    ("imagetx.export", "main", ["--ckpt", "nowhere.ckpt", "--out", "w"]),
    ("imagetx.export", "main", ["--bogus", "1"]),
    ("imagetx.compress", "command", ["a.png", "--ckpt", "pretrained/completion", "--out", "a.itx"]),
    ("imagetx.compress", "command", ["--ckpt", "nowhere", "--out", "a.itx"]),
    ("imagetx.decompress", "command", ["a.itx", "--ckpt", "pretrained/completion", "--out", "a"]),
    ("imagetx.decompress", "command", ["a.itx"]),
], ids=["export-path", "export-key", "compress-input", "compress-missing", "decompress-file", "decompress-missing"])
def test_a_bad_argument_or_path_is_refused_before_torch_is_imported(tmp_path, module, entry, args):
    """torch's import is most of a command's cold start (python -X importtime): a mistyped path or
    option is refused without it, in a moment. (sample and evaluate read their --data.* options from
    imagetx/data/options.py, whose module imports torch.)"""
    code = (f"import sys; sys.argv = ['{module}', *{args!r}]\n"
            f"from {module} import {entry}\n"
            f"try:\n    {entry}()\nexcept SystemExit as stop:\n    print(stop.code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr[-2000:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
