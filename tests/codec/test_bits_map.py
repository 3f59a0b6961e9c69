"""Bits per pixel (imagetx.codec.bits_map): the model's cost of each pixel, summing to its NLL,
and the picture of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import random_images, tiny_model
from imagetx.codec.bits_map import MAP_SCALE, RAMP, SCALE_BITS, bits_per_pixel, colour, map_picture


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_bits_per_pixel_sum_to_the_nll_where_they_belong(head, attention):
    model = tiny_model(seed=2, head=head, attention=attention)
    images = random_images(3, 4, seed=5)
    bits = bits_per_pixel(model, images)
    assert bits.shape == (3, 4, 4)
    with torch.no_grad():
        expected = (model.nll(images) / math.log(2)).double().numpy()
        per_step = -model.log_prob(images).double() / math.log(2)  # (N, T) in generation order
    assert np.allclose(bits.sum(axis=(1, 2)), expected, rtol=1e-5)
    # each pixel gets its own steps' bits: pixel (r, c) of image 0
    rows, cols = model.order.grid_cell()
    pixel_cols = cols // 3 if head == "categorical" else cols
    for r, c in [(0, 0), (1, 3), (3, 2)]:
        mine = per_step[0][(rows == r) & (pixel_cols == c)].sum().item()
        assert bits[0, r, c] == pytest.approx(mine, rel=1e-5)


def test_colours_and_picture():
    bits = np.array([[0.0, SCALE_BITS], [2 * SCALE_BITS, SCALE_BITS / 2]])
    colours = colour(bits)
    assert (colours[0, 0] == RAMP[0]).all() and (colours[0, 1] == RAMP[-1]).all() and (colours[1, 0] == RAMP[-1]).all()
    assert (colours[1, 1] == RAMP[2]).all()  # the middle of five colours
    picture = map_picture(np.zeros((2, 2, 3), np.uint8), bits)
    assert picture.shape == (2 * MAP_SCALE, 5 * MAP_SCALE, 3) and picture.dtype == np.uint8
