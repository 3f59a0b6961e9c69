"""Relative positions (``ModelConfig.attention.relative_positions``): 2D rotary embeddings ("rotary").

Checked for what they claim (rotary scores depend on the grid offset of query and key only;
decoding turns each step as the full pass does; no parameters, decoder self-attention only),
the cached decoder against the full pass, causality by gradients with a negative control; the
kinds that lost to rotary are refused, naming the commit that reads them. FlexAttention's paths
are in test_flex_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers import random_images, random_labels, tiny_config, tiny_model
from imagetx import build_model
from imagetx.io.older import LAST_COMMIT_WITH_THEM, REMOVED_RELATIVE_POSITIONS
from imagetx.model.patterns import GenerationOrder
from imagetx.model.attention import Rotary2D
from test_causality import build, causality_violations, steps_to_check
from test_sampler import check_cached_equals_full

KINDS = ["rotary"]


@pytest.mark.parametrize("order", [GenerationOrder(4, 6), GenerationOrder(4, 6, (2, 3))], ids=["raster", "blocks"])
def test_rotary_scores_depend_on_the_grid_offset_only(order):
    rotary = Rotary2D(8, order)  # float64 angles: a float64 input is turned exactly
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 1, 8, generator=gen, dtype=torch.float64).expand(1, 1, order.length, 8) for _ in range(2))
    turned_q, turned_k = rotary(q), rotary(k)
    torch.testing.assert_close(turned_q.norm(dim=-1), q.norm(dim=-1), rtol=1e-14, atol=0)  # a rotation
    scores = torch.einsum("bhqe,bhke->qk", turned_q, turned_k)
    rows, cols = order.grid_cell(torch.arange(order.length))
    # each (row, column) offset of a query-key pair as one number
    offsets = (rows[:, None] - rows[None, :]) * (2 * order.cols) + (cols[:, None] - cols[None, :])
    distinct = []
    for offset in offsets.unique():
        same = scores[offsets == offset]
        torch.testing.assert_close(same, same[:1].expand_as(same), rtol=0, atol=1e-13)
        distinct.append(float(same[0]))
    # and the offset shows: different offsets give different scores
    assert len(set(round(score, 4) for score in distinct)) == len(distinct)


def test_rotary_turns_bfloat16_in_float32_and_rounds_once():
    # Mixed precision: the rotation of bf16 queries is the float32 rotation, rounded once at the
    # end, closer to the exact one than turning in bf16 (each product rounded); a float64 model's
    # angles are exact.
    order = GenerationOrder(8, 24)
    rotary = Rotary2D(16, order)
    x = torch.randn(4, order.length, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = rotary(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, rotary(x.float()).bfloat16())
    exact = rotary(x.double())
    cos, sin = rotary.cos.bfloat16(), rotary.sin.bfloat16()  # (T, e/2)
    first, second = x.chunk(2, dim=-1)
    in_bf16 = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    assert (got.double() - exact).abs().mean() < (in_bf16.double() - exact).abs().mean()
    rows, cols = order.grid_cell()
    assert torch.equal(rotary.cos[:, 0], rows.double().cos()) and torch.equal(rotary.sin[:, 4], cols.double().sin())


def test_rotary_turns_the_decoding_step_as_the_full_pass_turns_it():
    order = GenerationOrder(4, 6, (2, 3))
    rotary = Rotary2D(8, order)
    x = torch.randn(3, order.length, 8)
    full = rotary(x)
    for step in (0, 5, order.length - 1):
        torch.testing.assert_close(rotary(x[:, step:step + 1], torch.tensor([step])), full[:, step:step + 1], rtol=0,
                                   atol=0)


def test_rotary_adds_no_parameters_and_only_turns_decoder_self_attention():
    model = tiny_model(relative_positions="rotary", encoder_layers=1, low_res_size=2)
    plain = tiny_model(encoder_layers=1, low_res_size=2)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    layers = model.decoder.layers
    assert all(layer.self_attn.rotary is layers[0].self_attn.rotary for layer in layers)
    assert all(layer.self_attn.rotary is None for layer in model.encoder.layers)


def test_rotary_needs_head_size_divisible_by_4():
    with pytest.raises(ValueError, match=r"relative_positions='rotary' is invalid: needs a head size \(6\) divisible by 4"):
        build_model(tiny_config(d_model=12, n_heads=2, relative_positions="rotary"))


@pytest.mark.parametrize("kind", REMOVED_RELATIVE_POSITIONS)
def test_removed_kinds_are_refused_naming_the_last_commit_that_reads_them(kind):
    with pytest.raises(ValueError, match=rf"relative_positions '{kind}' was removed.*commit {LAST_COMMIT_WITH_THEM}"):
        tiny_config(relative_positions=kind)  # the one-level form, as the files of that time held it


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention,geometry", [
    ("local_1d", dict(query_block_length=8)),
    ("local_2d", dict(query_block_shape=(2, 4), memory_flange=(2, 2))),
    ("full", {}),
])
def test_cached_decoder_matches_full_pass(kind, head, attention, geometry):
    geometry = dict(geometry)
    if head == "dmol" and attention == "local_2d":
        geometry["query_block_shape"] = (2, 2)
    model = tiny_model(seed=3, dtype=torch.float64, head=head, attention=attention, image_size=8, n_layers=2,
                       num_classes=10, relative_positions=kind, **geometry)
    check_cached_equals_full(model, random_images(2, 8, seed=4), random_labels(2, 10, seed=5))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_causal_with_exactly_the_pattern_support(kind, head, attention):
    # Two layers: the support is exactly what two hops of can_attend reach; without the shift
    # (the negative control) the same model leaks.
    model, emb, _ = build(head, attention, n_layers=2, seed=4, relative_positions=kind)
    steps = steps_to_check(model)
    assert causality_violations(model, emb, steps, n_layers=2) == []
    assert any(p.startswith("leak") for p in causality_violations(model, emb, steps, shift=False))


def test_a_saved_model_with_a_removed_kind_is_refused_in_one_line(tmp_path):
    import json

    from imagetx import load_model, save_pretrained
    from imagetx.io.errors import CheckpointError

    save_pretrained(tiny_model(relative_positions="rotary"), tmp_path / "model")
    config = tmp_path / "model" / "config.json"
    values = json.loads(config.read_text())
    values["attention"]["relative_positions"] = "table"
    config.write_text(json.dumps(values))
    with pytest.raises(CheckpointError) as refused:
        load_model(tmp_path / "model")
    line = str(refused.value)
    assert "\n" not in line and "relative_positions 'table'" in line and LAST_COMMIT_WITH_THEM in line
