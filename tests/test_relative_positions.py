"""The kinds of relative positions (``ModelConfig.relative_positions``) besides the learned
table (test_position_bias.py): the fixed distance bias ("distance") and 2D rotary embeddings
("rotary"), alone and together ("rotary_distance").

Each is checked where the table is: the fast paths against the dense reference, the cached
decoder against the full pass, causality by gradients with a negative control; and for what
it claims of its own: rotary scores depend on the grid offset of query and key only, the fixed
bias is the table's prior and holds nothing to learn. FlexAttention's paths are in
test_flex_attention.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers import dense_attention, random_images, random_labels, tiny_config, tiny_model
from imagetx import ImageTransformer
from imagetx.model.kernels import attend
from imagetx.model.order import GenerationOrder

from imagetx.model.position_bias import RelativePositionBias, distance_prior
from imagetx.model.rotary import Rotary2D
from test_causality import build, causality_violations, steps_to_check
from test_position_bias import HEADS, patterns_with_grids
from test_sampler import check_cached_equals_full

KINDS = ["distance", "rotary", "rotary_distance"]


@pytest.mark.parametrize("order", [GenerationOrder(4, 6), GenerationOrder(4, 6, (2, 3))], ids=["raster", "blocks"])
def test_rotary_scores_depend_on_the_grid_offset_only(order):
    rotary = Rotary2D(8, order)  # float64 angles: a float64 input is turned exactly
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 8, generator=gen, dtype=torch.float64).expand(order.length, 1, 8) for _ in range(2))
    turned_q, turned_k = rotary(q), rotary(k)
    torch.testing.assert_close(turned_q.norm(dim=-1), q.norm(dim=-1), rtol=1e-14, atol=0)  # a rotation
    scores = torch.einsum("qne,kne->qk", turned_q, turned_k)
    steps = torch.arange(order.length)
    offsets = order.relative_offsets(steps[:, None], steps[None, :])
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
    x = torch.randn(order.length, 4, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = rotary(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, rotary(x.float()).bfloat16())
    exact = rotary(x.double())
    cos, sin = (rotary.cos.bfloat16()[:, None], rotary.sin.bfloat16()[:, None])
    first, second = x.chunk(2, dim=-1)
    in_bf16 = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    assert (got.double() - exact).abs().mean() < (in_bf16.double() - exact).abs().mean()
    rows, cols = order.grid_cell()
    assert torch.equal(rotary.cos[:, 0], rows.double().cos()) and torch.equal(rotary.sin[:, 4], cols.double().sin())


def test_rotary_turns_the_decoding_step_as_the_full_pass_turns_it():
    order = GenerationOrder(4, 6, (2, 3))
    rotary = Rotary2D(8, order)
    x = torch.randn(order.length, 3, 8)
    full = rotary(x)
    for step in (0, 5, order.length - 1):
        torch.testing.assert_close(rotary(x[step:step + 1], torch.tensor([step])), full[step:step + 1], rtol=0, atol=0)


def test_fixed_distance_bias_is_the_prior_and_learns_nothing():
    model = tiny_model(relative_positions="distance", n_heads=2)
    table_model = tiny_model(relative_positions="table", n_heads=2)
    bias = model.layers[0].self_attn.position_bias
    assert not bias.learned and not bias.table.requires_grad
    torch.testing.assert_close(bias.table, distance_prior(2, *model.config.grid_shape), rtol=0, atol=0)
    torch.testing.assert_close(bias.table, table_model.layers[0].self_attn.position_bias.table.detach(), rtol=0, atol=0)
    assert not any("position_bias" in name for name in model.state_dict())
    plain = tiny_model(n_heads=2)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())


def test_rotary_adds_no_parameters_and_only_turns_decoder_self_attention():
    model = tiny_model(relative_positions="rotary", encoder_layers=1, low_res_size=2)
    plain = tiny_model(encoder_layers=1, low_res_size=2)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert all(layer.self_attn.rotary is model.layers[0].self_attn.rotary for layer in model.layers)
    assert all(layer.self_attn.rotary is None for layer in model.encoder.layers)
    assert all(layer.self_attn.position_bias is None for layer in model.layers)


def test_rotary_needs_head_size_divisible_by_4():
    with pytest.raises(ValueError, match=r"relative_positions='rotary' is invalid: needs a head size .* = 6\) divisible"):
        ImageTransformer(tiny_config(d_model=12, n_heads=2, relative_positions="rotary"))


@pytest.mark.parametrize("pattern,order", patterns_with_grids(), ids=lambda p: getattr(p, "describe", lambda: "")())
def test_fixed_bias_fast_path_equals_dense_reference(pattern, order):
    bias = RelativePositionBias(HEADS, order.rows, order.cols, learned=False).double()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(pattern.length, 3 * HEADS, 4, generator=gen, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    steps = torch.arange(pattern.length)

    def run(fn):
        out = fn(q, k, v)
        proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
        return out, torch.autograd.grad((out * proj).sum(), (q, k, v))

    fast, fast_grads = run(lambda a, b, c: attend(a, b, c, pattern, "sdpa", bias))
    dense_bias = bias(order.relative_offsets(steps[:, None], steps[None, :]))
    ref, ref_grads = run(lambda a, b, c: dense_attention(a, b, c, pattern.can_attend(), dense_bias))
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    for name, got, want in zip("qkv", fast_grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=lambda m: f"grad {name}: {m}")
    assert not torch.allclose(attend(q, k, v, pattern, "sdpa"), fast)  # the bias matters


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
