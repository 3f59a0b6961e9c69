"""Super-resolution (docs/model.md §6): the encoder sees everything, the decoder stays causal,
and the commands score and sample given the 8×8 input."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import (decode_embeddings, dense_attention, random_images, tiny_model, value_embeddings,
                     write_cifar_npz)
from imagetx import ImageTransformer, SuperResolutionTransformer, build_model, load_model, save_pretrained
from imagetx.model.attention import merge_heads, project_heads
from imagetx.model.superres import downsample_area
from imagetx.model.scoring import full_pass
from imagetx.data.images import GRID_SCALE
from imagetx.evaluate import main as evaluate_main
from imagetx.sample import main as sample_main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


def superres_model(head: str, attention: str, seed: int = 0, **overrides):
    geometry = {"local_1d": dict(query_block_length=16),
                "local_2d": dict(query_block_shape=(2, 6) if head == "categorical" else (2, 2), memory_flange=(2, 3)),
                "full": {}}[attention]
    values = dict(encoder_layers=2, low_res_size=2, **geometry)
    values.update(overrides)
    return tiny_model(seed=seed, dtype=torch.float64, head=head, attention=attention, image_size=8, **values)


class LeafEmbeddings:
    """Makes the encoder's input embeddings a leaf we can differentiate with respect to."""

    def __init__(self, model):
        self.leaf = None
        model.encoder.embedding.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        self.leaf = output.detach().requires_grad_()
        return self.leaf


@pytest.mark.parametrize("reading", ["cross_attention", "cell_add"])
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_decoder_causal_and_every_output_sees_all_of_the_low_res_input(head, attention, reading):
    # the cell add reads one low-res pixel directly, the rest arrives through the encoder
    model = superres_model(head, attention, low_res_reading=reading)
    images, low_res = random_images(2, 8, seed=1), random_images(2, 2, seed=2)
    leaf = LeafEmbeddings(model)
    targets = model.targets(images)
    emb = value_embeddings(model, targets).detach().requires_grad_()
    params = decode_embeddings(model, emb, low_res=low_res)
    length = params.shape[1]
    for t in sorted({0, 1, length // 2, length - 1}):
        proj = torch.randn(params.shape[0], params.shape[-1], dtype=params.dtype,
                           generator=torch.Generator().manual_seed(t))
        grad_emb, grad_low = torch.autograd.grad((params[:, t] * proj).sum(), (emb, leaf.leaf), retain_graph=True)
        per_step = grad_emb.abs().sum(dim=(0, 2))
        assert torch.all(per_step[t:] == 0), f"step {t} depends on steps >= {t}"
        if t > 0:
            assert per_step[:t].sum() > 0
        per_low_res_input = grad_low.abs().sum(dim=(0, 2))  # (3·h·w,)
        assert torch.all(per_low_res_input > 0), f"step {t} ignores some low-resolution sub-pixels"


def pixel_of_step(step: int, head: str, side: int) -> tuple[int, int]:
    """(row, col) of the pixel a raster-order step belongs to, written out independently."""
    per_row = side * 3 if head == "categorical" else side
    col = step % per_row
    return step // per_row, col // 3 if head == "categorical" else col


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_the_cell_add_reaches_exactly_the_step_s_own_low_res_pixel(head):
    # One decoder layer: step t's output depends on the encoder output only through its own
    # cell add, so the gradient's support is the 3 sub-pixels of the low-res pixel under it.
    model = superres_model(head, "local_1d", low_res_size=4, n_layers=1, low_res_reading="cell_add")
    images, low_res = random_images(1, 8, seed=1), random_images(1, 4, seed=2)
    context = model.encoder(low_res, model.decoder.positions).detach().requires_grad_()
    model.encoder.register_forward_hook(lambda module, args, output: context)  # the encoder's output a leaf
    params = full_pass(model, images, low_res=low_res)
    for t in range(params.shape[1]):
        (grad,) = torch.autograd.grad(params[0, t].sum(), context, retain_graph=True)
        reached = grad[0].abs().sum(dim=-1) > 0
        row, col = pixel_of_step(t, head, 8)
        for s in range(context.shape[1]):
            low_row, low_col = pixel_of_step(s, "categorical", 4)  # the encoder reads sub-pixels
            under = row // 2 == low_row and col // 2 == low_col
            assert bool(reached[s]) == under, f"step {t} (pixel {row},{col}) vs low-res sub-pixel {s}"


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_cross_attention_equals_the_dense_reference(head):
    model = superres_model(head, "local_1d", low_res_size=4)
    attn = model.decoder.layers[0].cross_attn
    length = model.order.length
    x = torch.randn(2, length, 16, dtype=torch.float64, requires_grad=True)
    context = torch.randn(2, 48, 16, dtype=torch.float64, requires_grad=True)
    (q,) = project_heads(attn.q, x, attn.n_heads, 1)
    k, v = project_heads(attn.kv, context, attn.n_heads, 2)
    expected = merge_heads(attn.proj, dense_attention(q, k, v, torch.ones(length, 48, dtype=torch.bool)))
    got = attn(x, attn.prepare(context))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(got)
    grads = torch.autograd.grad((got * weights).sum(), (x, context))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (x, context))
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-10)


def test_encoder_is_not_causal():
    model = superres_model("categorical", "local_1d")
    leaf = LeafEmbeddings(model)
    context = model.encoder(random_images(1, 2, seed=3), model.decoder.positions)  # (1, 12, d)
    proj = torch.randn(context.shape[-1], dtype=context.dtype, generator=torch.Generator().manual_seed(0))
    for i in range(context.shape[1]):
        # a random projection: the plain sum of a LayerNorm output is constant
        (grad,) = torch.autograd.grad((context[0, i] * proj).sum(), leaf.leaf, retain_graph=True)
        assert torch.all(grad.abs().sum(dim=(0, 2)) > 0), f"encoder output {i} misses some inputs"


