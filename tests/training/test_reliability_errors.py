"""Bad input through the three commands: one line ``error: ...`` naming the problem and the
fix, exit code 2, no traceback (IMAGETX_DEBUG=1 gives one).

Complements test_data.py (the readers), test_api.py (load_model), test_sample_cli.py and
test_evaluate.py (their own cases): here the same failures come through the CLIs,
the training CLI above all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import (TINY_TRAIN_MODEL, one_error_line, tiny_model, weights_checkpoint, write_npz_shard,
                     write_train_config)
from imagetx import save_pretrained
from imagetx.io.checkpoint import imagetx_metadata
from imagetx.evaluate import main as evaluate_main
from imagetx.sample import main as sample_main
from imagetx.train import main as train_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def train_error(tmp_path, capsys, data_root, *extra, **settings) -> str:
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2, **settings)
    return one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled", *extra])


# ----- training data ----------------------------------------------------------------------

def bad_shard(root, case):
    images, labels = np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4, np.uint8)
    if case == "images shape":
        images = np.zeros((4, 32, 32), np.uint8)
    elif case == "images dtype":
        images = images.astype(np.float32)
    elif case == "label range":
        labels = np.full(4, 10, np.uint8)
    write_npz_shard(root / "train-0.npz", images, labels)
    if case == "truncated":
        path = root / "train-0.npz"
        path.write_bytes(path.read_bytes()[:3000])


@pytest.mark.parametrize("case,needle", [
    ("images shape", "expected uint8 (N, 32, 32, 3)"),
    ("images dtype", "'images' is float32"),
    ("label range", "labels span 10..10; expected 0..9"),
    ("truncated", "truncated or corrupt"),
])
def test_train_with_a_bad_shard(tmp_path, capsys, case, needle):
    root = tmp_path / "data"
    root.mkdir()
    bad_shard(root, case)
    line = train_error(tmp_path, capsys, root)
    assert "train-0.npz" in line and needle in line, line
    assert "replace" in line  # ... and what to do about it


def test_train_with_an_empty_data_directory(tmp_path, capsys):
    root = tmp_path / "empty"
    root.mkdir()
    line = train_error(tmp_path, capsys, root)
    assert str(root) in line and "train-*.npz" in line and "--data.root" in line, line


# ----- training configuration ------------------------------------------------------------

@pytest.mark.parametrize("settings,extra,needles", [
    (dict(model={"d_modle": 32}), [], ["model.config", "unknown key 'd_modle'", "did you mean 'd_model'"]),
    ({}, ["--trainer.max_stepz", "3"], ["unknown key 'max_stepz'", "did you mean 'max_steps'"]),
    (dict(top={"seed_everythin": 1}), [], ["unknown key 'seed_everythin'", "did you mean 'seed_everything'"]),
    (dict(model={"d_model": "big"}), [], ["model.config.d_model", "int", "big"]),
    ({}, ["--model.peak_lr", "fast"], ["model.peak_lr", "float", "fast"]),
    ({}, ["--model.config.attention.kind", "local_3d"], ["model.config.attention.kind", "local_3d", "local_1d"]),
    (dict(model={"attention": {"n_heads": 3}}), [], ["ModelConfig.attention.n_heads=3", "must divide d_model=16"]),
    (dict(model={"attention": {"kind": "local_2d", "query_block_shape": [5, 8], "memory_flange": [1, 1]}}), [],
     ["ModelConfig.attention.query_block_shape=(5, 8)", "must divide the grid's 32 rows"]),
    (dict(model={"attention": {"kind": "local_2d", "query_block_shape": [8, 8], "memory_flange": [-1, 1]}}), [],
     ["ModelConfig.attention.memory_flange=(-1, 1)", "must be 0 or more"]),
    ({}, ["--checkpoint_every_n_steps", "-1"], ["--checkpoint_every_n_steps -1"]),
    ({}, ["--config", "/nonexistent/x.yaml"], ["/nonexistent/x.yaml", "does not exist"]),
    ({}, ["--config", "configs/quick"], ["--config configs/quick does not exist: did you mean --config "
                                         "configs/quick.yaml?"]),  # a preset named without its suffix (issue 126)
], ids=["typo-model-key", "typo-flag", "typo-top-key", "wrong-type", "wrong-type-flag", "bad-choice",
        "heads-do-not-divide-d", "block-does-not-fit-grid", "flange-negative", "negative-interval",
        "missing-config-file", "preset-without-suffix"])
def test_train_with_a_bad_configuration(tmp_path, capsys, data_root, settings, extra, needles):
    line = train_error(tmp_path, capsys, data_root, *extra, **settings)
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "run").exists()  # not even an empty run folder (issue 74)


@pytest.mark.parametrize("max_time", ["3min", "00:03:00", "{mins: 3}"])
def test_a_max_time_lightning_cannot_read_is_one_line_and_leaves_nothing(tmp_path, capsys, data_root, max_time):
    # Lightning refused these while building the trainer: a 50-line MisconfigurationException,
    # exit 1, and an empty run folder (issue 74).
    line = train_error(tmp_path, capsys, data_root, "--trainer.max_time", max_time)
    assert line.startswith("error: --trainer.max_time ") and "is not a duration" in line, line
    assert max_time.strip("{}").split(":")[0] in line and "00:00:03:00" in line, line  # what was given, and the fix
    assert "{minutes: 3}" in line, line  # both forms Lightning takes
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, value", [("batch_size", "0"), ("eval_batch_size", "0"), ("num_workers", "-1")])
def test_a_data_setting_the_loaders_refuse_is_refused_before_the_loggers_start(tmp_path, capsys, data_root, flag,
                                                                               value):
    # --data.batch_size 0 failed in the first training step, after csv/ and wandb/ were written.
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2)
    line = one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "offline", f"--data.{flag}", value])
    assert line.startswith(f"error: --data.{flag} {value} is invalid") and "or more" in line, line
    assert not (tmp_path / "run").exists()


def test_train_with_an_unwritable_run_directory(tmp_path, capsys, data_root):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = train_error(tmp_path, capsys, data_root, default_root_dir=str(blocker / "run"))
    assert str(blocker / "run") in line and "--trainer.default_root_dir" in line, line


def test_debug_mode_shows_the_traceback(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("IMAGETX_DEBUG", "1")
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2, model={"attention": {"n_heads": 3}})
    with pytest.raises(ValueError, match="n_heads"):
        train_main(["--config", str(config), "--wandb", "disabled"])


# ----- checkpoints given to evaluate and sample ------------------------------------------

def write_checkpoint(path, model, **config_changes):
    """A checkpoint file of the model's configuration (with ``config_changes``) and weights."""
    metadata = imagetx_metadata(model.config)
    metadata["model_config"].update(config_changes)
    torch.save(weights_checkpoint(model, metadata), path)


