"""No code runs when a checkpoint is opened: every command and API reads checkpoints with torch's
weights-only unpickler (checkpoint.load_weights_only), and a file whose pickle would call anything
is refused with one line naming the file and what it would call.

The crafted checkpoints below would create a file if unpickled the ordinary way (the first test
shows that they do); every other test checks the file system, so it fails if the payload ran.
"""

from __future__ import annotations

import pytest
import torch

from helpers import TINY_TRAIN_MODEL, one_error_line, random_images, write_train_config
from imagetx import CheckpointError, build_model, ModelConfig, load_model
from imagetx.io.checkpoint import imagetx_metadata
from imagetx.evaluate import main as evaluate_main
from imagetx.export import main as export_main
from imagetx.training.module import ImageTransformerModule
from imagetx.sample import main as sample_main
from imagetx.train import main as train_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


class CreatesAFile:
    """Unpickled by an ordinary unpickler, this calls open(path, "w"): the file appears."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def trapped_checkpoint(path, creates):
    """A file laid out as a training checkpoint of the tiny train model (weights, optimiser and loop
    state, imagetx's metadata), with one callback state that creates ``creates`` when unpickled."""
    model = build_model(ModelConfig(**TINY_TRAIN_MODEL))
    torch.save({"epoch": 0, "global_step": 2, "imagetx": imagetx_metadata(model.config),
                "state_dict": {f"model.{name}": value for name, value in model.state_dict().items()},
                "optimizer_states": [{"state": {}, "param_groups": []}], "loops": {"fit_loop": {}},
                "hyper_parameters": {"config": model.config.to_dict()},
                "callbacks": {"LastCheckpoint": {"payload": CreatesAFile(creates)}}}, path)
    return path


def test_the_crafted_checkpoint_runs_its_payload_when_opened_the_ordinary_way(tmp_path):
    created = tmp_path / "created-by-the-payload"
    trapped = trapped_checkpoint(tmp_path / "trapped.ckpt", created)
    torch.load(trapped, weights_only=False)
    assert created.exists()  # so the absence of the file in the tests below means the payload never ran


def refuse(command, capsys, tmp_path, data_root, trapped):
    """What ``command`` says about ``trapped``: its one error line or CheckpointError."""
    if command == "load_model":
        with pytest.raises(CheckpointError) as info:
            load_model(trapped)
        return str(info.value)
    if command == "load_from_checkpoint":
        with pytest.raises(CheckpointError) as info:
            ImageTransformerModule.load_from_checkpoint(trapped)
        return str(info.value)
    if command == "evaluate":
        return one_error_line(capsys, evaluate_main, ["--ckpt", str(trapped), "--data.root", str(data_root),
                                                      "--split", "val", "--val_size", "2", "--device", "cpu"])
    if command == "sample":
        return one_error_line(capsys, sample_main, ["--ckpt", str(trapped), "--out", str(tmp_path / "samples"),
                                                    "--device", "cpu"])
    if command == "export":
        return one_error_line(capsys, export_main, ["--ckpt", str(trapped), "--out", str(tmp_path / "weights")])
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, 2)
    return one_error_line(capsys, train_main, ["--config", str(config), "--wandb", "disabled",
                                               "--resume", str(trapped)])


@pytest.mark.parametrize("command", ["evaluate", "sample", "train --resume", "export", "load_model",
                                     "load_from_checkpoint"])
def test_a_checkpoint_that_would_run_code_is_refused_before_anything_in_it_runs(tmp_path, capsys, data_root,
                                                                                 monkeypatch, command):
    # torch's switch back to the old default must not matter: imagetx asks for weights-only itself
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    created = tmp_path / "created-by-the-payload"
    trapped = trapped_checkpoint(tmp_path / "trapped.ckpt", created)
    message = refuse(command, capsys, tmp_path, data_root, trapped)
    assert str(trapped) in message and "is refused" in message and "would call io.open" in message, message
    assert not created.exists()
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "weights").exists()


