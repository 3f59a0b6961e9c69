"""A lease that grows its model (ops/gpu_lease.sh grow, DRY_RUN on the CPU): the staged continuation grown
in place, the lease's runs taking the grown shape from its manifest; and the card's row for the growth
when the lease comes home (ops/lease_record.py, ops/lease_cards.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import stage_shards, write_train_config
from imagetx.io.checkpoint import model_config_of
from imagetx.io.weights import write_weights
from imagetx.train import main as train_main
from imagetx.training.continuation import CONTINUE, MANIFEST, pack
from ops.lease_cards import generation_card, table
from ops.lease_record import growth, model_shape

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ops" / "gpu_lease.sh"


def tiny_preset(tmp_path: Path, data: Path) -> Path:
    """The tiny DMOL preset, pre-norm (layers can be added), warmup-stable-decay over its steps."""
    config = write_train_config(tmp_path / "tiny.yaml", tmp_path / "unused", data, 5, model={"norm": "pre"})
    values = yaml.safe_load(config.read_text())
    values["model"].update(optimizer="adamw_wsd", peak_lr=0.003, warmup_steps=2, lr_horizon="steps",
                           decay_fraction=0.2)
    config.write_text(yaml.safe_dump(values))
    return config


@pytest.mark.slow
def test_a_lease_grows_its_staged_continuation_and_warms_the_grown_shape(tmp_path):
    stage = stage_shards(tmp_path / "stage")
    config = tiny_preset(tmp_path, stage / "a")
    train_main(["--config", str(config), "--wandb", "disabled", "--trainer.default_root_dir", str(tmp_path / "first"),
                "--data.val_size", "2"])
    pack(tmp_path / "first" / "checkpoints" / CONTINUE, stage / "cont" / "continuation")
    env = dict(os.environ, DRY_RUN="1", WORK=str(tmp_path / "work"), STAGE=str(stage), OUT=str(tmp_path / "out"),
               SITE=str(tmp_path / "site"), CONFIG=str(config), PYTHON=sys.executable, WARM_STEPS="2",
               WANDB_MODE="disabled")
    (tmp_path / "out").mkdir()

    def lease(*step: str) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", str(SCRIPT), *step], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{step}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    assert "continuation staged: step 4" in lease("setup").stdout
    lease("grow", "--layers", "2", "--dropout", "0.1")
    manifest = json.loads((tmp_path / "work" / "continuation" / MANIFEST).read_text())
    assert manifest["train_overrides"] == ["--model.config.n_layers", "2", "--model.config.dropout", "0.1"]
    lease("setup")  # a later call stages again: the grown continuation, not the source
    assert json.loads((tmp_path / "work" / "continuation" / MANIFEST).read_text())["grown"]["to"]["n_layers"] == 2
    lease("warm", "--data.val_size", "2")  # the preset's graphs, at the grown shape
    warm = torch.load(tmp_path / "work" / "warm" / "checkpoints" / "last.ckpt", weights_only=True)
    assert model_config_of(warm).n_layers == 2 and model_config_of(warm).dropout == 0.1
    # The lease after: its continuation is the grown run's own, packed by `wait` (no record of a growth):
    # the shape still comes from its model against the preset, for the runs and the speed check alike.
    staged = stage / "cont" / "continuation" / MANIFEST
    staged.write_text(json.dumps({key: value for key, value in json.loads(staged.read_text()).items()
                                  if key not in ("grown", "train_overrides")}))
    lease("setup")
    lease("warm", "--data.val_size", "2")
    warm = torch.load(tmp_path / "work" / "warm" / "checkpoints" / "last.ckpt", weights_only=True)
    assert model_config_of(warm).n_layers == 2 and model_config_of(warm).dropout == 0.1
    lease("speed")
    assert json.loads((tmp_path / "work" / "step_check.json").read_text())["overrides"]["n_layers"] == 2


def test_home_records_a_growth_as_a_row_of_the_card(tmp_path):
    from helpers import tiny_model

    shapes = {}
    for name, layers in (("before", 1), ("after", 2)):
        model = tiny_model(head="dmol", norm="pre", n_layers=layers)
        write_weights(tmp_path / name, model.state_dict(), model.config)
        shapes[name] = tmp_path / name / "config.json"
    assert growth(shapes["before"], model_shape(shapes["before"]), 7) is None  # nothing grew
    assert growth(tmp_path / "none" / "config.json", model_shape(shapes["after"]), 7) is None  # a first lease
    grown = growth(shapes["before"], model_shape(shapes["after"]), 7)
    assert grown["step"] == 7 and grown["from"]["n_layers"] == 1 and grown["to"]["n_layers"] == 2
    assert grown["to"]["parameters"] > grown["from"]["parameters"]
    lease = {"lease": 2, "date": "2026-11-28", "device": "NVIDIA H200", "training_minutes": 8.0, "first_step": 7,
             "last_step": 20, "images_seen": 40, "val_bpd": 3.0, "grown": grown}
    rows = table([lease], superres=False).splitlines()
    assert rows[2].startswith("| grown | 2026-11-28 |") and "at step 7: layers 1 → 2" in rows[2]
    assert rows[3].startswith("| 2 |")
    assert len({row.count("|") for row in rows}) == 1  # every row has the header's columns
    # the card's first sentence gives the shipped model's shape, not the preset's
    card = generation_card("cifar10_gpu", [{**lease, "shape": grown["to"]}], "8.0 GPU minutes")
    assert "`configs/cifar10_dmol_25min.yaml`'s model as grown at lease 2 (2 layers, d " in card
    assert f"{grown['to']['parameters'] / 1e6:.1f} M parameters" in card
