"""Growing a continuation (imagetx/training/grow.py): twice the depth (identity layers) computes the
source's function, so the grown model's bits/dim on real CIFAR-10 images equal the source's; then it
trains, and a run resumes from the grown packed continuation as a lease does. Growth inside a run
(GrowDepth): tests/training/test_grow_in_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers import ASSETS, write_train_config
from imagetx import ModelConfig, build_model
from imagetx.io.checkpoint import imagetx_metadata, model_config_of
from imagetx.io.errors import CheckpointError
from imagetx.io.older import current_names
from imagetx.train import main as train_main
from imagetx.training.continuation import CONTINUE, MANIFEST, pack, unpack
from imagetx.training.grow import GROWN, PREFIX, grow, grow_checkpoint, main as grow_main
from imagetx.training.resume import main as resume_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

REPO = Path(__file__).resolve().parents[2]
VAL_IMAGES = ASSETS / "cifar10_val_first32.npz"  # real CIFAR-10 val images
LINEAGE = REPO / "lineage" / "cifar10_gpu" / "continuation"  # the GPU model's newest continuation
EXACT = 1e-6  # bits/dim: the same function, up to float32's summation order
# The GPU recipe's decoder, tiny: DMOL over 32x32 pixels, pre-norm, rotary positions, one-row blocks.
DECODER = dict(image_size=32, head="dmol", mixture_components=2, n_layers=1, d_model=32, d_filter=64, dropout=0.0,
               norm="pre", position_encoding="learned",
               attention=dict(n_heads=2, kind="local_1d", query_block_length=32, memory_blocks=1,
                              relative_positions="rotary"))


def real_images(count: int) -> torch.Tensor:
    return torch.from_numpy(np.load(VAL_IMAGES)["images"][:count])


def trained_continuation(steps: int = 3) -> dict:
    """A tiny decoder after a few Adam steps on real images, as a continuation checkpoint (with moments)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**DECODER))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    images = real_images(8)
    for _ in range(steps):
        optimizer.zero_grad()
        model.bits_per_dim(images).mean().backward()
        optimizer.step()
    meta = {**imagetx_metadata(model.config), "continuation": True, "images_seen": 8 * steps}
    return {"imagetx": meta, "global_step": steps, "state_dict": {PREFIX + k: v for k, v in model.state_dict().items()},
            "optimizer_states": [optimizer.state_dict()]}


def network(checkpoint: dict) -> torch.nn.Module:
    """The model a checkpoint holds, built as training builds it (a stored continuation's older names
    and layouts read as today's)."""
    model = build_model(model_config_of(checkpoint))
    model.load_state_dict(current_names({name[len(PREFIX):]: value for name, value in checkpoint["state_dict"].items()},
                                        model))
    return model.eval()


