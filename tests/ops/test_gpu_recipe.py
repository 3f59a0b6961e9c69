"""The one-GPU recipe (configs/cifar10_dmol_25min.yaml, docs/gpu.md), run as far as a CPU can run
it, so that a lent GPU meets as few code paths as possible for the first time.

The smoke test trains the preset itself, overridden to a tiny model and a few steps on the CPU,
with the recipe's options: ``model.compile`` (torch.compile of the model, forward and backward),
bf16-mixed (autocast), the budget-aware warmup–stable–decay under ``max_time``, the sample grids; then scores
the checkpoint through FlexAttention (compiled, under bf16 autocast, as a GPU's validation runs
it) and samples with the compiled decoding step. What the CPU cannot run: docs/gpu.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch._dynamo.utils import counters

from helpers import train_metrics, with_changes
from imagetx import build_model, ModelConfig, load_model
from imagetx.model.scoring import evaluate
from imagetx.model.flops import count_flops
from imagetx.model.sampler import sample
from imagetx.data.sources import load
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "cifar10_dmol_25min.yaml"
TRAIN_IMAGES, VAL_IMAGES = 45_000, 5_000  # CIFAR-10's training split with val_size 5,000


def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def test_recipe_sizing_matches_its_arithmetic():
    # The preset's comment and docs/gpu.md size the run from these figures; a change to the
    # model must change them too.
    values = recipe()
    config = ModelConfig.from_dict(values["model"]["config"])
    flops = count_flops(build_model(config, kernel="flex"))  # as on CUDA
    assert round(flops.training / 1e9, 1) == 55.8 and round(flops.forward / 1e9, 1) == 18.6
    # every batch of one shape: the compiled model never recompiles for a short last batch
    data = values["data"]
    assert TRAIN_IMAGES % data["batch_size"] == 0 and VAL_IMAGES % data["eval_batch_size"] == 0
    assert data["eval_batch_size"] * values["trainer"]["limit_val_batches"] == VAL_IMAGES


# What the CPU run changes: the model's size, the steps, the device, the data. The rest (compile,
# bf16-mixed, the optimiser and its budget horizon, pre-LN, DMOL, the sample
# grids) is the recipe's own.
TINY = {"n_layers": 1, "d_model": 16, "d_filter": 32, "mixture_components": 2, "attention": {"n_heads": 2}}


def write_override(path: Path, run_dir: Path, data_root: Path, **trainer) -> Path:
    override = {
        "trainer": {"default_root_dir": str(run_dir), "accelerator": "cpu", "max_steps": 4,
                    "val_check_interval": 2, "limit_val_batches": 1, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "callbacks": [{"class_path": "imagetx.training.callbacks.SampleGrid",
                                   "init_args": {"every_n_steps": 4, "count": 2}}], **trainer},
        "model": {"config": TINY, "warmup_steps": 2},
        "data": {"root": str(data_root), "batch_size": 2, "eval_batch_size": 2, "val_size": 2},
    }
    path.write_text(yaml.safe_dump(override))
    return path


@pytest.mark.parametrize("preset", ["cifar10_dmol_25min.yaml", "cifar10_dmol.yaml"])
def test_bf16_mixed_recipe_clips_gradients(tmp_path, data_root, preset):
    # Lightning's mixed-precision plugin refuses to clip for a fused optimiser (it unscales
    # fp16 gradients itself); under bf16 there is no scaler and training/module.py clips them itself.
    # Uncompiled, two steps: the refusal came at the first optimiser step, compiled or not.
    override = write_override(tmp_path / "tiny.yaml", tmp_path / "run", data_root, max_steps=2, callbacks=[])
    main(["--config", str(RECIPE.parent / preset), "--config", str(override), "--model.compile", "false",
          "--wandb", "disabled"])
    assert sorted(train_metrics(tmp_path / "run")) == [0, 1]


@pytest.mark.slow
def test_recipe_trains_evaluates_and_samples_on_the_cpu(tmp_path, data_root):
    run_dir = tmp_path / "run"
    compiled_before = counters["stats"]["unique_graphs"]
    override = write_override(tmp_path / "tiny.yaml", run_dir, data_root)
    main(["--config", str(RECIPE), "--config", str(override), "--wandb", "disabled"])
    assert counters["stats"]["unique_graphs"] > compiled_before  # the model ran compiled

    resolved = yaml.safe_load(next((run_dir / "csv").glob("version_*/config.yaml")).read_text())
    assert resolved["trainer"]["precision"] == "bf16-mixed" and resolved["model"]["compile"] is True
    shrunk = with_changes(recipe()["model"]["config"], TINY)  # the recipe's model, shrunk
    assert with_changes(resolved["model"]["config"], shrunk) == resolved["model"]["config"]  # every value as set
    losses = train_metrics(run_dir)
    assert sorted(losses) == [0, 1, 2, 3] and all(torch.isfinite(torch.tensor(list(losses.values()))))
    assert list((run_dir / "samples").glob("*.png"))  # a sample grid, drawn during training

    # Scoring: the trained weights through FlexAttention, compiled and under bf16 autocast (a
    # GPU's validation with this recipe), against the CPU's SDPA path in float32.
    model = load_model(run_dir / "checkpoints" / "last.ckpt")
    assert model.layers[0].self_attn.kernel == "auto"  # on this CPU: SDPA
    flex_model = build_model(model.config, kernel="flex").eval()
    flex_model.load_state_dict(model.state_dict())
    flex_model.compile()
    images, labels = load("cifar10", data_root, "val", val_size=2)

    def bits_per_dim(scored) -> float:
        return evaluate(scored, images, labels, batch_size=2, progress=False)["bpd"]

    expected = bits_per_dim(model)
    assert bits_per_dim(flex_model) == pytest.approx(expected, abs=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # bf16 keeps 8 bits of mantissa (~0.4 % per rounding); the heads score in float32
        assert bits_per_dim(flex_model) == pytest.approx(expected, rel=1e-2)

    # Sampling: the compiled decoding step of the flex model (the cached decoder reads its ring
    # through SDPA whatever the kernel: docs/model.md §4).
    generated = sample(flex_model, 2, compiled=True, generator=torch.Generator().manual_seed(0))
    assert generated.shape == (2, 32, 32, 3) and generated.dtype == torch.uint8
    with torch.no_grad():
        assert torch.isfinite(model.bits_per_dim(generated)).all()

