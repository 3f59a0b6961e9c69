"""Relative position biases (``relative_positions`` "table", "distance"): the table lookup, every fast path
against the dense reference with the bias added, and the cached decoder against the full pass.
Causality with the bias is checked by gradients in test_causality.py."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import dense_attention, random_images, random_labels, tiny_model
from imagetx.model.kernels import attend
from imagetx.model.order import GenerationOrder
from imagetx.model.patterns import FullCausal, Local1D, Local2D
from imagetx.model.position_bias import RelativePositionBias
from test_sampler import cached_params

HEADS = 2


def loop_bias(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """(h, T, T) bias by loops: table[h, row offset + R − 1, col offset + C − 1]."""
    n_rows, n_cols = int(rows.max()) + 1, int(cols.max()) + 1
    grid = table.view(table.shape[0], 2 * n_rows - 1, 2 * n_cols - 1)
    length = rows.numel()
    out = torch.empty(table.shape[0], length, length, dtype=table.dtype)
    for q in range(length):
        for k in range(length):
            out[:, q, k] = grid[:, rows[q] - rows[k] + n_rows - 1, cols[q] - cols[k] + n_cols - 1]
    return out


def random_bias(order: GenerationOrder, seed: int = 0) -> RelativePositionBias:
    bias = RelativePositionBias(HEADS, order.rows, order.cols).double()
    with torch.no_grad():  # random, so that a wrong offset anywhere shows
        bias.table.copy_(torch.randn(bias.table.shape, generator=torch.Generator().manual_seed(seed)))
    return bias


def test_lookup_equals_loops_and_starts_from_the_distance_prior():
    order = GenerationOrder(3, 5, (1, 5))
    rows, cols = order.grid_cell()
    bias = RelativePositionBias(4, order.rows, order.cols)
    steps = torch.arange(15)
    dense = bias(order.relative_offsets(steps[:, None], steps[None, :]))
    assert torch.equal(dense, loop_bias(bias.table.detach(), rows, cols))
    # The prior: 0 at offset (0, 0), −slope·distance elsewhere, slopes 1, 1/2, 1/4, 1/8.
    distance = ((rows[:, None] - rows[None, :]) ** 2 + (cols[:, None] - cols[None, :]) ** 2).double().sqrt()
    for head in range(4):
        torch.testing.assert_close(dense[head].double(), -(2.0**-head) * distance, rtol=0, atol=1e-6)


def patterns_with_grids():
    """(pattern, its generation order): raster grids for 1D and full, block-raster for 2D."""
    cases = []
    for rows, cols, block, memory in [(4, 6, 6, 1), (4, 6, 4, 1), (5, 3, 4, 2), (4, 6, 5, 1)]:  # lq ∤ width, padding
        order = GenerationOrder(rows, cols)
        cases.append((Local1D(order, block, memory), order))
    for rows, cols, block, flange in [(4, 6, (2, 3), (1, 2)), (6, 6, (2, 3), (4, 1)), (4, 4, (2, 2), (0, 0))]:
        order = GenerationOrder(rows, cols, block)
        cases.append((Local2D(order, flange), order))
    order = GenerationOrder(3, 4)
    cases.append((FullCausal(order), order))
    return cases


@pytest.mark.parametrize("pattern,order", patterns_with_grids(), ids=lambda p: getattr(p, "describe", lambda: "")())
def test_fast_path_with_bias_equals_dense_reference(pattern, order):
    bias = random_bias(order)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(pattern.length, 3 * HEADS, 4, generator=gen, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    steps = torch.arange(pattern.length)
    can_attend = pattern.can_attend()

    def run(fn):
        out = fn(q, k, v)
        proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
        return out, torch.autograd.grad((out * proj).sum(), (q, k, v, bias.table))

    fast, fast_grads = run(lambda a, b, c: attend(a, b, c, pattern, "sdpa", bias))
    dense_bias = bias(order.relative_offsets(steps[:, None], steps[None, :]))
    ref, ref_grads = run(lambda a, b, c: dense_attention(a, b, c, can_attend, dense_bias))
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    for name, got, want in zip(["q", "k", "v", "table"], fast_grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=lambda m: f"grad {name}: {m}")
    # The bias matters: without it the output differs.
    assert not torch.allclose(attend(q, k, v, pattern, "sdpa"), fast)


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention,geometry", [
    ("local_1d", dict(query_block_length=8)),   # 8 ∤ 24 sub-pixel columns: windows differ
    ("local_2d", dict(query_block_shape=(2, 4), memory_flange=(2, 2))),
    ("full", {}),
])
def test_cached_decoder_with_bias_matches_full_pass(head, attention, geometry):
    geometry = dict(geometry)
    if head == "dmol" and attention == "local_2d":
        geometry["query_block_shape"] = (2, 2)
    model = tiny_model(seed=3, dtype=torch.float64, head=head, attention=attention, image_size=8, n_layers=2,
                       num_classes=10, relative_positions="table", **geometry)
    for layer in model.layers:  # away from the prior, so every offset's entry differs
        with torch.no_grad():
            layer.self_attn.position_bias.table.add_(torch.randn_like(layer.self_attn.position_bias.table))
    images, labels = random_images(2, 8, seed=4), random_labels(2, 10, seed=5)
    with torch.no_grad():
        full = model(images, labels)
        cached = cached_params(model, images, labels)
    torch.testing.assert_close(cached, full, rtol=1e-9, atol=1e-9)


def test_off_by_default_and_only_in_decoder_self_attention():
    plain = tiny_model(encoder_layers=1, low_res_size=2)
    assert all(layer.self_attn.position_bias is None for layer in plain.layers)
    biased = tiny_model(encoder_layers=1, low_res_size=2, relative_positions="table")
    assert all(layer.self_attn.position_bias is not None for layer in biased.layers)
    assert all(layer.self_attn.position_bias is None for layer in biased.encoder.layers)
    assert not hasattr(biased.layers[0].cross_attn, "position_bias")
    extra = sum(p.numel() for p in biased.parameters()) - sum(p.numel() for p in plain.parameters())
    rows, cols = biased.config.grid_shape
    assert extra == biased.config.n_layers * biased.config.n_heads * (2 * rows - 1) * (2 * cols - 1)
    images = random_images(1, 4)
    assert math.isfinite(float(biased.bits_per_dim(images, low_res=random_images(1, 2)).sum().detach()))