def bits(checkpoint: dict, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return network(checkpoint).bits_per_dim(images)


@pytest.mark.parametrize("growth", [dict(layers=2), dict(layers=3, dropout=0.1)])
def test_a_grown_model_scores_real_images_as_its_source_then_trains(growth):
    source = trained_continuation()
    grown = grow_checkpoint(source, seed=1, **growth)
    images = real_images(4)
    torch.testing.assert_close(bits(grown, images), bits(source, images), rtol=0, atol=EXACT)
    model = network(grown).train()
    assert model.config.dropout == growth.get("dropout", 0.0)
    assert len(model.layers) == growth.get("layers", 1)
    # a few steps lower the loss, and what was added at zero gets a gradient from the first step
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(4):
        optimizer.zero_grad()
        loss = model.bits_per_dim(images).mean()
        loss.backward()
        if step == 0:
            assert model.layers[1].ffn[-1].weight.grad.abs().sum() > 0
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("tensor", ["layers.1.ffn.2.weight", "layers.1.self_attn.proj.weight"])
def test_negative_control_what_grows_at_zero_would_change_the_function_otherwise(tensor):
    source = trained_continuation()
    grown = grow_checkpoint(source, layers=2, seed=1)
    name = PREFIX + tensor
    assert not grown["state_dict"][name].any()
    grown["state_dict"][name] = grown["state_dict"][name] + 0.05 * torch.randn_like(grown["state_dict"][name])
    images = real_images(4)
    assert (bits(grown, images) - bits(source, images)).abs().max() > 1e-3


def test_the_grown_checkpoint_keeps_the_step_and_drops_the_moments():
    source = trained_continuation()
    grown = grow_checkpoint(source, layers=2, seed=0)
    assert grown["global_step"] == source["global_step"] and grown["imagetx"]["images_seen"] == 24
    assert grown["imagetx"]["continuation_moments"] == "none" and grown["optimizer_states"][0]["state"] == {}
    assert grown["optimizer_states"][0]["param_groups"][0]["params"] == list(range(len(grown["state_dict"])))
    assert source["optimizer_states"][0]["state"]  # the source's own are untouched
    assert model_config_of(grown).n_layers == 2
    record = grown["imagetx"][GROWN][-1]
    assert record["from"]["n_layers"] == 1 and record["to"]["n_layers"] == 2 and record["to"]["n_heads"] == 2
    assert record["to"]["parameters"] > record["from"]["parameters"]
    # the same seed, the same grown model
    again = grow_checkpoint(source, layers=2, seed=0)
    assert all(torch.equal(again["state_dict"][name], value) for name, value in grown["state_dict"].items())


def test_growing_smaller_is_refused():
    with pytest.raises(ValueError, match="fewer than the model's 1"):
        grow_checkpoint(trained_continuation(), layers=0)


def test_a_post_norm_model_cannot_add_layers_and_a_checkpoint_not_a_continuation_is_refused():
    source = trained_continuation()
    post = {**source, "imagetx": {**source["imagetx"], "model_config": {**source["imagetx"]["model_config"],
                                                                         "norm": "post"}}}
    with pytest.raises(ValueError, match="a post-norm model .* cannot grow: .* as configs/cifar10_recipe.yaml is"):
        grow_checkpoint(post, layers=2)
    with pytest.raises(CheckpointError, match="not a continuation checkpoint"):
        grow_checkpoint({**source, "imagetx": {**source["imagetx"], "continuation": False}}, layers=2)


def test_the_lineage_continuation_grown_twice_as_deep_scores_real_images_as_it_does(tmp_path, capsys):
    """pretrained/cifar10_gpu's newest continuation (14 layers, 7.4 M parameters) grown to 28 layers by
    the one command a lease runs: the same bits/dim on two real val images."""
    manifest = json.loads((LINEAGE / MANIFEST).read_text())
    grow_main([str(LINEAGE), str(tmp_path / "grown"), "--layers", "28", "--part-mib", "15"])
    said = capsys.readouterr().out  # the growth in words, then the command that goes on from it
    assert "14 -> 28 layers" in said
    assert f"go on with: python -m imagetx.train --config CONFIG --resume {tmp_path / 'grown'}" in said
    grown_manifest = json.loads((tmp_path / "grown" / MANIFEST).read_text())
    assert grown_manifest["step"] == manifest["step"] and grown_manifest["moments"] == "none"
    assert grown_manifest["train_overrides"] == ["--model.config.n_layers", "28"]
    assert grown_manifest[GROWN]["to"]["parameters"] > 1.9 * grown_manifest[GROWN]["from"]["parameters"]
    load = lambda folder: torch.load(unpack(folder, tmp_path / f"{folder.name}.ckpt"), weights_only=True)  # noqa: E731
    images = real_images(2)
    torch.testing.assert_close(bits(load(tmp_path / "grown"), images), bits(load(LINEAGE), images), rtol=0,
                               atol=EXACT)


def test_a_run_resumes_from_a_grown_packed_continuation_at_its_step(tmp_path, data_root, capsys):
    """The lease's way on: a run writes its continuation, grow packs it deeper with dropout, and a run
    resumes from the folder with the printed overrides, at the continuation's step, and trains on. The
    lease after goes on from that run's own continuation: its settings against the preset come from its
    model (``python -m imagetx.training.resume settings``, what ops/gpu_lease.sh reads)."""
    config = write_train_config(tmp_path / "first.yaml", tmp_path / "first", data_root, 5,
                                model={"norm": "pre"}, top={"checkpoint_every_n_steps": 1})
    values = yaml.safe_load(config.read_text())
    values["model"].update(optimizer="adamw_wsd", peak_lr=0.003, warmup_steps=2, lr_horizon="steps",
                           decay_fraction=0.2, rewarmup_steps=1)
    config.write_text(yaml.safe_dump(values))
    train_main(["--config", str(config), "--wandb", "disabled"])
    manifest = grow(tmp_path / "first" / "checkpoints" / CONTINUE, tmp_path / "grown", layers=2, dropout=0.1)
    assert manifest["train_overrides"] == ["--model.config.n_layers", "2", "--model.config.dropout", "0.1"]
    train_main(["--config", str(config), "--wandb", "disabled", "--trainer.max_steps", "8",
                "--trainer.default_root_dir", str(tmp_path / "second"), "--resume", str(tmp_path / "grown"),
                *manifest["train_overrides"]])
    last = torch.load(tmp_path / "second" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 8 and last["imagetx"]["first_step"] == manifest["step"]
    assert model_config_of(last).n_layers == 2 and model_config_of(last).dropout == 0.1
    # without the overrides the run is refused: its configuration is not the continuation's, and the
    # line names the settings (the depth is not among them: a grown checkpoint deepens the run's model)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_main(["--config", str(config), "--wandb", "disabled", "--trainer.max_steps", "8",
                    "--trainer.default_root_dir", str(tmp_path / "third"), "--resume", str(tmp_path / "grown")])
    assert "(--model.config.dropout 0.1)" in capsys.readouterr().err
    # the next lease's continuation: the grown run's own, packed as a lease's `wait` packs it (no overrides)
    pack(tmp_path / "second" / "checkpoints" / CONTINUE, tmp_path / "next")
    assert "train_overrides" not in json.loads((tmp_path / "next" / MANIFEST).read_text())
    for source, settings in ((tmp_path / "next", ["n_layers=2", "dropout=0.1"]),
                             (tmp_path / "first" / "checkpoints" / CONTINUE, [])):
        resume_main(["settings", str(source), "--preset", str(config)])
        assert capsys.readouterr().out.split() == settings


def test_pack_keeps_what_grow_wrote(tmp_path):
    """grow packs through continuation.pack: the joined file is the grown checkpoint."""
    source = trained_continuation()
    torch.save(source, tmp_path / "source.ckpt")
    grow(tmp_path / "source.ckpt", tmp_path / "grown", layers=2, seed=3)
    joined = torch.load(unpack(tmp_path / "grown", tmp_path / "joined.ckpt"), weights_only=True)
    expected = grow_checkpoint(source, layers=2, seed=3)
    assert all(torch.equal(joined["state_dict"][name], value) for name, value in expected["state_dict"].items())
