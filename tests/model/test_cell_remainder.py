"""The cell remainder input (imagetx/model/cell_remainder.py, docs/model.md §6): what it computes, written
out by brute force; that it reads no value at or after its step (perturbation, in the real
generation order); that the cached sampler reproduces it."""

from __future__ import annotations

import pytest
import torch

from helpers import random_images, tiny_model
from imagetx.model.superres import downsample_area
from imagetx.model.transformer import previous_values
from imagetx.model.heads import params_and_bounds
from imagetx.model.scoring import full_pass
from test_sampler import SMALL_BLOCKS, block_shape, check_cached_equals_full

HEADS_AND_ORDERS = [("categorical", "local_1d"), ("dmol", "local_1d"), ("categorical", "local_2d"),
                    ("dmol", "local_2d")]


def remainder_model(head: str, attention: str, seed: int = 0, **overrides):
    values = dict(SMALL_BLOCKS, query_block_shape=block_shape(head), encoder_layers=1, low_res_size=4,
                  low_res_reading="cell_add", cell_remainder_input=True)
    values.update(overrides)
    return tiny_model(seed=seed, dtype=torch.float64, head=head, attention=attention, **values)


def brute_force_remainder_means(model, images, low_res):
    """(B, T, c): for each step, (N·low-res value − sum of the values of its cell and channel
    generated before it) / (count still to come), from grid coordinates and a plain loop."""
    rows, cols = model.order.grid_cell()
    categorical = model.config.head == "categorical"
    scale = model.config.image_size // model.config.superres.low_res_size
    n = scale * scale
    out = torch.zeros(images.shape[0], rows.numel(), 1 if categorical else 3, dtype=torch.float64)
    for t in range(rows.numel()):
        pixel_row = int(rows[t])
        pixel_col = int(cols[t]) // 3 if categorical else int(cols[t])
        channels = [int(cols[t]) % 3] if categorical else [0, 1, 2]
        earlier_sum, earlier = torch.zeros(images.shape[0], len(channels), dtype=torch.float64), 0
        for s in range(t):
            r, c = int(rows[s]), int(cols[s]) // 3 if categorical else int(cols[s])
            same_channel = not categorical or int(cols[s]) % 3 == channels[0]
            if (r // scale, c // scale) == (pixel_row // scale, pixel_col // scale) and same_channel:
                earlier_sum += images[:, r, c, channels].double()
                earlier += 1
        low = low_res[:, pixel_row // scale, pixel_col // scale, channels].double()
        out[:, t] = (n * low - earlier_sum) / (n - earlier)
    return out


@pytest.mark.parametrize("head,attention", HEADS_AND_ORDERS)
def test_remainder_mean_equals_the_brute_force_sum(head, attention):
    model = remainder_model(head, attention)
    images = random_images(2, 8, seed=1)
    low_res = downsample_area(images, 4)
    remainder = model.cell_remainder
    steps = torch.arange(model.order.length)
    features = remainder.features(*remainder.cell_state(previous_values(model.targets(images)), steps, low_res))
    expected = brute_force_remainder_means(model, images, low_res)
    means = (features[..., :-1] + 1.0) * 127.5
    torch.testing.assert_close(means, expected)
    # The last step of each cell is left with its own value, to within the rounding of the mean.
    last = remainder.still_to_come == 1
    own = model.targets(images).double()
    own = own[..., None] if head == "categorical" else own
    assert (means[:, last] - own[:, last]).abs().max() <= 8.0


@pytest.mark.parametrize("bounded", [False, True], ids=["", "exact_box_means"])
@pytest.mark.parametrize("head,attention", HEADS_AND_ORDERS)
def test_remainder_reads_nothing_at_or_after_its_step(head, attention, bounded):
    # Change every value from step t on: the parameters of steps 0..t must not move (the
    # remainder is built from raw values, so a gradient through embeddings would miss a leak;
    # with exact_box_means the steps' value bounds too, built from the same sums).
    model = remainder_model(head, attention, exact_box_means=bounded)
    images, low_res = random_images(2, 8, seed=1), random_images(2, 4, seed=2)
    base, base_bounds = params_and_bounds(full_pass(model, images, None, low_res))
    targets = model.targets(images)
    length = targets.shape[1]
    for t in sorted({1, length // 3, length // 2, length - 2}):
        changed = targets.clone()
        changed[:, t:] = (changed[:, t:] + 77) % 256
        other, bounds = params_and_bounds(full_pass(model, sequence_images(model, changed), None, low_res))
        torch.testing.assert_close(other[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-12)
        assert (bounds is None) == (not bounded)
        assert bounds is None or torch.equal(bounds[:, : t + 1], base_bounds[:, : t + 1])
        assert not torch.allclose(other[:, t + 1 :], base[:, t + 1 :]), "negative control: later steps must move"


def sequence_images(model, sequence):
    return model.images(sequence).to(torch.uint8)


@pytest.mark.parametrize("bounded", [False, True], ids=["", "exact_box_means"])
@pytest.mark.parametrize("head,attention", HEADS_AND_ORDERS)
def test_cached_decoder_matches_full_pass_with_remainder(head, attention, bounded):
    model = remainder_model(head, attention, seed=3, exact_box_means=bounded)
    images = random_images(2, 8, seed=4)
    check_cached_equals_full(model, images, None, downsample_area(images, 4))


def test_cell_remainder_input_needs_a_low_res_input():
    with pytest.raises(ValueError, match="cell_remainder_input.*encoder_layers"):
        tiny_model(cell_remainder_input=True)

