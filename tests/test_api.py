"""The public API (imagetx.__init__): building, scoring, input checks, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import imagetx
from helpers import random_images, random_labels, tiny_config, tiny_model, weights_checkpoint
from imagetx import (CheckpointError, ImageTransformer, ModelConfig, SuperResolutionTransformer, build_model, load_model,
                     save_pretrained)
from imagetx.model.transformer import AutoregressiveModel
from imagetx.io.checkpoint import imagetx_metadata
from imagetx.model.scoring import full_pass

REPO = Path(__file__).resolve().parents[1]


def test_public_names():
    for name in ("CheckpointError", "ImageTransformer", "ModelConfig", "from_pretrained", "load_model", "push_to_hub",
                 "save_pretrained"):
        assert hasattr(imagetx, name) and name in imagetx.__all__
    # the network is a plain nn.Module, its one base the model's own: saving and sharing are imagetx.io's (io/hub.py)
    assert ImageTransformer.__mro__[1] is AutoregressiveModel
    assert SuperResolutionTransformer.__mro__[1:] == ImageTransformer.__mro__[1:]  # a sibling, not a subclass
    assert ImageTransformer.__mro__[2:] == torch.nn.Module.__mro__


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_nll_shape_and_bits_per_dim_32x32(head):
    model = tiny_model(image_size=32, head=head, query_block_length=32)
    images = random_images(2, 32, seed=1)
    with torch.no_grad():
        nll = model.nll(images)
        bpd = model.bits_per_dim(images)
    assert nll.shape == (2,) and nll.dtype.is_floating_point
    assert (nll > 0).all() and torch.isfinite(nll).all()
    torch.testing.assert_close(bpd, nll / (3072 * math.log(2)))
    # an untrained model is near uniform: a few bits either side of 8
    assert ((bpd > 4) & (bpd < 12)).all(), bpd


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_per_step_log_probs_sum_to_minus_nll(head, attention):
    model = tiny_model(head=head, attention=attention, num_classes=3)
    images, labels = random_images(3, 4, seed=2), random_labels(3, 3)
    with torch.no_grad():
        steps = model.log_prob(images, labels)
        nll = model.nll(images, labels)
        params = full_pass(model, images, labels)
    n_steps = 48 if head == "categorical" else 16
    assert steps.shape == (3, n_steps)
    assert (steps <= 1e-6).all()
    torch.testing.assert_close(steps.sum(1), -nll)
    # Each step's log-probability is the head's score of that step's target.
    targets = model.targets(images)
    torch.testing.assert_close(steps, model.head.log_prob(params, targets))
    if head == "categorical":
        ref = torch.log_softmax(params.double(), -1).gather(-1, targets[..., None])[..., 0]
        torch.testing.assert_close(steps.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("head,attention", [("categorical", "local_1d"), ("categorical", "local_2d"),
                                            ("dmol", "local_1d"), ("categorical", "full")])
def test_nll_independent_of_batch_composition(head, attention):
    model = tiny_model(head=head, attention=attention, n_layers=2)
    images = random_images(5, 4, seed=3)
    with torch.no_grad():
        together = model.nll(images)
        split = torch.cat([model.nll(images[:2]), model.nll(images[2:3]), model.nll(images[3:])])
        reordered = model.nll(images.flip(0)).flip(0)
        alone = torch.stack([model.nll(images[i:i + 1])[0] for i in range(5)])
    for other in (split, reordered, alone):
        torch.testing.assert_close(other, together, rtol=1e-5, atol=1e-4)
    assert len(set(together.tolist())) == 5  # distinct images score differently


def test_uint8_and_int64_images_score_the_same():
    model = tiny_model()
    images = random_images(2, 4, seed=4)
    assert images.dtype == torch.uint8
    with torch.no_grad():
        torch.testing.assert_close(model.nll(images), model.nll(images.long()))
        # extreme values are in range
        edge = torch.tensor([0, 255], dtype=torch.uint8).repeat(2 * 4 * 4 * 3 // 2).view(2, 4, 4, 3)
        assert torch.isfinite(model.nll(edge)).all()


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_float64_model_scores_like_float32(head):
    model = tiny_model(head=head)
    images = random_images(2, 4, seed=5)
    with torch.no_grad():
        nll32 = model.nll(images)
        nll64 = model.double().nll(images)
    torch.testing.assert_close(nll64.double(), nll32.double(), rtol=1e-4, atol=1e-3)


# ----- class conditioning ----------------------------------------------------------------


def test_class_conditional_model_uses_labels():
    model = tiny_model(num_classes=4)
    images = random_images(2, 4, seed=6)
    with torch.no_grad():
        a = model.nll(images, torch.tensor([0, 1]))
        b = model.nll(images, torch.tensor([2, 1]))
    assert abs(a[0] - b[0]) > 1e-3  # each image's own label ...
    torch.testing.assert_close(a[1], b[1])  # ... and only its own


def test_class_conditional_requires_labels():
    model = tiny_model(num_classes=4)
    with pytest.raises(ValueError, match="labels"):
        model.nll(random_images(2, 4))


@pytest.mark.parametrize("labels", [[0, 4], [-1, 0], [0, 100]])
def test_class_conditional_rejects_out_of_range_labels(labels):
    model = tiny_model(num_classes=4)
    with pytest.raises(ValueError, match="labels"):
        model.nll(random_images(2, 4), torch.tensor(labels))


def test_class_conditional_rejects_wrong_label_shape():
    model = tiny_model(num_classes=4)
    with pytest.raises(ValueError, match="labels"):
        model.nll(random_images(2, 4), torch.tensor([0, 1, 2]))


def test_unconditional_rejects_labels():
    model = tiny_model()
    with pytest.raises(ValueError, match="labels"):
        model.nll(random_images(2, 4), torch.tensor([0, 1]))


# ----- image checks -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 4, 4), (2, 4, 4, 4), (2, 8, 8, 3), (2, 4, 5, 3), (4, 4, 3), (2, 3, 4, 4)])
def test_wrong_image_shape(shape):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"shape"):
        model.nll(torch.zeros(shape, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_float_images_rejected(dtype):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"float|uint8"):
        model.nll(random_images(2, 4).to(dtype))


@pytest.mark.parametrize("value", [256, -1, 1000])
def test_out_of_range_values_rejected(value):
    model = tiny_model()
    images = random_images(2, 4, dtype=torch.long)
    images[1, 2, 3, 1] = value
    with pytest.raises(ValueError, match=r"0\.\.255"):
        model.nll(images)


def test_low_res_checks():
    plain = tiny_model()
    with pytest.raises(ValueError, match="takes no low_res input: pass low_res=None"):  # a plain decoder reads none
        plain.nll(random_images(1, 4), low_res=random_images(1, 2))
    sr = tiny_model(image_size=8, encoder_layers=1, low_res_size=2)
    with pytest.raises(ValueError, match="takes no lowres input"):  # a misspelt input is refused by its name
        sr.nll(random_images(1, 8), lowres=random_images(1, 2))
    with pytest.raises(ValueError, match="low_res"):
        sr.nll(random_images(1, 8))
    with pytest.raises(ValueError, match="low_res"):
        sr.nll(random_images(1, 8), low_res=random_images(1, 4))
    with torch.no_grad():
        a = sr.nll(random_images(1, 8), low_res=random_images(1, 2, seed=1))
        b = sr.nll(random_images(1, 8), low_res=random_images(1, 2, seed=2))
    assert a != b  # the low-resolution image conditions the likelihood


@pytest.mark.parametrize("bad", ["float", "too_high", "negative"])
def test_low_res_values_checked_like_images(bad):
    # The encoder's input is an image too: the same clear ValueError as for the target image.
    sr = tiny_model(image_size=8, encoder_layers=1, low_res_size=2)
    low_res = random_images(1, 2, dtype=torch.long)
    if bad == "float":
        low_res = low_res.float()
    else:
        low_res[0, 1, 1, 2] = 256 if bad == "too_high" else -1
    with pytest.raises(ValueError, match="low_res|0\\.\\.255|float"):
        sr.nll(random_images(1, 8), low_res=low_res)


@pytest.mark.parametrize("labels", [torch.tensor([1.0, 0.0]), torch.tensor([True, False])], ids=["float", "bool"])
def test_non_integer_labels_rejected(labels):
    model = tiny_model(num_classes=3)
    with pytest.raises(ValueError, match="labels"):
        model.nll(random_images(2, 4), labels)


# ----- checkpoints --------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(head="dmol", attention="local_2d", num_classes=3, position_encoding="learned", norm="pre"),
    dict(image_size=8, encoder_layers=1, low_res_size=2, attention="local_2d", query_block_shape=(2, 6)),
], ids=["plain", "dmol-2d-classes", "super-resolution"])
def test_save_load_round_trip(tmp_path, overrides):
    model = tiny_model(seed=3, **overrides)
    size = model.config.image_size
    images = random_images(2, size, seed=7)
    kwargs = {}
    if model.config.num_classes:
        kwargs["labels"] = random_labels(2, model.config.num_classes)
    if model.config.superres:
        kwargs["low_res"] = random_images(2, model.config.superres.low_res_size, seed=8)
    path = tmp_path / "sub" / "model"
    save_pretrained(model, path)
    loaded = load_model(path)
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert not loaded.training
    with torch.no_grad():
        assert torch.equal(loaded.nll(images, **kwargs), model.nll(images, **kwargs))
    # A differently seeded model scores differently: the weights really came from the file.
    with torch.no_grad():
        assert not torch.equal(tiny_model(seed=4, **overrides).nll(images, **kwargs), model.nll(images, **kwargs))
    assert [p.name for p in path.parent.iterdir()] == ["model"]
    assert sorted(p.name for p in path.iterdir()) == ["README.md", "config.json", "model.safetensors"]  # no temporaries


def test_load_checkpoint_file(tmp_path):
    # as training writes it: the LightningModule's "model." entries
    model = tiny_model(seed=5)
    path = tmp_path / "model.ckpt"
    torch.save({**weights_checkpoint(model), "epoch": 3}, path)
    loaded = load_model(path)
    images = random_images(2, 4)
    with torch.no_grad():
        assert torch.equal(loaded.nll(images), model.nll(images))
    # without the prefix the weights are not the network's: refused, naming them
    torch.save({**weights_checkpoint(model), "state_dict": model.state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"do not fit .* missing tensor\(s\) value_embedding"):
        load_model(path)


def test_load_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope.ckpt")


def test_load_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError):
        load_model(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.1, 0.0])
def test_load_truncated_file(tmp_path, keep):
    path = tmp_path / "model.ckpt"
    model = tiny_model()
    torch.save(weights_checkpoint(model), path)
    load_model(path)  # whole, it loads
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError):
        load_model(path)


def test_load_garbage_file(tmp_path):
    path = tmp_path / "model.ckpt"
    path.write_text("this is not a checkpoint\n")
    with pytest.raises(CheckpointError):
        load_model(path)


@pytest.mark.parametrize("obj", [{"state_dict": {}}, {"weights": torch.zeros(3)}, torch.zeros(3), [1, 2]],
                         ids=["no-imagetx-key", "other-dict", "tensor", "list"])
def test_load_non_imagetx_torch_file(tmp_path, obj):
    path = tmp_path / "other.pt"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match="imagetx"):
        load_model(path)


def test_load_plain_state_dict(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(tiny_model().state_dict(), path)
    with pytest.raises(CheckpointError):
        load_model(path)


def test_load_state_dict_that_does_not_fit_config(tmp_path):
    model = tiny_model()
    other = tiny_config(d_model=32)  # same fields, different sizes
    path = tmp_path / "mismatch.ckpt"
    torch.save(weights_checkpoint(model, {"format": 1, "model_config": other.to_dict()}), path)
    with pytest.raises(CheckpointError, match="do not fit|fit"):
        load_model(path)


def test_load_state_dict_with_missing_keys(tmp_path):
    model = tiny_model()
    state = model.state_dict()
    state.pop(next(iter(state)))
    path = tmp_path / "missing.ckpt"
    torch.save({"imagetx": {"format": 1, "model_config": model.config.to_dict()}, "state_dict": state}, path)
    with pytest.raises(CheckpointError):
        load_model(path)


@pytest.mark.parametrize("config", [{"d_model": 16, "n_heads": 3}, {"bogus_field": 1}, "not a dict"])
def test_load_checkpoint_with_unusable_config(tmp_path, config):
    path = tmp_path / "badconfig.ckpt"
    torch.save({"imagetx": {"format": 1, "model_config": config}, "state_dict": {}}, path)
    with pytest.raises(CheckpointError):
        load_model(path)


def test_checkpoint_error_is_a_value_error():
    # Callers catching ValueError for bad inputs also catch bad checkpoints.
    assert issubclass(CheckpointError, ValueError)


def test_build_from_config_dict():
    cfg = ModelConfig.from_dict({**tiny_config().to_dict(), "n_layers": 2})
    model = build_model(cfg)
    assert len(model.layers) == 2
    with torch.no_grad():
        assert model.eval().nll(random_images(1, 4)).shape == (1,)


@pytest.mark.slow
def test_the_readmes_python_api_runs_as_written(tmp_path, monkeypatch):
    # The README's "Python API" block, run as a user would from a checkout (the shipped model
    # under pretrained/), in a fresh folder: every line of it works and means what it says.
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Python API\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pretrained").symlink_to(REPO / "pretrained")
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(code, "README.md (Python API)", "exec"), names)
    assert names["half"].shape == (4, 32, 32, 3) and names["new"].shape == (4, 32, 32, 3)
    assert torch.equal(names["half"][:, :16], names["images"][:, :16])  # the given rows kept
    assert sorted(p.name for p in (tmp_path / "my-model").iterdir()) == ["README.md", "config.json",
                                                                         "model.safetensors"]
    assert names["model"].config.num_classes == 10  # load_model read back the model it saved