@pytest.mark.parametrize("kind", ["plain pickle", "torch.save protocol 4"])
def test_a_refused_pickle_prints_only_the_one_line(tmp_path, capsys, kind):
    """torch's weights-only unpickler warns about a pickle protocol it was not written for before it
    refuses the file ("UserWarning: Detected pickle protocol 4 ..."): the refusal alone is shown."""
    import pickle
    import warnings

    created, path = tmp_path / "created-by-the-payload", tmp_path / "model.ckpt"
    payload = {"state_dict": {}, "payload": CreatesAFile(created)}
    if kind == "plain pickle":
        path.write_bytes(pickle.dumps(payload, protocol=4))
    else:
        torch.save(payload, path, pickle_protocol=4)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as info:
        warnings.simplefilter("always")  # (pytest records warnings instead of printing them: so do we)
        evaluate_main(["--ckpt", str(path), "--device", "cpu"])
    assert info.value.code == 2 and not [str(warning.message) for warning in caught]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint {path} "), lines
    assert not created.exists()


def test_a_checkpoint_that_loads_keeps_torchs_warnings(tmp_path, monkeypatch):
    """Only a refusal drops them: a file that is read gives the warnings torch gave."""
    import warnings

    from imagetx.io.checkpoint import load_weights_only

    path = tmp_path / "tensors.ckpt"
    torch.save({"weights": torch.zeros(2)}, path)
    load = torch.load

    def warning_load(*args, **kwargs):
        warnings.warn("a warning of torch's", FutureWarning)
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", warning_load)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(load_weights_only(path)["weights"], torch.zeros(2))
    assert [str(warning.message) for warning in caught] == ["a warning of torch's"], caught


def test_every_checkpoint_read_is_weights_only(tmp_path, capsys, data_root, monkeypatch):
    """Lightning's own reads too (fit's ckpt_path, load_from_checkpoint): each torch.load asks for
    the weights-only unpickler, whatever torch's default."""
    run_dir = tmp_path / "run"
    train_main(["--config", str(write_train_config(tmp_path / "c2.yaml", run_dir, data_root, 2)),
                "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    asked, original = [], torch.load

    def spy(*args, **kwargs):
        asked.append(kwargs.get("weights_only"))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    train_main(["--config", str(write_train_config(tmp_path / "c3.yaml", run_dir, data_root, 3)),
                "--wandb", "disabled", "--resume", "last"])
    evaluate_main(["--ckpt", str(last), "--data.root", str(data_root), "--split", "val", "--val_size", "2",
                   "--device", "cpu"])
    sample_main(["--ckpt", str(last), "--count", "1", "--out", str(tmp_path / "samples"), "--device", "cpu"])
    module = ImageTransformerModule.load_from_checkpoint(last, map_location="cpu").eval()
    # the resume check, Lightning's fit, evaluate, sample, load_from_checkpoint
    assert len(asked) >= 5 and asked == [True] * len(asked), asked
    opened = len(asked)
    with pytest.raises(ValueError, match="weights-only"):
        ImageTransformerModule.load_from_checkpoint(last, weights_only=False)
    assert len(asked) == opened  # refused before the file was opened
    with torch.no_grad():
        assert torch.equal(module.model.bits_per_dim(random_images(2, 32)), load_model(last).bits_per_dim(
            random_images(2, 32)))


def test_a_training_checkpoint_needs_nothing_beyond_torchs_weights_only_set(tmp_path, data_root):
    """What a checkpoint of imagetx.train holds: tensors in OrderedDicts, plain dicts, lists, numbers
    and strings; the budget-aware cosine (adamw_cosine with max_time) adds the most state."""
    run_dir = tmp_path / "run"
    # validation at step 4, after three timed steps: the budget horizon is fixed there (budget.py)
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, 5, max_time="00:00:10:00",
                                val_check_interval=4, top={"checkpoint_every_n_steps": 1})
    train_main(["--config", str(config), "--wandb", "disabled", "--model.optimizer", "adamw_cosine"])
    checkpoints = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    assert [path.name for path in checkpoints] == ["best-4.ckpt", "last.ckpt"]
    for checkpoint in checkpoints:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(checkpoint) == [], checkpoint
    state = torch.load(checkpoints[-1], map_location="cpu", weights_only=True)
    # the horizon fixed at the first validation, the Timer's and ModelCheckpoint's states, Adam's moments
    assert state["imagetx"]["lr_horizon"] is not None and state["optimizer_states"][0]["state"], state["imagetx"]
    assert any(key.startswith("Timer") for key in state["callbacks"]), sorted(state["callbacks"])


def test_a_raw_pickle_that_is_no_torch_checkpoint_is_refused_as_unreadable(tmp_path):
    import pickle

    created = tmp_path / "created-by-the-payload"
    path = tmp_path / "raw.ckpt"
    path.write_bytes(pickle.dumps({"state_dict": CreatesAFile(created)}, protocol=2))
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_model(path)
    assert not created.exists()