def bad_checkpoint(tmp_path, kind):
    path = tmp_path / f"{kind}.ckpt"
    if kind == "truncated":
        write_checkpoint(path, tiny_model(image_size=32, head="dmol"))
        path.write_bytes(path.read_bytes()[:1000])
    elif kind == "not-imagetx":
        torch.save({"state_dict": {"layer.weight": torch.zeros(2, 2)}}, path)
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "incompatible":  # weights of another configuration than the one stored with them
        write_checkpoint(path, tiny_model(image_size=32, head="dmol"), d_model=32)
    elif kind == "invalid-config":
        write_checkpoint(path, tiny_model(image_size=32, head="dmol"),
                         attention={**tiny_model().config.to_dict()["attention"], "n_heads": 3})
    return path


KINDS = {"missing": "does not exist", "truncated": "truncated or corrupt", "text": "truncated or corrupt",
         "not-imagetx": "not an imagetx checkpoint", "incompatible": "do not fit",
         "invalid-config": "n_heads=3"}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("command", ["evaluate", "sample"])
def test_bad_checkpoint(tmp_path, capsys, data_root, command, kind):
    path = tmp_path / "missing.ckpt" if kind == "missing" else bad_checkpoint(tmp_path, kind)
    if command == "evaluate":
        line = one_error_line(capsys, evaluate_main, ["--ckpt", str(path), "--data.root", str(data_root),
                                                      "--split", "val", "--val_size", "2"])
    else:
        line = one_error_line(capsys, sample_main, ["--ckpt", str(path), "--out", str(tmp_path / "o")])
    assert path.name in line and KINDS[kind] in line, line


# ----- requests that do not fit the model -------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpts")
    plain, conditional = directory / "plain", directory / "conditional"
    save_pretrained(tiny_model(seed=1, image_size=32, head="dmol", query_block_length=64), plain)
    save_pretrained(tiny_model(seed=2, image_size=32, head="dmol", query_block_length=64, num_classes=10), conditional)
    return {"plain": plain, "conditional": conditional}


