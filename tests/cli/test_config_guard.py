"""A config names only what a run needs (imagetx/cli/config_guard.py, issue 124): a class or function
outside imagetx, lightning and torch (a callback's hook ``os.system``, a ``class_path`` of any module)
is refused in one line before its module is imported, unless IMAGETX_CONFIG_IMPORTS lists it; YAML
whose aliases would expand past the bound ("billion laughs"), refer to themselves or nest too deep is
refused in one line before it is expanded, where it ran to a MemoryError."""

from __future__ import annotations

import sys

import pytest
import yaml

from helpers import one_error_line, tiny_model, write_train_config
from imagetx import save_pretrained
from imagetx.cli.config_guard import MORE_IMPORTS
from imagetx.training.bounded_yaml import MAX_DEPTH, MAX_VALUES
from imagetx.evaluate import main as evaluate_main
from imagetx.train import main as train_main, make_cli

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

PLANTED = "planted_callbacks"  # a module of the test's own, which says when it is imported
PLANTED_SOURCE = """
from pathlib import Path

from lightning.pytorch.callbacks import Callback

Path(__file__).with_name("imported").touch()


class Noted(Callback):
    pass


def hook(trainer, pl_module):
    Path(__file__).with_name("called").touch()
"""


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The folder of ``planted_callbacks``, importable; it writes 'imported' there when imported."""
    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / f"{PLANTED}.py").write_text(PLANTED_SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv(MORE_IMPORTS, raising=False)
    yield folder
    sys.modules.pop(PLANTED, None)


def config_with(tmp_path, data_root, callbacks: list) -> list[str]:
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2, callbacks=callbacks)
    return ["--config", str(config), "--wandb", "disabled"]


def lambda_callback(hook: str) -> dict:
    return {"class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": hook}}


@pytest.mark.parametrize("named,refused", [
    (f"{PLANTED}.Noted", f"{PLANTED}.Noted"),
    (f"{PLANTED}.hook", f"{PLANTED}.hook"),
    ("os.system", "os.system"),
    ("torch.hub.load", "torch.hub.load"),  # torch, but a way to fetch and run code
    ("imagetx.train.shlex.split", "shlex.split"),  # reached through an admitted module: judged where defined
])
def test_a_config_naming_what_a_run_does_not_need_is_refused_before_importing_it(tmp_path, capsys, data_root,
                                                                                 planted, named, refused):
    callback = {"class_path": named} if named.endswith("Noted") else lambda_callback(named)
    line = one_error_line(capsys, train_main, config_with(tmp_path, data_root, [callback]))
    assert "trainer.callbacks" in line and f"{refused} is refused" in line and MORE_IMPORTS in line, line
    assert PLANTED not in sys.modules and not (planted / "imported").exists()
    assert not (tmp_path / "run").exists()


def test_a_module_listed_in_the_environment_is_admitted(tmp_path, data_root, planted, monkeypatch):
    monkeypatch.setenv(MORE_IMPORTS, f" {PLANTED} ,")
    cli = make_cli(config_with(tmp_path, data_root, [{"class_path": f"{PLANTED}.Noted"}, lambda_callback(
        f"{PLANTED}.hook")]))
    assert (planted / "imported").exists()
    assert {type(callback).__name__ for callback in cli.trainer.callbacks} >= {"Noted", "LambdaCallback"}


def test_a_malformed_listing_in_the_environment_is_one_line(tmp_path, capsys, data_root, monkeypatch):
    monkeypatch.setenv(MORE_IMPORTS, "my-module")
    line = one_error_line(capsys, train_main, config_with(tmp_path, data_root, []))
    assert f"{MORE_IMPORTS}=my-module" in line, line


def laughs(levels: int, width: int = 10) -> str:
    """YAML of ``width ** levels`` strings in a few hundred bytes: each level ``width`` aliases of the last."""
    lines = ["trainer:", "  plugins:", "    - &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"    - &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def deep(levels: int) -> str:
    return "trainer:\n  plugins: " + "[" * levels + "]" * levels + "\n"


BAD_YAML = {
    "billion laughs": (laughs(9), f"expand to more than {MAX_VALUES:,} values"),
    "itself": ("trainer:\n  plugins: &loop [1, *loop]\n", "refers to a value that holds it"),
    "deep": (deep(MAX_DEPTH + 5), f"nests deeper than {MAX_DEPTH} levels"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_yaml_that_would_expand_without_bound_is_refused_in_one_line(tmp_path, capsys, case):
    text, needle = BAD_YAML[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = one_error_line(capsys, train_main, ["--config", str(bad), "--wandb", "disabled",
                                               "--trainer.default_root_dir", str(tmp_path / "run")])
    assert f"--config {bad}" in line and needle in line, line
    assert not (tmp_path / "run").exists()
    model = tmp_path / "model"
    save_pretrained(tiny_model(head="dmol"), model)
    line = one_error_line(capsys, evaluate_main, ["--ckpt", str(model), "--config", str(bad)])
    assert f"--config {bad}" in line and needle in line, line


def test_a_config_with_a_few_aliases_is_read_as_before(tmp_path, data_root):
    config = yaml.safe_load(write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2).read_text())
    text = yaml.safe_dump(config).replace("batch_size: 2", "batch_size: &batch 2", 1)
    text = text.replace("eval_batch_size: 2", "eval_batch_size: *batch")
    assert "*batch" in text and yaml.safe_load(text) == config
    (tmp_path / "aliased.yaml").write_text(text)
    cli = make_cli(["--config", str(tmp_path / "aliased.yaml"), "--wandb", "disabled"])
    assert cli.datamodule.batch_size == 2 and cli.datamodule.eval_batch_size == 2
