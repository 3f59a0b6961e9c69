"""imagetx.sampler: the cached decoder equals the full pass; sampling behaviour (docs/model.md §6, §7)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from helpers import random_images, random_labels, tiny_model
from imagetx.data import downsample_area
from imagetx import ImageTransformer, ModelConfig
from imagetx.sampler import sample, sample_uncached

REPO = Path(__file__).resolve().parents[1]

# Image size 8: the categorical grid is 8x24 (192 steps), the DMOL grid 8x8 (64 steps).
# Small blocks make locality and the ring buffer matter: 1D blocks of 16 steps, 2D blocks
# of (4, 8) / (4, 4) cells with a (2, 4) flange.
SMALL_BLOCKS = dict(image_size=8, query_block_length=16, memory_flange=(2, 4), n_layers=2, d_model=16)


def block_shape(head):
    return (4, 8) if head == "categorical" else (4, 4)


def cached_params(model, images, labels=None, low_res=None):
    """Teacher-force ``images`` through ``decode_step``: (B, T, P) parameters."""
    cache = model.start_decoding(images.shape[0], labels, low_res)
    targets = model.targets(images)
    params = [model.decode_step(None, cache)]
    for t in range(1, model.order.length):
        params.append(model.decode_step(targets[:, t - 1], cache))
    assert int(cache.step) == model.order.length  # one counter, advanced once per step
    return torch.stack(params, dim=1)


def check_cached_equals_full(model, images, labels=None, low_res=None):
    with torch.no_grad():
        full = model(images, labels, low_res)
        cached = cached_params(model, images, labels, low_res)
        targets = model.targets(images)
        assert cached.shape == full.shape
        torch.testing.assert_close(cached, full, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(model.head.log_prob(cached, targets), model.log_prob(images, labels, low_res),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_classes", [0, 10])
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_cached_decoder_matches_full_pass(attention, head, num_classes):
    model = tiny_model(seed=1, dtype=torch.float64, head=head, attention=attention, num_classes=num_classes,
                       query_block_shape=block_shape(head), **SMALL_BLOCKS)
    images = random_images(2, 8, seed=2)
    labels = random_labels(2, 10, seed=3) if num_classes else None
    check_cached_equals_full(model, images, labels)


def test_ring_buffer_is_shorter_than_the_sequence():
    # The point of the cache: 1D local attention keeps only (memory + own block) keys.
    model = tiny_model(head="categorical", attention="local_1d", **SMALL_BLOCKS)
    cache = model.start_decoding(1)
    assert all(layer.self_attn.index.ring == 32 for layer in cache.layers)
    assert 32 < model.order.length == 192
    assert all(layer.self_attn.step is cache.step for layer in cache.layers)  # one step counter


@pytest.mark.parametrize("head,attention,radius", [("categorical", "local_2d", None), ("dmol", "local_1d", None),
                                                   ("categorical", "local_1d", 0), ("dmol", "local_2d", 1)])
def test_cached_decoder_matches_full_pass_with_encoder(head, attention, radius):
    # low_res_size 4 with radius 0 or 1: each step's cross-attention sees part of the 4x4 input
    model = tiny_model(seed=4, dtype=torch.float64, head=head, attention=attention, num_classes=10,
                       encoder_layers=1, low_res_size=2 if radius is None else 4, cross_attention_radius=radius,
                       query_block_shape=block_shape(head), **{**SMALL_BLOCKS, "n_layers": 1})
    images = random_images(2, 8, seed=5)
    low_res = downsample_area(random_images(2, 8, seed=6), model.config.low_res_size)  # not the images' own
    check_cached_equals_full(model, images, random_labels(2, 10, seed=7), low_res)


def test_cached_decoder_matches_full_pass_pre_norm():
    model = tiny_model(seed=8, dtype=torch.float64, head="dmol", attention="local_2d", norm="pre",
                       query_block_shape=(4, 4), **SMALL_BLOCKS)
    check_cached_equals_full(model, random_images(2, 8, seed=9))


# ----- sampling ------------------------------------------------------------------------------

@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_sample_is_reproducible_with_a_seed(head):
    model = tiny_model(seed=10, head=head)
    a = sample(model, 3, generator=torch.Generator().manual_seed(5))
    b = sample(model, 3, generator=torch.Generator().manual_seed(5))
    c = sample(model, 3, generator=torch.Generator().manual_seed(6))
    assert a.dtype == torch.uint8 and a.shape == (3, 4, 4, 3)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_class_conditional_and_superres_shapes():
    model = tiny_model(seed=11, num_classes=3, encoder_layers=1, low_res_size=2)
    low_res = downsample_area(random_images(2, 4, seed=1), 2)
    out = sample(model, 2, torch.tensor([0, 2]), low_res, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 4, 4, 3) and out.dtype == torch.uint8


@pytest.mark.parametrize("head,attention,rows", [("categorical", "local_1d", 2), ("dmol", "local_1d", 3),
                                                 ("categorical", "local_2d", 2), ("dmol", "local_2d", 2)])
def test_completion_keeps_the_given_rows(head, attention, rows):
    model = tiny_model(seed=12, head=head, attention=attention)
    prefix = random_images(3, 4, seed=13)
    out = sample(model, 3, prefix=prefix, given_rows=rows, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out[:, :rows], prefix[:, :rows])
    assert not torch.equal(out[:, rows:], prefix[:, rows:])  # the rest is sampled, not copied
    # all rows given: the prefix comes back whole
    full = sample(model, 3, prefix=prefix, given_rows=4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(full, prefix)


@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_temperature_zero_takes_the_argmax_at_every_step(attention):
    model = tiny_model(seed=14, attention=attention, dtype=torch.float64)
    images = sample(model, 2, temperature=0.0)
    with torch.no_grad():
        logits = model(images)  # by causality, step t's logits depend only on steps < t
    assert torch.equal(model.targets(images), logits.argmax(-1))
    assert torch.equal(images, sample(model, 2, temperature=0.0, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_uncached_sampler_gives_the_same_images(head):
    # Both samplers draw the same random numbers in the same order (one head.sample call of
    # shape (B, 1, P) per step), and their parameters agree to float64 rounding.
    model = tiny_model(seed=15, head=head, dtype=torch.float64)
    cached = sample(model, 2, generator=torch.Generator().manual_seed(7))
    uncached = sample_uncached(model, 2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(cached, uncached)


def test_bad_sampling_requests():
    model = tiny_model()
    conditional = tiny_model(num_classes=3)
    with pytest.raises(ValueError, match="at least 1"):
        sample(model, 0)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, 1, temperature=-0.5)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, 1, temperature=float("nan"))
    with pytest.raises(ValueError, match="unconditional"):
        sample(model, 1, labels=torch.tensor([0]))
    with pytest.raises(ValueError, match="class-conditional"):
        sample(conditional, 1)
    with pytest.raises(ValueError, match="labels"):
        sample(conditional, 2, labels=torch.tensor([0, 3]))
    prefix = random_images(1, 4)
    for rows in (-1, 5):
        with pytest.raises(ValueError, match="given_rows"):
            sample(model, 1, prefix=prefix, given_rows=rows)
    with pytest.raises(ValueError, match="prefix"):
        sample(model, 1, given_rows=2)  # completion without the images to complete
    # 2D blocks two rows high: one given row would not come first in generation order
    with pytest.raises(ValueError, match="whole number of block rows"):
        sample(tiny_model(attention="local_2d"), 1, prefix=prefix, given_rows=1)
    with pytest.raises(ValueError):
        sample_uncached(model, 0)


def test_model_trained_on_one_constant_image_generates_it():
    torch.manual_seed(0)
    model = tiny_model(seed=16, image_size=4, head="categorical", d_model=32, d_filter=64).train()
    target = torch.tensor([200, 30, 90], dtype=torch.uint8).expand(1, 4, 4, 3).contiguous()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(600):
        nll = model.nll(target).mean()
        optimizer.zero_grad()
        nll.backward()
        optimizer.step()
        if nll.item() < 0.008:  # p(image) = exp(-nll) > 0.992
            break
    model.eval()
    with torch.no_grad():
        log_p = model.log_prob(target)[0]
    # Every step's probability of the right value is > 0.999, and the whole image's
    # probability exp(-nll) > 0.99: a temperature-1 sample is the image itself except with
    # probability < 1 %, and with the fixed seed the outcome is deterministic.
    assert log_p.exp().min() > 0.999, log_p.exp().min()
    assert log_p.sum().exp() > 0.99
    generated = sample(model, 4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(generated, target.expand(4, -1, -1, -1))


def largest_allocation(fn) -> int:
    """Bytes of the largest single allocation made by one operation while ``fn()`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(event.cpu_memory_usage for event in prof.events())


def test_starting_to_decode_the_imagenet64_preset_builds_nothing_of_size_t_squared():
    # 12,288 steps: a dense (T, T) bool mask alone would be 151 MB. Decoding reads the ring
    # from the pattern's blocks instead; the dense reference itself is the negative control.
    with open(REPO / "configs" / "imagenet64.yaml") as handle:
        config = ModelConfig.from_dict(yaml.safe_load(handle)["model"]["config"])
    model = ImageTransformer(config).eval()
    t_squared = model.order.length ** 2
    assert largest_allocation(lambda: model.start_decoding(1)) < t_squared // 16
    assert largest_allocation(model.pattern.can_attend) >= t_squared


@pytest.mark.parametrize("sampler", [sample, sample_uncached])
def test_samplers_run_in_eval_mode_and_restore_the_callers_mode(sampler):
    # With dropout, a model left in train mode would sample from a different distribution.
    model = tiny_model(seed=17, dropout=0.3)
    expected = sampler(model, 2, generator=torch.Generator().manual_seed(4))  # tiny_model: eval mode
    model.train()
    got = sampler(model, 2, generator=torch.Generator().manual_seed(4))
    assert model.training
    assert torch.equal(got, expected)
