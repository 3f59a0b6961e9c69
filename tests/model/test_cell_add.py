"""The cell add (imagetx/model/superres.py, ``CellAdd``) and the zero start of the low-res side
(``superres.low_res_zero_start``): what each step reads of the encoder, and that a new
model starts as the same decoder without input, then learns to read it."""

from __future__ import annotations

import pytest
import torch

from helpers import random_images, tiny_model
from imagetx.model.superres import downsample_area
from imagetx.model.scoring import full_pass


def cell_add_model(head: str, **overrides):
    # 8x8 images over a 4x4 input: each low-res pixel covers 2x2 pixels.
    return tiny_model(seed=3, dtype=torch.float64, head=head, image_size=8, encoder_layers=1, low_res_size=4,
                      low_res_reading="cell_add", **overrides)


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_each_step_reads_the_encoding_of_the_low_res_pixel_it_lies_in(head):
    model = cell_add_model(head)
    cell_add = model.cell_adds[0]
    context = torch.randn(1, 48, model.config.d_model, dtype=torch.float64)  # 4x4x3 encoder outputs
    def every_step(encoded):  # every step's reading, from the encoder's output
        return cell_add(cell_add.prepare(encoded), torch.arange(model.order.length))

    base = every_step(context)
    steps_per_row = 8 * 3 if head == "categorical" else 8
    for low_row, low_col in [(0, 0), (1, 2), (3, 3)]:
        moved = context.clone()
        pixel = low_row * 4 + low_col
        moved[:, 3 * pixel:3 * pixel + 3] += 1.0  # its R, G and B sub-pixels, adjacent in the encoder
        changed = (every_step(moved) - base).abs().sum(dim=(0, 2)) > 0  # (T,)
        # Written out independently of the model's step bookkeeping: raster steps, 2x2 pixels a cell.
        steps = torch.arange(changed.numel())
        rows, cols = steps // steps_per_row, steps % steps_per_row
        cols = cols // 3 if head == "categorical" else cols
        expected = (rows // 2 == low_row) & (cols // 2 == low_col)
        assert torch.equal(changed, expected)


@pytest.mark.parametrize("reading", ["cross_attention", "cell_add"])
def test_a_zero_start_model_ignores_its_input_until_it_learns_to_read_it(reading):
    model = tiny_model(seed=5, head="dmol", image_size=8, encoder_layers=1, low_res_size=4, low_res_reading=reading,
                       cell_remainder_input=True, low_res_zero_start=True)
    images = random_images(2, 8, seed=6)
    own, other = downsample_area(images, 4), downsample_area(random_images(2, 8, seed=7), 4)
    assert model.low_res_writers() and all(not linear.weight.any() for linear in model.low_res_writers())
    with torch.no_grad():
        torch.testing.assert_close(full_pass(model, images, low_res=own), full_pass(model, images, low_res=other),
                                   rtol=0, atol=0)
    # The writers still get gradients: one step of plain gradient descent makes the input count.
    loss = model.bits_per_dim(images, low_res=own).mean()
    loss.backward()
    assert all(linear.weight.grad.abs().sum() > 0 for linear in model.low_res_writers())
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.grad is not None:
                parameter -= 0.1 * parameter.grad
        assert not torch.allclose(full_pass(model, images, low_res=own), full_pass(model, images, low_res=other))


def test_without_the_zero_start_the_input_counts_from_the_first_step():
    # The negative control of the test above: the same model with the default initialisation.
    model = tiny_model(seed=5, head="dmol", image_size=8, encoder_layers=1, low_res_size=4, low_res_reading="cell_add",
                       cell_remainder_input=True)
    images = random_images(2, 8, seed=6)
    own, other = downsample_area(images, 4), downsample_area(random_images(2, 8, seed=7), 4)
    with torch.no_grad():
        assert not torch.allclose(full_pass(model, images, low_res=own), full_pass(model, images, low_res=other))
