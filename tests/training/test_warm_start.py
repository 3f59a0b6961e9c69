"""``--init_from`` (imagetx/training/warm_start.py): a new run started from another model's weights,
e.g. a super-resolution model from an unconditional model with the same decoder."""

from __future__ import annotations

import pytest
import torch

from helpers import (TINY_TRAIN_MODEL, bits_per_dim, decoder_of, one_error_line, random_images, tiny_model,
                     weights_checkpoint, write_train_config)
from imagetx import ModelConfig, build_model
from imagetx.io.errors import CheckpointError
from imagetx.io.weights import write_weights
from imagetx.model.superres import downsample_area
from imagetx.train import main
from imagetx.training.continuation import pack
from imagetx.training.warm_start import start_from

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

DECODER = dict(head="dmol", image_size=8, position_encoding="learned", relative_positions="rotary")
# what a super-resolution model adds to that decoder: the parts that read the 4x4 input
LOW_RES = dict(encoder_layers=1, low_res_size=4, low_res_reading="cell_add", cell_remainder_input=True)


def test_a_zero_start_super_resolution_model_started_from_an_unconditional_one_scores_as_it_does(tmp_path):
    source = tiny_model(seed=1, **DECODER)
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    model = tiny_model(seed=2, **DECODER, **LOW_RES, low_res_zero_start=True)
    images = random_images(3, 8, seed=3)
    low_res = downsample_area(images, 4)
    with torch.no_grad():
        before = model.bits_per_dim(images, low_res=low_res)
        assert not torch.allclose(before, source.bits_per_dim(images))  # a random start scores otherwise
        line = start_from(model, tmp_path / "source")
        # equal up to float32 rounding (the decoder's sums run in another order beside the input's zeros)
        torch.testing.assert_close(model.bits_per_dim(images, low_res=low_res), source.bits_per_dim(images),
                                   rtol=1e-6, atol=1e-5)
    copied = len(source.state_dict())
    assert f"{copied} tensors copied" in line and f"{len(model.state_dict()) - copied} that read" in line
    # the parts that read the input keep their own start: the writers at zero, the encoder as initialised
    assert all(not linear.weight.any() for linear in model.low_res_writers())
    assert any(value.abs().sum() > 0 for value in model.encoder.state_dict().values())


def test_a_packed_continuation_is_a_source_and_joining_it_leaves_no_file_behind(tmp_path):
    """The shipped super-resolution model started from lineage/completion/continuation."""
    source = tiny_model(seed=1, **DECODER)
    checkpoint = weights_checkpoint(source)
    checkpoint["imagetx"]["continuation"], checkpoint["global_step"] = True, 7
    checkpoint["optimizer_states"] = []  # what pack slims: none here
    torch.save(checkpoint, tmp_path / "continue.ckpt")
    pack(tmp_path / "continue.ckpt", tmp_path / "packed")
    before = sorted(tmp_path.rglob("*"))
    model = tiny_model(seed=2, **DECODER, **LOW_RES)
    assert f"{len(source.state_dict())} tensors copied" in start_from(model, tmp_path / "packed")
    for name, value in source.state_dict().items():  # into its decoder
        assert torch.equal(model.state_dict()[f"decoder.{name}"], value), name
    assert sorted(tmp_path.rglob("*")) == before
    (tmp_path / "packed" / "continue.ckpt.part00").write_bytes(b"cut")
    with pytest.raises(CheckpointError, match=r"^--init_from .*packed: its parts do not add up"):
        start_from(model, tmp_path / "packed")


@pytest.mark.parametrize("source_fields, named", [
    (dict(d_model=32, d_filter=64), "shapes that differ: decoder.value_embedding"),  # another width
    (dict(num_classes=10), "tensors this model lacks: decoder.class_embedding"),
    (dict(n_layers=2), "tensors this model lacks: decoder.layers.1"),
])
def test_a_source_with_another_decoder_is_refused_and_the_model_is_untouched(tmp_path, source_fields, named):
    source = tiny_model(seed=1, **{**DECODER, **source_fields})
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    model = tiny_model(seed=2, **DECODER, **LOW_RES)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        start_from(model, tmp_path / "source")
    message = str(info.value)
    assert message.startswith(f"--init_from {tmp_path / 'source'}: its model is not this run's decoder")
    assert named in message and "\n" not in message
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("fields", [DECODER, {**DECODER, **LOW_RES, "low_res_zero_start": True}],
                         ids=["unconditional", "super-resolution"])
