"""Distribution augmentation's model side (issue 127): a transform id conditions every step as a class
does (an embedding added to the inputs), the identity (id 0) is what scoring without ids uses, and a
model without ``num_transforms`` takes none. Causality and cached = full with transforms:
tests/model/test_causality.py and test_sampler.py (their ``classes+transforms`` cases)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import one_error_line, random_images, random_labels, tiny_model
from imagetx import save_pretrained
from imagetx.data.transforms import NAMES
from imagetx.errors import UserError
from imagetx.sample import main as sample_main
from imagetx.model.sampler import sample
from imagetx.model.scoring import batch_bits_per_dim, evaluate
from imagetx.model.transformer import previous_values


def model_with_transforms(**overrides):
    return tiny_model(seed=3, dtype=torch.float64, image_size=8, head="dmol", num_transforms=48,
                      query_block_length=16, **overrides)


@torch.no_grad()
def test_the_identity_is_id_0_and_what_evaluate_reports():
    model = model_with_transforms(num_classes=10)
    images, labels = random_images(4, 8, seed=1), random_labels(4, 10, seed=2)
    identity = model.bits_per_dim(images, labels)
    assert torch.equal(identity, model.bits_per_dim(images, labels, transforms=torch.zeros(4, dtype=torch.long)))
    # the ids are read: another transform is another distribution (the negative control)
    rotated = model.bits_per_dim(images, labels, transforms=torch.full((4,), 6))
    assert (rotated - identity).abs().min() > 1e-6
    # what imagetx.evaluate reports (scoring.evaluate: batches without ids) is the identity's
    reported = evaluate(model, images, labels, batch_size=3, progress=False)["bpd"]
    assert reported == pytest.approx(float(identity.mean()), rel=1e-12)
    # a training batch's ids reach the model (scoring.conditioning reads batch["transforms"])
    batch = {"images": images, "labels": labels, "transforms": torch.full((4,), 6)}
    assert torch.equal(batch_bits_per_dim(model, batch), rotated)


@torch.no_grad()
def test_each_image_is_conditioned_on_its_own_transform():
    model = model_with_transforms()
    images, transforms = random_images(3, 8, seed=4), torch.tensor([0, 7, 47])
    together = model.bits_per_dim(images, transforms=transforms)
    alone = torch.cat([model.bits_per_dim(images[i : i + 1], transforms=transforms[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-12, atol=1e-12)


def test_sampling_conditioned_on_a_transform():
    """Seeded draws: the identity's with no ids and with id 0 are the same images; another id's differ."""
    model = tiny_model(seed=3, image_size=4, head="dmol", num_transforms=48)

    def drawn(transforms):
        return sample(model, 2, generator=torch.Generator().manual_seed(0), transforms=transforms)

    identity = drawn(None)
    assert torch.equal(identity, drawn(torch.zeros(2, dtype=torch.long)))
    with torch.no_grad():  # an embedding far from the identity's, so that the draws must move
        model.transform_embedding.weight[9] += 10.0
    assert not torch.equal(identity, drawn(torch.full((2,), 9)))


def test_transforms_refused_in_one_line_where_the_model_cannot_take_them():
    plain = tiny_model(seed=0)
    assert plain.transform_embedding is None and not any("transform" in name for name in plain.state_dict())
    images = random_images(2, 4)
    with pytest.raises(UserError, match=r"num_transforms=0\): give no transforms"):
        plain.bits_per_dim(images, transforms=torch.zeros(2, dtype=torch.long))
    model = tiny_model(seed=0, num_transforms=48)
    with pytest.raises(UserError, match=r"transforms span 0..48 outside 0..47"):
        model.bits_per_dim(images, transforms=torch.tensor([0, 48]))
    with pytest.raises(UserError, match=r"transforms have shape \(3,\); expected \(2,\)"):
        model.start_decoding(2, transforms=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_transforms"):
        tiny_model(num_transforms=-1)


def test_sample_command_takes_a_transform(tmp_path, capsys):
    """``imagetx.sample --transform NAME`` draws from that transform's distribution (the summary names it; the
    same seed, other images than the identity's); refused in one line for a model without transforms or an
    unknown name."""
    model = tiny_model(seed=3, image_size=4, head="dmol", num_transforms=48)
    with torch.no_grad():  # far from the identity's vector, so that the draws must move
        model.transform_embedding.weight[NAMES["rot90"]] += 10.0
    save_pretrained(model, tmp_path / "model")
    save_pretrained(tiny_model(seed=3, image_size=4, head="dmol"), tmp_path / "plain")

    def summary(*extra, out="a"):
        sample_main(["--ckpt", str(tmp_path / "model"), "--count", "2", "--out", str(tmp_path / out), *extra])
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    identity, rotated = summary(out="identity"), summary("--transform", "rot90", out="rot90")
    assert "transform" not in identity and rotated["transform"] == "rot90"
    grids = [np.asarray(Image.open(s["files"][0])) for s in (identity, rotated)]
    assert not np.array_equal(*grids)
    assert summary("--transform", str(NAMES["rot90"]), out="by_id")["transform"] == "rot90"
    plain = ["--ckpt", str(tmp_path / "plain"), "--out", str(tmp_path / "c"), "--transform", "rot90"]
    assert "without distribution augmentation" in one_error_line(capsys, sample_main, plain)
    unknown = ["--ckpt", str(tmp_path / "model"), "--out", str(tmp_path / "d"), "--transform", "rot45"]
    assert "not a transform" in one_error_line(capsys, sample_main, unknown)


@pytest.mark.parametrize("given", ["ids", "identity"])
def test_a_model_with_transforms_compiles_as_one_graph(given):
    """The transform's vector (ids, or the identity's row without them) adds no graph break
    (tests/training/test_compile.py: what a break costs); the eager backend traces as torch.compile does."""
    model = tiny_model(seed=1, image_size=8, head="dmol", num_classes=10, num_transforms=48, query_block_length=16)
    images, labels = random_images(2, 8, seed=2), random_labels(2, 10, seed=3)
    kwargs = {"labels": labels, "transforms": torch.tensor([5, 40]) if given == "ids" else None}
    previous = previous_values(model.targets(images))
    torch.compiler.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(previous, **kwargs), model(previous, **kwargs))
