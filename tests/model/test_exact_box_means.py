"""``superres.exact_box_means`` (imagetx/model/heads.py, cell_remainder.py; docs/model.md §6): each
step's distribution restricted to the values that can still give its cell the input's rounded box
mean, renormalised. The bounds against ``downsample_area`` itself; every restricted distribution
sums to one over its bounds and is zero outside; samples follow it (and clamping does not);
samples downsample to their input exactly; causality and the cached sampler with the bounds are
covered with the cell remainder's (test_cell_remainder.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers import random_images, tiny_model
from imagetx.model.heads import CategoricalHead, DMOLHead
from imagetx.model.superres import downsample_area
from imagetx.model.transformer import previous_values
from imagetx.model.sampler import sample
from test_cell_remainder import HEADS_AND_ORDERS, remainder_model, sequence_images
from test_heads import exact_table_sample, pack, total_variation

LEVELS = 256


def bounded_dmol(logits, means, log_scales, coeffs, lowest, highest,
                 count: int = 1) -> tuple[DMOLHead, torch.Tensor, torch.Tensor]:
    """A K-component head, ``count`` copies of one step's parameters and of its (6,) value bounds."""
    head = DMOLHead(8, len(logits))
    params = pack(logits, means, log_scales, coeffs, dtype=torch.float64)
    return head, params.expand(count, -1), torch.tensor([*lowest, *highest]).expand(count, -1)


def box(lowest, highest) -> torch.Tensor:
    """(N, 3) every pixel value inside the bounds, sorted as total_variation needs them."""
    return torch.tensor(list(itertools.product(*(range(lo, hi + 1) for lo, hi in zip(lowest, highest)))))


# Two coupled components; the means inside the box, far below it (a few hundred scale units:
# only the mirrored inversion keeps the digits), and at the open edges 0 and 255.
BOXES = {
    "inside": ([0.3, -0.2], [[-0.2, -0.15], [-0.1, -0.05], [0.0, 0.05]], -3.5, [95, 110, 120], [104, 117, 127]),
    "far_tail": ([0.0, 0.5], [[-0.9, -0.8], [-0.9, -0.7], [0.9, 0.8]], -6.0, [200, 200, 20], [203, 205, 24]),
    "open_edges": ([0.1, 0.0], [[-1.0, -0.98], [0.5, 0.4], [0.99, 1.0]], -4.0, [0, 120, 250], [5, 125, 255]),
}