def test_a_deeper_model_starts_as_the_shallower_source_with_identity_layers_that_learn(tmp_path, fields):
    """entry 26: the shipped super-resolution model's two layers, and two more."""
    source = tiny_model(seed=1, **fields, norm="pre", n_layers=1)
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    model = tiny_model(seed=2, **fields, norm="pre", n_layers=3)
    images = random_images(3, 8, seed=3)
    low_res = downsample_area(images, 4) if "encoder_layers" in fields else None
    line = start_from(model, tmp_path / "source")
    assert "layers 1-2 added as identity layers" in line
    with torch.no_grad():  # float32 rounding only: the same sums, with two zero branches added
        torch.testing.assert_close(bits_per_dim(model, images, low_res=low_res),
                                   bits_per_dim(source, images, low_res=low_res), rtol=1e-6, atol=1e-5)
    added = list(decoder_of(model).layers)[1:]
    writers = [linear for layer in added for linear in layer.residual_writers()]
    assert all(not linear.weight.any() for linear in writers)
    assert all(layer.self_attn.qkv.weight.abs().sum() > 0 for layer in added)  # the rest as initialised
    bits_per_dim(model, images, low_res=low_res).mean().backward()
    # the new layers learn from the first step: every writer but a zero-started reading's has a gradient
    # (a cell add from a zero start gets one too: it reads the encoder, not the zero branch before it)
    assert all(linear.weight.grad.abs().sum() > 0 for linear in writers)


def test_a_post_norm_model_cannot_add_layers(tmp_path):
    """Post-norm normalises after each add: a layer with zero branches still changes its input."""
    source = tiny_model(seed=1, **DECODER, norm="post", n_layers=1)
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    model = tiny_model(seed=2, **DECODER, norm="post", n_layers=2)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"1 more decoder layers here, which only a pre-norm model"):
        start_from(model, tmp_path / "source")
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


def test_a_decoder_tensor_the_source_lacks_is_refused(tmp_path):
    """Only the parts that read the input may be new: a source without the learned position table
    (sinusoidal positions) leaves a decoder tensor uninitialised, which is refused."""
    source = tiny_model(seed=1, **{**DECODER, "position_encoding": "sinusoidal"})
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    with pytest.raises(CheckpointError, match="tensors of this model's decoder it lacks: positions"):
        start_from(tiny_model(seed=2, **DECODER), tmp_path / "source")


SUPERRES_TRAIN_MODEL = {"superres": dict(encoder_layers=1, low_res_size=8, low_res_reading="cell_add",
                                         low_res_zero_start=True)}


def test_train_init_from_starts_the_run_from_the_source_weights(tmp_path, data_root, capsys):
    source = build_model(ModelConfig(**TINY_TRAIN_MODEL))
    write_weights(tmp_path / "source", source.state_dict(), source.config)
    run_dir = tmp_path / "run"
    # peak_lr 0: Adam's updates are exactly zero, so the trained weights are those the run started from.
    # init_from in the YAML file, as configs/pretrained_superres.yaml gives it
    config = write_train_config(tmp_path / "config.yaml", run_dir, data_root, max_steps=2, model=SUPERRES_TRAIN_MODEL,
                                top={"init_from": str(tmp_path / "source")})
    main(["--config", str(config), "--data.root", str(data_root), "--wandb", "disabled", "--model.peak_lr", "0"])
    assert f"started from {tmp_path / 'source'}: {len(source.state_dict())} tensors copied" in capsys.readouterr().out
    trained = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert trained["global_step"] == 2
    for name, value in source.state_dict().items():
        assert torch.equal(trained["state_dict"][f"model.decoder.{name}"], value), name  # into its decoder


def test_train_refuses_init_from_with_resume(tmp_path, data_root, capsys):
    config = write_train_config(tmp_path / "config.yaml", tmp_path / "run", data_root)
    line = one_error_line(capsys, main, ["--config", str(config), "--data.root", str(data_root), "--wandb", "disabled",
                                         "--resume", "last", "--init_from", str(tmp_path)])
    assert "--resume and --init_from both given" in line
    assert not (tmp_path / "run").exists()


def test_train_with_a_missing_source_exits_with_one_line_and_writes_nothing(tmp_path, data_root, capsys):
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "config.yaml", run_dir, data_root, model=SUPERRES_TRAIN_MODEL)
    line = one_error_line(capsys, main, ["--config", str(config), "--data.root", str(data_root), "--wandb", "disabled",
                                         "--init_from", str(tmp_path / "nowhere.ckpt")])
    assert str(tmp_path / "nowhere.ckpt") in line
    assert not list(run_dir.rglob("*.ckpt")) and not list(run_dir.rglob("metrics.csv"))
