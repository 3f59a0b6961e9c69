"""imagetx.train (the LightningCLI entry point) and ImageTransformerModule (docs/model.md §5, §8)."""

from __future__ import annotations

import json
import math
import shlex
import sys

import pytest
import torch
import yaml

from helpers import TINY_TRAIN_MODEL, one_error_line, random_images, tiny_config, write_train_config
from imagetx import ModelConfig, load_model
from imagetx.training.module import ImageTransformerModule
from imagetx.train import main, make_cli

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

def write_config(tmp_path, root_dir, data_root, max_steps=3, **trainer):
    return write_train_config(tmp_path / f"config-{max_steps}.yaml", root_dir, data_root, max_steps, **trainer)


def test_train_writes_checkpoint_and_config(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    main(["--config", str(write_config(tmp_path, run_dir, data_root)), "--data.root", str(data_root),
          "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_file()
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3
    model = load_model(last)
    assert model.config.to_dict() == ModelConfig(**TINY_TRAIN_MODEL).to_dict()
    # the rebuilt model holds the trained weights, not a fresh initialisation
    state = {k[len("model."):]: v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name])
    with torch.no_grad():
        assert torch.isfinite(model.bits_per_dim(random_images(1, 32))).all()
    # the best checkpoint by val/bpd (validated at step 2)
    assert list((run_dir / "checkpoints").glob("best-*.ckpt"))
    configs = list((run_dir / "csv").glob("version_*/config.yaml"))
    assert len(configs) == 1
    resolved = yaml.safe_load(configs[0].read_text())
    assert resolved["model"]["config"]["d_model"] == 16
    assert resolved["data"]["root"] == str(data_root)
    assert resolved["trainer"]["max_steps"] == 3
    metrics = (configs[0].parent / "metrics.csv").read_text()
    assert "val/bpd" in metrics and "train/bpd" in metrics
    assert not (run_dir / "wandb").exists()  # --wandb disabled: no W&B files at all
    assert "checkpoints in" in capsys.readouterr().out


def plain(value) -> bool:
    """Only what torch.load(weights_only=True) reads back: no dataclasses, no other objects."""
    if isinstance(value, dict):
        return all(isinstance(key, str) and plain(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain(item) for item in value)
    return value is None or isinstance(value, (str, int, float, bool))


@pytest.mark.parametrize("config_in_hyper_parameters", [False, True])
def test_training_checkpoint_loads_with_load_from_checkpoint(tmp_path, data_root, config_in_hyper_parameters):
    run_dir = tmp_path / "run"
    main(["--config", str(write_config(tmp_path, run_dir, data_root, max_steps=2)), "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    hyper_parameters = checkpoint["hyper_parameters"]
    assert plain(hyper_parameters), hyper_parameters
    # the model's configuration is stored once, where loading without Lightning reads it
    assert "config" not in hyper_parameters and hyper_parameters["peak_lr"] > 0
    assert checkpoint["imagetx"]["model_config"] == ModelConfig(**TINY_TRAIN_MODEL).to_dict()
    if config_in_hyper_parameters:  # as checkpoints written before it was stored once hold it
        hyper_parameters["config"] = checkpoint["imagetx"]["model_config"]
        last = tmp_path / "stored_twice.ckpt"
        torch.save(checkpoint, last)
    module = ImageTransformerModule.load_from_checkpoint(last, map_location="cpu").eval()
    model = load_model(last)
    assert module.config == model.config == ModelConfig(**TINY_TRAIN_MODEL)
    images = random_images(3, 32, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(module.bits_per_dim({"images": images}), model.bits_per_dim(images),
                                   rtol=0, atol=0)


def test_the_data_takes_image_size_and_classes_from_the_model(tmp_path, data_root, capsys):
    model = {"image_size": 8, "attention": {"query_block_length": 16}, "num_classes": 10}
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, model=model)
    cli = make_cli(["--config", str(config), "--wandb", "disabled"])
    assert (cli.datamodule.image_size, cli.datamodule.num_classes) == (8, 10)
    # set twice, they could disagree: the data's copy is refused, on the command line and in a YAML file
    line = one_error_line(capsys, main, ["--config", str(config), "--wandb", "disabled", "--data.image_size", "8"])
    assert "data.image_size is set from --model.config.image_size" in line, line
    twice = write_train_config(tmp_path / "twice.yaml", tmp_path / "run", data_root, model=model,
                               data={"num_classes": 10})
    line = one_error_line(capsys, main, ["--config", str(twice), "--wandb", "disabled"])
    assert "data.num_classes is set from --model.config.num_classes" in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resume_last_continues_the_global_step(tmp_path, data_root):
    run_dir = tmp_path / "run"
    main(["--config", str(write_config(tmp_path, run_dir, data_root, max_steps=2)), "--data.root", str(data_root),
          "--wandb", "disabled"])
    last = run_dir / "checkpoints" / "last.ckpt"
    first = torch.load(last, map_location="cpu", weights_only=False)
    assert first["global_step"] == 2
    main(["--config", str(write_config(tmp_path, run_dir, data_root, max_steps=4)), "--data.root", str(data_root),
          "--wandb", "disabled", "--resume", "last"])
    second = torch.load(last, map_location="cpu", weights_only=False)
    assert second["global_step"] == 4
    # the optimiser continued too: Adam's step count is the global step
    adam = second["optimizer_states"][0]["state"]
    assert {int(s["step"]) for s in adam.values()} == {4}
    assert any(not torch.equal(first["state_dict"][k], second["state_dict"][k]) for k in first["state_dict"])


def test_the_evaluate_command_printed_at_the_end_runs_as_printed(tmp_path, data_root, capsys, monkeypatch):
    """The hint names the data and the split the run validated on: run from another folder, with no
    $IMAGETX_DATA, it scores the checkpoint on the run's val images."""
    from imagetx import evaluate

    run_dir = tmp_path / "run"
    main(["--config", str(write_config(tmp_path, run_dir, data_root, max_steps=2)), "--wandb", "disabled"])
    hint = capsys.readouterr().out.split("evaluate with: ")[-1].strip()
    words = shlex.split(hint)
    assert words[:3] == ["python", "-m", "imagetx.evaluate"], hint
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("IMAGETX_DATA", raising=False)
    evaluate.main(words[3:])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["split"] == "val" and result["images"] == 2 and math.isfinite(result["bpd"]), result


def test_resume_last_without_checkpoint_exits_2(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["--config", str(write_config(tmp_path, run_dir, data_root)), "--data.root", str(data_root),
              "--wandb", "disabled", "--resume", "last"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--resume last" in err and str(run_dir / "checkpoints" / "last.ckpt") in err
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_unknown_config_key_exits_nonzero(tmp_path, data_root, capsys):
    path = write_config(tmp_path, tmp_path / "run", data_root)
    config = yaml.safe_load(path.read_text())
    config["model"]["config"]["d_modle"] = 32  # a typo must not be ignored
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as info:
        main(["--config", str(path), "--data.root", str(data_root), "--wandb", "disabled"])
    assert info.value.code not in (0, None)
    assert "d_modle" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_missing_data_exits_2_with_a_clear_message(tmp_path, capsys):
    (tmp_path / "none").mkdir()  # a folder without the data (one that does not exist is refused as a path)
    with pytest.raises(SystemExit) as info:
        main(["--config", str(write_config(tmp_path, tmp_path / "run", tmp_path / "none")),
              "--data.root", str(tmp_path / "none"), "--wandb", "disabled"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "train-*.npz" in err


def test_wandb_auto_without_key_logs_offline(tmp_path, data_root, capsys, clean_wandb_env):
    import wandb

    run_dir = tmp_path / "run"
    try:
        main(["--config", str(write_config(tmp_path, run_dir, data_root, max_steps=2)),
              "--data.root", str(data_root), "--wandb", "auto"])
    finally:
        if wandb.run is not None:
            wandb.finish()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    err = capsys.readouterr().err
    assert "logging offline" in err
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1 and offline_runs[0].is_dir()
    assert not list((run_dir / "wandb").glob("run-*"))  # no online run


def test_loss_falls_when_overfitting_one_batch():
    torch.manual_seed(0)
    module = ImageTransformerModule(tiny_config(image_size=4, head="categorical", d_model=32, d_filter=64),
                                    optimizer="adam_noam", peak_lr=3e-3, warmup_steps=1)
    optimizer = module.configure_optimizers()["optimizer"]
    batch = {"images": random_images(4, 4, seed=1), "labels": torch.zeros(4, dtype=torch.long)}
    module.train()
    history = []
    for _ in range(30):
        loss = module.bits_per_dim(batch).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    module.eval()
    with torch.no_grad():
        final = module.bits_per_dim(batch).mean().item()
    assert 7.0 < history[0] < 9.5  # an untrained model is near the uniform 8 bits
    assert final < history[0] - 1.0, (history[0], final)
    assert math.isfinite(final)


def test_invalid_wandb_mode_exits_2(tmp_path, data_root, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--config", str(write_config(tmp_path, tmp_path / "run", data_root)), "--data.root", str(data_root),
              "--wandb", "sometimes"])
    assert info.value.code == 2
    assert "--wandb 'sometimes' is invalid" in capsys.readouterr().err


def test_limit_val_batches_one_in_a_config_means_one_batch(tmp_path, data_root):
    # Lightning documents limit_val_batches as "int = number of batches, float = fraction".
    # Its annotation is Union[float, int, None], so jsonargparse turns YAML `1` into 1.0,
    # which Lightning reads as 100 % of the batches: a config asking for one validation
    # batch silently validates the whole split (5,000 images with val_size 5000).
    from imagetx.train import make_cli

    config = write_config(tmp_path, tmp_path / "run", data_root, max_steps=2)
    cli = make_cli(["--config", str(config), "--data.root", str(data_root), "--wandb", "disabled",
                    "--data.val_size", "6"])  # 3 validation batches of 2
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.num_val_batches == [1], cli.trainer.num_val_batches


@pytest.mark.parametrize("terminal", [True, False])
def test_the_progress_bar_is_tqdms_and_redraws_sparingly_in_a_log(tmp_path, data_root, monkeypatch, terminal):
    # Lightning would pick Rich's bar where Rich is installed (Gradio brings it), which writes
    # nothing to a log file until the end; imagetx's Trainer gives tqdm's, redrawn every batch on
    # a terminal and, in a log, at the first and last batch and every LOG_REFRESH_SECONDS between.
    # A bar turned off stays off.
    from lightning.pytorch.callbacks import TQDMProgressBar

    from imagetx.training import trainer as trainers

    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal, raising=False)
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, enable_progress_bar=True)
    bar = make_cli(["--config", str(config), "--wandb", "disabled"]).trainer.progress_bar_callback
    assert isinstance(bar, TQDMProgressBar) and bar.refresh_rate == 1
    assert type(bar) is (trainers.TrainingBar if terminal else trainers.LogProgressBar)
    config = write_train_config(tmp_path / "off.yaml", tmp_path / "run", data_root)  # enable_progress_bar: False
    assert make_cli(["--config", str(config), "--wandb", "disabled"]).trainer.progress_bar_callback is None


def test_in_a_log_the_progress_bar_advances_from_the_first_step(tmp_path, data_root, monkeypatch, capsys):
    # Redrawn every 100 batches, a quick run's log showed its bar at 0 % for its first 100 steps
    # (about a minute on a 2-core CPU).
    from imagetx.training import trainer as trainers

    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data_root, max_steps=5,
                                enable_progress_bar=True, val_check_interval=100)
    main(["--config", str(config), "--wandb", "disabled"])  # sys.stdout is pytest's capture: not a terminal
    out = capsys.readouterr().out
    assert "1/5" in out and "5/5" in out, out  # an epoch of 5 batches
    clock = iter([0.0, 1.0, 14.0, 16.0, 17.0])  # then redrawn once LOG_REFRESH_SECONDS (15) have passed
    monkeypatch.setattr(trainers.time, "monotonic", lambda: next(clock))
    bar = trainers.LogProgressBar()
    assert [bar._should_update(n, 100) for n in (1, 2, 3, 4, 100)] == [True, False, False, True, True]


def test_a_resumed_runs_bar_has_its_total_and_shows_val_bpd_as_the_csv_rounded(tmp_path, data_root, capsys):
    """Issue 111: resumed in the middle of an epoch, the bar had no total ("4/?") and took the batches
    done before as done at once (a rate of thousands); its val/bpd had 3 significant digits.
    Now it counts on from the batches done (3 of the epoch's 5, no rate yet) and shows metrics.csv's
    val/bpd rounded to BAR_DECIMALS places."""
    import csv

    from imagetx.training.trainer import BAR_DECIMALS

    run_dir = tmp_path / "run"
    config = str(write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=3, enable_progress_bar=True,
                                    val_check_interval=100))
    main(["--config", config, "--wandb", "disabled"])
    capsys.readouterr()
    # an epoch of 5 batches resumed after its third, validated at step 4
    main(["--config", config, "--wandb", "disabled", "--resume", "last", "--trainer.max_steps", "5",
          "--trainer.val_check_interval", "4"])
    bar = capsys.readouterr().out.replace("\r", "\n")
    counts = [line for line in bar.splitlines() if "/" in line and "it/s" in line]
    assert not [line for line in counts if "/?" in line and "0/?" not in line], counts  # a count without a total
    assert any("3/5 [" in line and "?it/s" in line for line in counts), counts  # the 3 done: no rate from them
    assert any("5/5 [" in line for line in counts), counts
    with (run_dir / "csv" / "version_1" / "metrics.csv").open() as handle:
        (val_bpd,) = [float(row["val/bpd"]) for row in csv.DictReader(handle) if row.get("val/bpd")]
    assert f"val/bpd={val_bpd:.{BAR_DECIMALS}f}" in bar, (val_bpd, counts[-1])


def test_a_new_run_in_a_folder_that_holds_one_is_refused(tmp_path, data_root, capsys):
    """Without --resume, a second run in the same folder would overwrite the first's last.ckpt and
    mix their best checkpoints: refused before anything is written, naming both ways on."""
    run_dir = tmp_path / "run"
    config = str(write_config(tmp_path, run_dir, data_root, max_steps=2))
    main(["--config", config, "--wandb", "disabled"])
    capsys.readouterr()
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    files = sorted(run_dir.rglob("*"))
    line = one_error_line(capsys, main, ["--config", config, "--wandb", "disabled", "--trainer.max_steps", "1"])
    assert str(last) in line and "--resume last" in line and "--trainer.default_root_dir NEW" in line, line
    assert last.read_bytes() == before and sorted(run_dir.rglob("*")) == files  # nothing written
    main(["--config", config, "--wandb", "disabled", "--trainer.max_steps", "3", "--resume", "last"])  # the way on


def test_a_run_whose_data_fails_leaves_nothing_behind(tmp_path, capsys):
    """Missing data stops the run before its loggers start: no csv/version_N, no W&B run."""
    run_dir = tmp_path / "run"
    (tmp_path / "no-data").mkdir()  # a folder without the data (one that does not exist is refused as a path)
    config = str(write_config(tmp_path, run_dir, tmp_path / "no-data"))
    line = one_error_line(capsys, main, ["--config", config, "--wandb", "offline"])
    assert "no CIFAR-10 train images" in line, line
    assert not run_dir.exists(), sorted(run_dir.rglob("*"))  # not even the empty folder (issue 74)


def test_the_summary_counts_the_models_flops_and_lightnings_tips_are_dropped(tmp_path, data_root, caplog):
    """The summary's total FLOPs, and the network's row, are the forward FLOPs of a training batch
    as imagetx/model/flops.py counts them (Lightning's own count says 0 without an example input),
    and Lightning's advertisements ("💡 Tip: ... litlogger") and its note that the summary callback
    is imagetx's own ("Trainer already configured with model summary callbacks") are not printed."""
    import logging

    from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

    from imagetx.model.flops import count_flops
    from imagetx import build_model

    caplog.set_level(logging.INFO)
    config = write_config(tmp_path, tmp_path / "run", data_root, max_steps=1, enable_model_summary=True)
    main(["--config", str(config), "--wandb", "disabled"])
    printed = "\n".join(record.getMessage() for record in caplog.records)
    flops = count_flops(build_model(ModelConfig(**TINY_TRAIN_MODEL))).forward * 2  # batches of 2
    (line,) = [line for line in printed.splitlines() if "total flops" in line.lower()]
    assert flops > 0 and line.split("Total")[0].strip() == get_human_readable_count(flops), line
    (header,) = [line for line in printed.splitlines() if "| Name" in line]
    (row,) = [line for line in printed.splitlines() if "| model " in line]
    columns = dict(zip([name.strip() for name in header.split("|")], [value.strip() for value in row.split("|")]))
    assert columns["FLOPs"] == get_human_readable_count(flops), (header, row)
    assert "Total params" in printed and "Tip:" not in printed and "already configured" not in printed