def box_case(name: str, count: int = 1) -> tuple[DMOLHead, torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, means, log_scale, lowest, highest = BOXES[name]
    k = len(logits)
    coeffs = torch.tensor([[0.5, -0.3], [0.2, 0.4], [-0.4, 0.3]], dtype=torch.float64)[:, :k]
    head, params, bounds = bounded_dmol(logits, torch.tensor(means, dtype=torch.float64),
                                        torch.full((3, k), log_scale, dtype=torch.float64), coeffs, lowest, highest,
                                        count)
    return head, params, bounds, box(lowest, highest)


@pytest.mark.parametrize("name", BOXES)
def test_a_bounded_dmol_pixel_sums_to_one_over_its_bounds_and_is_zero_outside(name):
    head, params, bounds, cells = box_case(name)
    params, bounds = params.expand(len(cells), -1), bounds.expand(len(cells), -1)
    probs = head.log_prob(params, cells, bounds).exp()
    assert abs(probs.sum().item() - 1.0) < 1e-9
    outside = cells.clone()
    outside[:, 1] = torch.where(cells[:, 1] > 0, cells[:, 1].min() - 1, cells[:, 1].max() + 1)
    assert torch.isneginf(head.log_prob(params, outside, bounds)).all()


def test_a_bounded_categorical_step_sums_to_one_over_its_bounds_and_is_zero_outside():
    head = CategoricalHead(8)
    logits = torch.randn(LEVELS, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    params, bounds = logits.expand(LEVELS, -1), torch.tensor([40, 47]).expand(LEVELS, -1)
    probs = head.log_prob(params, torch.arange(LEVELS), bounds).exp()
    assert abs(probs.sum().item() - 1.0) < 1e-12
    assert (probs[:40] == 0).all() and (probs[48:] == 0).all()
    torch.testing.assert_close(probs[40:48], torch.softmax(logits[40:48], dim=0))
    drawn = head.sample(params[:2000], 1.0, torch.Generator().manual_seed(2), bounds[:2000])
    assert drawn.min() >= 40 and drawn.max() <= 47
    assert head.sample(params[:1], 0.0, bounds=bounds[:1]).item() == 40 + int(logits[40:48].argmax())
    assert torch.equal(head.log_prob(logits[None], torch.arange(1)), torch.log_softmax(logits, 0)[:1])


@pytest.mark.parametrize("name", BOXES)
def test_bounded_dmol_samples_follow_exp_log_prob_and_clamped_ones_do_not(name):
    """The joint of 10^5 samples is as close to the scored table as an exact sampler's (within 3×
    its total variation); drawing without the bounds and clamping into them is not."""
    head, params, bounds, cells = box_case(name)
    probs = head.log_prob(params.expand(len(cells), -1), cells, bounds.expand(len(cells), -1)).double().exp()
    n = 100_000
    floor = sum(total_variation(exact_table_sample(cells, probs, n, seed), cells, probs) for seed in range(5)) / 5
    samples = head.sample(params.expand(n, -1), 1.0, torch.Generator().manual_seed(7), bounds.expand(n, -1))
    assert total_variation(samples, cells, probs) < 3 * floor
    clamped = head.sample(params.expand(n, -1), 1.0, torch.Generator().manual_seed(7))
    clamped = clamped.clamp(cells.min(0).values, cells.max(0).values)
    assert total_variation(clamped, cells, probs) > 3 * floor


@pytest.mark.parametrize("name", BOXES)
def test_bounded_dmol_at_temperature_zero_stays_inside(name):
    head, params, bounds, cells = box_case(name, count=4)
    drawn = head.sample(params, 0.0, bounds=bounds)
    assert (drawn >= cells.min(0).values).all() and (drawn <= cells.max(0).values).all()


def bounded_model(head: str, attention: str, seed: int = 0):
    return remainder_model(head, attention, seed=seed, exact_box_means=True)


@pytest.mark.parametrize("head,attention", HEADS_AND_ORDERS)
def test_bounds_hold_the_true_values_and_at_a_cells_last_step_exactly_those_that_keep_its_mean(head, attention):
    model = bounded_model(head, attention)
    images = random_images(2, 8, seed=5)
    low_res = downsample_area(images, 4)
    targets = model.targets(images)
    _, bounds = model(previous_values(targets), low_res=low_res)  # as decoding's steps: test_cell_remainder
    values = targets[..., None] if head == "categorical" else targets  # (B, T, c)
    c = values.shape[-1]
    lowest, highest = bounds[..., :c].long(), bounds[..., c:].long()
    assert ((lowest <= values) & (values <= highest)).all()
    # At a cell's last step, try every value in the image: the ones that downsample to the
    # input are the bounds' (brute force through downsample_area, nothing shared with the bounds).
    last = (model.cell_remainder.still_to_come == 1).nonzero().flatten()
    for t in last[:: max(1, len(last) // 6)].tolist():
        for channel in range(c):
            keeps = []
            for value in range(LEVELS):
                changed = values.clone()
                changed[:, t, channel] = value
                changed = changed[..., 0] if head == "categorical" else changed
                keeps.append((downsample_area(sequence_images(model, changed), 4) == low_res).flatten(1).all(1))
            keeps = torch.stack(keeps, dim=1)  # (B, 256)
            levels = torch.arange(LEVELS)
            inside = (levels >= lowest[:, t, channel, None]) & (levels <= highest[:, t, channel, None])
            assert torch.equal(keeps, inside), (t, channel)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("head,attention", HEADS_AND_ORDERS)
def test_samples_downsample_to_their_input_exactly(head, attention, temperature):
    low_res = downsample_area(random_images(3, 8, seed=6), 4)
    bounded = sample(bounded_model(head, attention, seed=7), 3, low_res=low_res, temperature=temperature,
                     generator=torch.Generator().manual_seed(8))
    assert torch.equal(downsample_area(bounded, 4), low_res)
    # negative control: the same weights without the bounds miss the input
    free = sample(remainder_model(head, attention, seed=7), 3, low_res=low_res, temperature=temperature,
                  generator=torch.Generator().manual_seed(8))
    assert not torch.equal(downsample_area(free, 4), low_res)


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_an_image_given_another_images_input_has_no_mass_and_training_gradients_are_finite(head):
    model = bounded_model(head, "local_1d").train()
    images = random_images(2, 8, seed=9)
    own = model.bits_per_dim(images, low_res=downsample_area(images, 4))
    assert torch.isfinite(own).all()
    own.mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        other = model.bits_per_dim(images, low_res=downsample_area(images.flip(0), 4))
    assert torch.isposinf(other).all()


def test_exact_box_means_needs_the_cell_sums():
    with pytest.raises(ValueError, match=r"exact_box_means=True is invalid: .*cell_remainder_input: true"):
        tiny_model(encoder_layers=1, low_res_size=2, exact_box_means=True)


def test_a_bounded_model_returns_its_bounds_beside_its_parameters_and_scores_with_them():
    """A bounded model returns the head's parameters (as any model's) and beside them the bounds
    ``forward`` computes (6 integers a pixel); its log-likelihood is its head's given them; the
    same parameters without the bounds score the unrestricted mixture."""
    model = bounded_model("dmol", "local_1d")
    images = random_images(1, 8, seed=1)
    low_res = downsample_area(images, 4)
    targets = model.targets(images)
    params, bounds = model(previous_values(targets), low_res=low_res)
    assert params.shape == (*targets.shape[:2], model.head.size)
    assert bounds.shape == (*targets.shape[:2], 6) and bounds.dtype == torch.long
    torch.testing.assert_close(model.head.log_prob(params, targets, bounds), model.log_prob(images, low_res=low_res))
    free = model.head.log_prob(params, targets)
    restricted = model.head.log_prob(params, targets, bounds)
    assert (free <= restricted + 1e-6).all() and (free < restricted).any()  # renormalised over the bounds
    unbounded = remainder_model("dmol", "local_1d")
    assert unbounded(previous_values(targets), low_res=low_res).shape[-1] == unbounded.head.size


def test_given_rows_that_cannot_fit_the_input_are_refused_and_ones_that_do_are_kept():
    model = bounded_model("dmol", "local_1d", seed=10)
    images, other = random_images(2, 8, seed=11), random_images(2, 8, seed=12)
    low_res = downsample_area(images, 4)
    completed = sample(model, 2, low_res=low_res, prefix=images, given_rows=4,
                       generator=torch.Generator().manual_seed(13))
    assert torch.equal(completed[:, :4], images[:, :4]) and torch.equal(downsample_area(completed, 4), low_res)
    with pytest.raises(ValueError, match="the given rows do not fit low_res"):
        sample(model, 2, low_res=low_res, prefix=other, given_rows=4)