def test_low_res_input_changes_the_likelihood():
    model = superres_model("dmol", "local_1d")
    images = random_images(2, 8, seed=4)
    a = model.nll(images, low_res=random_images(2, 2, seed=5))
    b = model.nll(images, low_res=random_images(2, 2, seed=6))
    assert not torch.allclose(a, b)


@pytest.fixture(scope="module")
def superres_ckpt(tmp_path_factory):
    # 32×32 DMOL decoder (1024 cheap steps) with a one-layer encoder over the 8×8 input.
    model = tiny_model(seed=31, image_size=32, head="dmol", query_block_length=64, encoder_layers=1, low_res_size=8)
    path = tmp_path_factory.mktemp("sr") / "sr"
    save_pretrained(model, path)
    return path


def test_evaluate_scores_given_the_8x8_input(tmp_path, capsys, superres_ckpt):
    root = tmp_path / "data"
    _, _, test_images, _ = write_cifar_npz(root, train_sizes=(4,), test_size=5)
    evaluate_main(["--ckpt", str(superres_ckpt), "--data.root", str(root), "--split", "test", "--batch_size", "2"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model = load_model(superres_ckpt)
    images = torch.from_numpy(test_images)
    with torch.no_grad():
        nats = model.nll(images, low_res=downsample_area(images, 8)).double().sum()
    assert result["images"] == 5
    assert math.isclose(result["bpd"], float(nats) / (5 * 3072 * math.log(2)), rel_tol=1e-5)


def test_sample_superres_grid(tmp_path, capsys, superres_ckpt):
    root = tmp_path / "data"
    train_images, _, _, _ = write_cifar_npz(root, train_sizes=(6,))
    out = tmp_path / "out"
    sample_main(["--ckpt", str(superres_ckpt), "--task", "superres", "--count", "2", "--temperatures", "0.8", "1.0",
                 "--data.root", str(root), "--split", "val", "--val_size", "2", "--out", str(out)])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["images"] == 4  # 2 inputs x 2 temperatures
    grid = np.asarray(Image.open(out / "superres.png").convert("RGB"))[::GRID_SCALE, ::GRID_SCALE]  # undo the display scale
    pad, side = 2, 32

    def cell(row, col):
        top, left = pad + row * (side + pad), pad + col * (side + pad)
        return grid[top : top + side, left : left + side]

    originals = torch.from_numpy(train_images[-2:])
    for row in range(2):
        # first column: the 8×8 input repeated to 32×32; last column: the original
        low = downsample_area(originals[row : row + 1], 8)[0].numpy()
        assert np.array_equal(cell(row, 0), low.repeat(4, 0).repeat(4, 1))
        assert np.array_equal(cell(row, 3), originals[row].numpy())


def test_sample_superres_rejects_a_plain_model(tmp_path, capsys):
    path = tmp_path / "plain"
    save_pretrained(tiny_model(image_size=32, head="dmol", query_block_length=64), path)
    with pytest.raises(SystemExit) as info:
        sample_main(["--ckpt", str(path), "--task", "superres", "--out", str(tmp_path / "o")])
    assert info.value.code == 2
    assert "super-resolution checkpoint" in capsys.readouterr().err


def test_encoder_embedding_starts_ordinal():
    # Each channel's rows start on a line from row 0 to row 255: equal steps between
    # neighbouring values, so intensities are readable before any training.
    model = superres_model("dmol", "local_1d")
    table = model.encoder.embedding.table.weight.detach().view(3, 256, -1)
    steps = table[:, 1:] - table[:, :-1]
    torch.testing.assert_close(steps, steps[:, :1].expand_as(steps), rtol=0, atol=1e-6)  # built in fp32
    assert torch.all(steps[:, 0].abs().sum(dim=-1) > 0)  # not collapsed to one point
    assert not torch.allclose(table[0], table[1])  # channels keep separate lines


@pytest.mark.parametrize("reading", ["cross_attention", "cell_add"])
def test_the_super_resolution_model_is_the_decoder_composed_with_an_encoder(reading):
    config = tiny_model(head="dmol", attention="local_1d", image_size=8, encoder_layers=1, low_res_size=4,
                        low_res_reading=reading, norm="post").config
    assert type(build_model(config)) is SuperResolutionTransformer
    assert type(build_model(dataclasses.replace(config, superres=None))) is ImageTransformer
    with pytest.raises(ValueError, match="a config without a superres section is a plain decoder"):
        SuperResolutionTransformer(dataclasses.replace(config, superres=None))
    # it holds the decoder whole, under ``decoder.``; the decoder itself knows of no encoder: what
    # its layers read comes as arguments
    decoder = set(build_model(dataclasses.replace(config, superres=None)).state_dict())
    composed = build_model(config)
    assert {f"decoder.{name}" for name in decoder} < set(composed.state_dict())
    assert set(ImageTransformer(config).state_dict()) == decoder
    assert type(composed.decoder) is ImageTransformer and composed.head is composed.decoder.head
    layer = composed.decoder.layers[0]
    assert (layer.cross_attn is not None) == (reading == "cross_attention")
    assert (layer.c_norm is not None) == (reading == "cell_add")  # post-norm: c normalised after its add
    assert (composed.cell_adds is None) == (reading == "cross_attention")