@pytest.mark.parametrize("model,args,needle", [
    ("plain", ["--task", "complete", "--rows", "-1"], "--rows -1 is invalid: give 0..31 rows"),
    ("plain", ["--task", "complete", "--rows", "33"], "--rows 33 is invalid: give 0..31 rows"),
    ("conditional", ["--label", "10"], "--label 10 is outside 0..9"),
    ("conditional", ["--label", "-1"], "--label -1 is outside 0..9"),
    ("plain", ["--count", "-2"], "--count -2"),
    ("plain", ["--samples", "0"], "--samples 0"),
    ("plain", ["--temperature", "nan"], "temperature nan is invalid"),
    ("plain", ["--temperature", "inf"], "temperature inf is invalid"),
    ("plain", ["--temperatures", "0.9", "-0.5"], "temperature -0.5 is invalid"),
    ("plain", ["--task", "superres"], "needs a super-resolution checkpoint"),
], ids=["rows-negative", "rows-too-many", "label-too-big", "label-negative", "count-negative", "samples-zero",
        "temperature-nan", "temperature-inf", "temperatures-negative", "superres-without-encoder"])
def test_sample_request_out_of_range(tmp_path, capsys, data_root, checkpoints, model, args, needle):
    line = one_error_line(capsys, sample_main, ["--ckpt", str(checkpoints[model]), "--out", str(tmp_path / "o"),
                                                "--data.root", str(data_root), *args])
    assert needle in line, line
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())


@pytest.mark.parametrize("args,needle", [
    (["--task", "complete", "--rows", "40"], "--rows 40 is invalid"),
    (["--batch_size", "0"], "must be positive"),
    (["--limit", "0"], "must be positive"),
])
def test_evaluate_request_out_of_range(capsys, data_root, checkpoints, args, needle):
    line = one_error_line(capsys, evaluate_main, ["--ckpt", str(checkpoints["plain"]), "--data.root", str(data_root),
                                                  "--split", "val", "--val_size", "2", *args])
    assert needle in line, line


@pytest.mark.parametrize("command", ["evaluate", "sample"])
def test_missing_data_directory(tmp_path, capsys, checkpoints, command):
    missing = tmp_path / "nowhere"
    if command == "evaluate":
        line = one_error_line(capsys, evaluate_main, ["--ckpt", str(checkpoints["plain"]), "--data.root", str(missing)])
    else:
        line = one_error_line(capsys, sample_main, ["--ckpt", str(checkpoints["plain"]), "--task", "complete",
                                                    "--data.root", str(missing), "--out", str(tmp_path / "o")])
    assert str(missing) in line and "--data.root" in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["evaluate", "sample"])
def test_cuda_device_without_a_gpu(tmp_path, capsys, checkpoints, command):
    if command == "evaluate":
        main, where = evaluate_main, ["--split", "val"]
    else:
        main, where = sample_main, ["--out", str(tmp_path / "o")]
    line = one_error_line(capsys, main, ["--ckpt", str(checkpoints["plain"]), "--device", "cuda", *where])
    assert "--device cuda" in line and "--device cpu" in line, line


def test_config_written_for_the_tiny_model_is_itself_valid():
    # the fixtures above rely on TINY_TRAIN_MODEL being valid; a failure here means the helper broke
    from imagetx.model.config import ModelConfig

    ModelConfig(**TINY_TRAIN_MODEL).validate()


CONFIG_FILES = {  # content -> what the one line must say besides the file's name
    "model:\n  config:\n    d_model: [1, 2\n  x: y\n": ["is not valid YAML", "line 4, column 4"],
    "trainer:\n\tmax_steps: 3\n": ["is not valid YAML", "line 2, column 1"],  # a tab
    "- a\n- b\n": ["holds a YAML list, not settings"],
}


@pytest.mark.parametrize("content", sorted(CONFIG_FILES))
@pytest.mark.parametrize("command", ["train", "evaluate", "sample"])
def test_a_broken_config_file_is_named_with_what_is_wrong(tmp_path, capsys, command, content):
    path = tmp_path / "corrupt.yaml"
    path.write_text(content)
    main = {"train": train_main, "evaluate": evaluate_main, "sample": sample_main}[command]
    line = one_error_line(capsys, main, ["--config", str(path)] + ([] if command == "train" else ["--ckpt", "x"]))
    assert f"--config {path}" in line and all(needle in line for needle in CONFIG_FILES[content]), line
    assert "<unicode string>" not in line
    missing = tmp_path / "missing.yaml"
    line = one_error_line(capsys, main, [f"--config={missing}"])
    assert f"--config {missing} does not exist" in line, line
