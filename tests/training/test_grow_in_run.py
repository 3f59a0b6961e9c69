"""Growth inside a run (imagetx/training/grow.py, ``GrowDepth``), on two CPU processes (DDP over gloo)
through the real command, as a user's 8-GPU run would grow.

One run of 8 steps grows from 1 to 2 decoder layers at half its budget (step 4). Checked: the bits/dim of
real CIFAR-10 val images just before and just after the growth, in the same step, agree to 1e-6 on both
processes (a negative control: the same images scored by the same model with one added tensor moved
off zero differ by far more); both processes end with the same parameters; runs resumed from a
checkpoint before the growth (step 3) and after it (step 5) end bitwise as the uninterrupted run; the
grown checkpoint loads for ``imagetx.evaluate`` and for sampling. Single-process checks of the callback's
refusals follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from helpers import ASSETS, TINY_TRAIN_MODEL, write_cifar_npz, with_changes
from imagetx import load_model
from imagetx.evaluate import main as evaluate_main
from imagetx.model.sampler import sample
from imagetx.training.grow import GROWN, GrowDepth

pytestmark = pytest.mark.usefixtures("clean_wandb_env")

VAL_IMAGES = ASSETS / "cifar10_val_first32.npz"  # real CIFAR-10 val images
EXACT = 1e-6  # bits/dim: the same function, up to float32's summation order
STEPS, GROWTH_STEP = 8, 4

PROBE = '''
import os

import lightning as L
import numpy as np
import torch


class Bits(L.Callback):
    """At the end of step ``at``: the bits/dim of 4 real images (eval mode, no dropout) and the model's
    depth, saved as TAG-rankR.pt; with ``perturb``, also after moving the last layer's feed-forward
    writer off zero (a negative control), the weights put back after."""

    def __init__(self, directory: str, tag: str, at: int, images: str, perturb: bool = False) -> None:
        self.directory, self.tag, self.at, self.perturb = directory, tag, at, perturb
        self.images = torch.from_numpy(np.load(images)["images"][:4])

    def bits(self, model):
        with torch.no_grad():
            return model.bits_per_dim(self.images)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.at:
            return
        model = pl_module.model
        model.eval()
        found = {"bits": self.bits(model), "layers": len(model.layers)}
        if self.perturb:
            writer = model.layers[-1].ffn[-1].weight
            kept = writer.detach().clone()
            with torch.no_grad():
                writer.add_(0.05 * torch.randn_like(writer))
            found["perturbed"] = self.bits(model)
            with torch.no_grad():
                writer.copy_(kept)
        model.train()
        torch.save(found, os.path.join(self.directory, f"{self.tag}-rank{trainer.global_rank}.pt"))


class FinalParameters(L.Callback):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_train_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().reshape(-1) for p in pl_module.model.parameters()])
        torch.save(flat, os.path.join(self.directory, f"final-rank{trainer.global_rank}.pt"))
'''


def run_config(tmp_path, name: str, probes: bool) -> dict:
    probe = str(tmp_path / "probe" / name)
    os.makedirs(probe, exist_ok=True)
    bits = lambda tag, at, perturb=False: {"class_path": "grow_probe.Bits", "init_args": {  # noqa: E731
        "directory": probe, "tag": tag, "at": at, "images": str(VAL_IMAGES), "perturb": perturb}}
    callbacks = [bits("before", GROWTH_STEP)] if probes else []
    callbacks.append({"class_path": "imagetx.training.grow.GrowDepth", "init_args": {"layers": 2, "at_fraction": 0.5}})
    if probes:
        callbacks.append(bits("after", GROWTH_STEP, perturb=True))
        callbacks.append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {
            "dirpath": str(tmp_path / "snapshots"), "filename": "{step}", "every_n_train_steps": 1,
            "save_top_k": -1}})
    callbacks.append({"class_path": "grow_probe.FinalParameters", "init_args": {"directory": probe}})
    return {
        "seed_everything": 0,
        "trainer": {"default_root_dir": str(tmp_path / name), "max_steps": STEPS, "val_check_interval": 4,
                    "check_val_every_n_epoch": None, "limit_val_batches": 1, "num_sanity_val_steps": 0,
                    "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1,
                    "callbacks": callbacks},
        "model": {"config": with_changes(TINY_TRAIN_MODEL, {"norm": "pre"}), "optimizer": "adamw_wsd",
                  "peak_lr": 0.003, "warmup_steps": 2, "rewarmup_steps": 2, "lr_horizon": "steps",
                  "decay_fraction": 0.25},
        "data": {"batch_size": 2, "eval_batch_size": 2, "val_size": 2},
    }


def train_ddp(tmp_path, name: str, data_root, probes: bool = False, resume=None) -> str:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(run_config(tmp_path, name, probes)))
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "probe"), os.environ.get("PYTHONPATH")]))}
    env.pop("MASTER_PORT", None)  # Lightning picks a free port
    command = [sys.executable, "-m", "imagetx.train", "--config", str(config), "--data.root", str(data_root),
               "--wandb", "disabled", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--trainer.strategy", "ddp", *(["--resume", str(resume)] if resume else [])]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name}: rc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def final(tmp_path, name: str, rank: int) -> torch.Tensor:
    return torch.load(tmp_path / "probe" / name / f"final-rank{rank}.pt", weights_only=True)


@pytest.mark.slow
def test_a_run_grows_inside_itself_on_two_processes_and_resumes_exactly_on_both_sides(tmp_path, capsys):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "grow_probe.py").write_text(PROBE)
    data_root = tmp_path / "data"
    write_cifar_npz(data_root, train_sizes=(6, 6))
    output = train_ddp(tmp_path, "whole", data_root, probes=True)
    assert f"grown at step {GROWTH_STEP}: 1 -> 2 decoder layers" in output

    # the same function just before and just after the growth, on every process; the control differs
    for rank in (0, 1):
        before = torch.load(tmp_path / "probe" / "whole" / f"before-rank{rank}.pt", weights_only=True)
        after = torch.load(tmp_path / "probe" / "whole" / f"after-rank{rank}.pt", weights_only=True)
        assert (before["layers"], after["layers"]) == (1, 2)
        torch.testing.assert_close(after["bits"], before["bits"], rtol=0, atol=EXACT)
        assert (after["perturbed"] - before["bits"]).abs().max() > 1e-3
    assert torch.equal(final(tmp_path, "whole", 0), final(tmp_path, "whole", 1))

    # the grown checkpoint: the grown shape, its record, every tensor in the optimiser's state
    last = tmp_path / "whole" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["imagetx"]["model_config"]["n_layers"] == 2
    assert [record["step"] for record in checkpoint["imagetx"][GROWN]] == [GROWTH_STEP]
    state = checkpoint["optimizer_states"][0]
    assert len(state["state"]) == len(state["param_groups"][0]["params"]) == len(checkpoint["state_dict"])

    # resumed before the growth and after it: bitwise the uninterrupted run
    for name, step in (("from_before", GROWTH_STEP - 1), ("from_after", GROWTH_STEP + 1)):
        snapshot = tmp_path / "snapshots" / f"step={step}.ckpt"
        assert torch.load(snapshot, weights_only=True)["imagetx"]["model_config"]["n_layers"] == (
            1 if step < GROWTH_STEP else 2)
        output = train_ddp(tmp_path, name, data_root, resume=snapshot)
        assert ("grown at step" in output) == (step < GROWTH_STEP)
        for rank in (0, 1):
            assert torch.equal(final(tmp_path, name, rank), final(tmp_path, "whole", 0)), f"{name}, rank {rank}"

    # the grown model loads, scores and samples as any other
    capsys.readouterr()
    evaluate_main(["--ckpt", str(last), "--data.root", str(data_root), "--val_size", "2", "--split", "val"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["bpd"] > 0
    model = load_model(last).eval()
    assert len(model.layers) == 2
    images = sample(model, 1)
    assert images.shape == (1, 32, 32, 3) and images.dtype == torch.uint8


class FakeStrategy:
    """Neither one device nor DDP (a stand-in for FSDP, DeepSpeed)."""


@pytest.mark.parametrize("settings, message", [
    (dict(layers=2), "give one of at_fraction"),
    (dict(layers=2, at_fraction=0.5, at_images=10), "give one of at_fraction"),
    (dict(layers=2, at_fraction=1.0), r"not in \[0, 1\)"),
])
def test_grow_depth_settings_are_checked_when_built(settings, message):
    with pytest.raises(ValueError, match=message):
        GrowDepth(**settings)


def test_grow_depth_refuses_a_post_norm_model_a_shallower_target_and_another_strategy():
    from imagetx.model.config import ModelConfig
    from imagetx.training.module import ImageTransformerModule

    class Trainer:
        strategy = FakeStrategy()

    post = ImageTransformerModule(ModelConfig(**with_changes(TINY_TRAIN_MODEL, {"norm": "post"})))
    with pytest.raises(ValueError, match="post-norm model .* cannot grow: .* configs/cifar10_recipe.yaml"):
        GrowDepth(layers=2, at_fraction=0.5).on_fit_start(Trainer(), post)
    pre = ImageTransformerModule(ModelConfig(**with_changes(TINY_TRAIN_MODEL, {"norm": "pre", "n_layers": 3})))
    with pytest.raises(ValueError, match="already has 3 layers"):
        GrowDepth(layers=2, at_fraction=0.5).on_fit_start(Trainer(), pre)
    with pytest.raises(ValueError, match="one device and for DDP, not for FakeStrategy"):
        GrowDepth(layers=4, at_fraction=0.5).on_fit_start(Trainer(), pre)
