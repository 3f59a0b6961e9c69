"""A model file whose configuration asks for more parameters than the machine has memory for is
refused in one line before any of it is built (imagetx/io/size.py, issue 124 item 8): a 364-byte
``config.json`` or a 1.7 KB checkpoint asking for 10¹² parameters ran ``sample`` and ``evaluate``
out of memory (a 38-line RuntimeError, or the process killed with no message); so did a training
configuration."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from helpers import one_error_line, tiny_config, tiny_model, weights_checkpoint, write_train_config
from imagetx.evaluate import main as evaluate_main
from imagetx.io import weights
from imagetx.io.errors import CheckpointError
from imagetx.io.size import FLOAT32_BYTES, check_fits_memory, least_parameters, machine_memory
from imagetx.io.weights import read_config, write_weights
from imagetx.model.superres import build_model
from imagetx.sample import main as sample_main
from imagetx.train import main as train_main
from imagetx.training.presets import preset_model_config

REPO = Path(__file__).resolve().parents[2]
# Far beyond any machine's memory (10¹⁶ parameters: 40 PB in float32), in a few bytes of JSON.
HUGE = {"n_layers": 1000, "d_model": 2 ** 20, "d_filter": 2 ** 22}
# Within any test machine's memory (2·10⁸ parameters: 0.8 GiB).
LARGE = {"n_layers": 4, "d_model": 2048, "d_filter": 8192}


def shipped_and_preset_configs():
    """The model configuration of every shipped model and training preset, each once."""
    configs = [read_config(path) for path in sorted(REPO.glob("pretrained/*/config.json"))]
    configs += [preset_model_config(path) for path in sorted(REPO.glob("configs/*.yaml"))]
    return list({json.dumps(config.to_dict(), sort_keys=True): config for config in configs}.values())


def test_least_parameters_never_exceeds_a_models_own_count():
    """The bound refuses no model that fits: at most the count of every shipped model and preset, and
    near it (within 30 %: the layers are nearly all of a real model), and of tiny variants (a
    super-resolution model, classes, a head size of its own), whose embeddings and heads weigh more."""
    def count(config):
        return sum(parameter.numel() for parameter in build_model(config).parameters())

    for config in shipped_and_preset_configs():
        assert 0.7 * count(config) <= least_parameters(config) <= count(config), config
    for config in (tiny_config(), tiny_config(encoder_layers=2, n_layers=2), tiny_config(num_classes=10, head="dmol"),
                   own_head_size(tiny_config(), 4)):
        assert 0 < least_parameters(config) <= count(config), config


def own_head_size(config, size):
    return dataclasses.replace(config, attention=dataclasses.replace(config.attention, head_size=size))


def model_folder(tmp_path, asks):
    """A tiny model's weights folder whose config.json ``asks`` for another model."""
    folder = write_weights(tmp_path / "model", tiny_model().state_dict(), tiny_config())
    values = json.loads((folder / "config.json").read_text())
    values.update(asks)
    (folder / "config.json").write_text(json.dumps(values))
    return folder


def model_checkpoint(tmp_path, asks):
    """A tiny model's checkpoint whose configuration ``asks`` for another model."""
    path = tmp_path / "model.ckpt"
    checkpoint = weights_checkpoint(tiny_model())
    checkpoint["imagetx"]["model_config"].update(asks)
    torch.save(checkpoint, path)
    return path


@pytest.mark.parametrize("make", [model_folder, model_checkpoint], ids=["config.json", "checkpoint"])
def test_a_model_file_too_large_for_this_machine_is_refused_before_it_is_built(tmp_path, capsys, data_root,
                                                                                monkeypatch, make):
    def build_model(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(weights, "build_model", build_model)
    model = make(tmp_path, HUGE)
    named = model / "config.json" if model.is_dir() else model
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    for command, args in ((sample_main, ["--ckpt", str(model), "--out", str(tmp_path / "out.png")]),
                          (evaluate_main, ["--ckpt", str(model), "--data.root", str(data_root)])):
        line = one_error_line(capsys, command, args)
        assert line.startswith(f"error: {named}: the model configuration asks for at least "
                               f"{least_parameters(tiny_config(**HUGE)):,} parameters") and "GiB of memory" in line, line
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_a_configuration_larger_than_this_machines_memory_is_refused():
    assert least_parameters(tiny_config(**HUGE)) * FLOAT32_BYTES > machine_memory()
    with pytest.raises(CheckpointError, match=r"^weights: the model configuration asks for at least .* parameters "
                                              r"\(.* GiB in float32\), more than this machine's .* GiB of memory"):
        check_fits_memory(tiny_config(**HUGE), "weights")
    check_fits_memory(tiny_config(**LARGE), "weights")  # 200 M parameters: 0.8 GiB


@pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")
def test_a_training_configuration_too_large_for_this_machine_is_refused_before_it_is_built(tmp_path, data_root,
                                                                                          capsys):
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, model=HUGE)
    line = one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled"])
    assert line.startswith("error: model.config: the model configuration asks for at least "), line
    assert not run_dir.exists()
