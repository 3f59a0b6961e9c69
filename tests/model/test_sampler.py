"""imagetx.model.sampler: the cached decoder, eager and compiled, equals the full pass; no host read per
step; sampling behaviour (docs/model.md §6, §7)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helpers import decoder_of, random_images, random_labels, tiny_model
from imagetx.model.superres import downsample_area
from imagetx.model.heads import params_and_bounds
from imagetx.model.transformer import previous_values
from imagetx import build_model
from imagetx.model.sampler import (ISOLATED, LOG_PROGRESS_SECONDS, compile_decoding, first_input, progress_bar, sample,
                                   sample_progressively)
from imagetx.model.scoring import full_pass
from imagetx.training.presets import preset_model_config
from scripts.common import sample_uncached

REPO = Path(__file__).resolve().parents[2]

# Image size 8: the categorical grid is 8x24 (192 steps), the DMOL grid 8x8 (64 steps).
# Small blocks make locality and the ring buffer matter: 1D blocks of 16 steps, 2D blocks
# of (4, 8) / (4, 4) cells with a (2, 4) flange.
SMALL_BLOCKS = dict(image_size=8, query_block_length=16, memory_flange=(2, 4), n_layers=2, d_model=16)


def block_shape(head):
    return (4, 8) if head == "categorical" else (4, 4)


def counter(cache) -> int:
    return int(getattr(cache, "decoder", cache).step)


def each(outputs, f):
    """``f`` applied to a model's outputs: its parameters, and with exact_box_means its value bounds."""
    return tuple(map(f, outputs)) if isinstance(outputs, tuple) else f(outputs)


def joined(outputs: list, join):
    """A list of a model's outputs (tensors, or (params, bounds) pairs) joined part by part."""
    return tuple(map(join, zip(*outputs))) if isinstance(outputs[0], tuple) else join(outputs)


def cached_params(model, images, labels=None, low_res=None, step=None, transforms=None):
    """Teacher-force ``images`` through ``step`` (``model.decode_step`` by default): (B, T, P)
    parameters (with exact_box_means, and (B, T, 2c) each step's value bounds)."""
    step = step or model.decode_step
    cache = model.start_decoding(images.shape[0], labels, low_res=low_res, transforms=transforms)
    targets = model.targets(images)
    params = [step(first_input(model, images.shape[0]), cache)]
    for t in range(1, model.order.length):
        params.append(step(targets[:, t - 1], cache))
    assert counter(cache) == model.order.length  # one counter, advanced once per step
    return joined(params, lambda parts: torch.stack(parts, dim=1))


def full_params(model, images, labels=None, low_res=None, transforms=None):
    """The full pass's (B, T, P) parameters."""
    given = model.conditioning(len(images), labels, low_res=low_res, transforms=transforms)
    return model(previous_values(model.targets(images)), **given)


def prefilled_params(model, images, given, labels=None, low_res=None, step=None, transforms=None):
    """Teacher-force the first ``given`` steps of ``images`` in one ``prefill``, the rest through
    ``step`` (``model.decode_step`` by default): (B, T, P) parameters."""
    step = step or model.decode_step
    cache = model.start_decoding(images.shape[0], labels, low_res=low_res, transforms=transforms)
    targets = model.targets(images)
    params = [model.prefill(targets[:, :given], cache)]
    assert counter(cache) == given
    for t in range(given, model.order.length):
        params.append(each(step(targets[:, t - 1], cache), lambda part: part[:, None]))
    assert counter(cache) == model.order.length
    return joined(params, lambda parts: torch.cat(parts, dim=1))


def prefill_lengths(model) -> list[int]:
    """Prefills to check (none, step by step, is ``cached_params``): one step; a query block's length
    and either side of it; an image row (2D: a row of blocks); half the image, a completion's given
    rows; all steps but the last; every step."""
    length, block = model.order.length, decoder_of(model).pattern.block_length
    attention = model.config.attention
    row = int(model.given_steps(attention.query_block_shape[0] if attention.kind == "local_2d" else 1).sum())
    half_image = int(model.given_steps(model.config.image_size // 2).sum())
    return sorted({n for n in (1, block - 1, block, block + 1, row, half_image, length - 1, length) if 0 < n <= length})


def check_cached_equals_full(model, images, labels=None, low_res=None, step=None, transforms=None):
    """The cached decoder, step by step and after a prefill of each of ``prefill_lengths``,
    gives the full pass's parameters (``transforms``: each image's transform id, for a model with them)."""
    with torch.no_grad():
        full, bounds = params_and_bounds(full_params(model, images, labels, low_res, transforms))
        cached, cached_bounds = params_and_bounds(cached_params(model, images, labels, low_res, step, transforms))
        targets = model.targets(images)
        assert cached.shape == full.shape
        tolerance = {"rtol": 0, "atol": 1e-12} if full.dtype == torch.float64 else {"rtol": 1e-9, "atol": 1e-9}
        torch.testing.assert_close(cached, full, **tolerance)
        assert (cached_bounds is None) == (bounds is None) and (bounds is None or torch.equal(cached_bounds, bounds))
        given = {} if low_res is None else {"low_res": low_res}
        torch.testing.assert_close(model.head.log_prob(cached, targets, cached_bounds),
                                   model.log_prob(images, labels, **given, transforms=transforms), rtol=1e-6, atol=1e-6)
        for given in prefill_lengths(model):
            prefilled, prefilled_bounds = params_and_bounds(
                prefilled_params(model, images, given, labels, low_res, step, transforms))
            torch.testing.assert_close(prefilled, full, **tolerance, msg=lambda m: f"prefill {given}: {m}")
            assert bounds is None or torch.equal(prefilled_bounds, bounds)


# Conditioning: none, a class, a class and a transform (distribution augmentation, 48 ids), each image its own.
CONDITIONING = {"unconditional": (0, 0), "classes": (10, 0), "classes+transforms": (10, 48)}


@pytest.mark.parametrize("conditioning", CONDITIONING)
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_cached_decoder_matches_full_pass(attention, head, conditioning):
    num_classes, num_transforms = CONDITIONING[conditioning]
    model = tiny_model(seed=1, dtype=torch.float64, head=head, attention=attention, num_classes=num_classes,
                       num_transforms=num_transforms, query_block_shape=block_shape(head), **SMALL_BLOCKS)
    images = random_images(2, 8, seed=2)
    labels = random_labels(2, 10, seed=3) if num_classes else None
    transforms = random_labels(2, num_transforms, seed=4) if num_transforms else None
    check_cached_equals_full(model, images, labels, transforms=transforms)


def test_cached_decoder_matches_full_pass_2d_rotary():
    # a prefill longer than a query block runs in pieces: each turned by its own steps, as the full pass turns them
    model = tiny_model(seed=24, dtype=torch.float64, head="categorical", attention="local_2d",
                       relative_positions="rotary", query_block_shape=block_shape("categorical"), **SMALL_BLOCKS)
    check_cached_equals_full(model, random_images(2, 8, seed=25))


def test_kv_cache_is_shorter_than_the_sequence():
    # The point of the cache: 1D local attention keeps only the keys of a memory block and its own
    # block's length, the step's own among them.
    model = tiny_model(head="categorical", attention="local_1d", **SMALL_BLOCKS)
    cache = model.start_decoding(1)
    assert all(layer.keys.shape[2] == 2 * SMALL_BLOCKS["query_block_length"] for layer in cache.layers)
    assert 32 < model.order.length == 192
    # one step counter, the model's cache's: no layer's cache keeps a copy
    assert not any(hasattr(layer, "step") for layer in cache.layers)


@pytest.mark.parametrize("head,attention,reading,low_res_size", [
    ("categorical", "local_2d", "cross_attention", 2), ("dmol", "local_1d", "cross_attention", 2),
    ("categorical", "local_1d", "cross_attention", 4), ("dmol", "local_2d", "cross_attention", 4),
    ("categorical", "local_1d", "cell_add", 4), ("dmol", "local_2d", "cell_add", 4)])
@pytest.mark.parametrize("num_transforms", [0, 48])
def test_cached_decoder_matches_full_pass_with_encoder(head, attention, reading, low_res_size, num_transforms):
    # low_res_size 4 with the cell add: each step reads part of the 4x4 input directly
    model = tiny_model(seed=4, dtype=torch.float64, head=head, attention=attention, num_classes=10,
                       encoder_layers=1, low_res_size=low_res_size, low_res_reading=reading,
                       num_transforms=num_transforms, query_block_shape=block_shape(head),
                       **{**SMALL_BLOCKS, "n_layers": 1})
    images = random_images(2, 8, seed=5)
    low_res = downsample_area(random_images(2, 8, seed=6), model.config.superres.low_res_size)  # not the images' own
    transforms = random_labels(2, num_transforms, seed=8) if num_transforms else None
    check_cached_equals_full(model, images, random_labels(2, 10, seed=7), low_res, transforms=transforms)


def test_cached_decoder_matches_full_pass_pre_norm():
    model = tiny_model(seed=8, dtype=torch.float64, head="dmol", attention="local_2d", norm="pre",
                       query_block_shape=(4, 4), **SMALL_BLOCKS)
    check_cached_equals_full(model, random_images(2, 8, seed=9))


def test_cached_decoder_matches_full_pass_pre_norm_cell_add():
    # quick_superres's shape of model: pre-norm (no norm after the cell add), rotary positions,
    # the cell add and the cell remainder over a 4x4 input
    model = tiny_model(seed=10, dtype=torch.float64, head="dmol", attention="local_1d", norm="pre",
                       relative_positions="rotary", encoder_layers=1, low_res_size=4, low_res_reading="cell_add",
                       cell_remainder_input=True, **SMALL_BLOCKS)
    images = random_images(2, 8, seed=11)
    check_cached_equals_full(model, images, low_res=downsample_area(random_images(2, 8, seed=12), 4))


# ----- the compiled step -----------------------------------------------------------------------

@pytest.fixture
def own_compile_cache():
    """A torch without ``torch.compile(isolate_recompiles=)`` (before 2.13) keeps every model's
    compiled decode_step in one cache: there, each test starts from an empty one, so that its
    check of no recompilation sees its own model's graphs only (as 2.13 and newer keep them)."""
    if not ISOLATED:
        torch._dynamo.reset()


# One tiny model for each part of decode_step the compiled graph must hold: the 1D ring with
# rotary positions turning each step, a 2D ring, cross-attention with the cell remainder's running
# sums, and the cell add's gather with the value bounds of exact_box_means. A compile takes seconds
# each.
COMPILED_CASES = {
    "1d_rotary": dict(head="dmol", attention="local_1d", relative_positions="rotary", num_classes=10),
    "2d": dict(head="categorical", attention="local_2d", query_block_shape=(4, 8)),
    "superres_remainder_cross": dict(head="dmol", attention="local_1d", num_classes=10, encoder_layers=1,
                                     low_res_size=4, cell_remainder_input=True),
    "superres_cell_add": dict(head="dmol", attention="local_1d", encoder_layers=1, low_res_size=4,
                              low_res_reading="cell_add", cell_remainder_input=True, exact_box_means=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", COMPILED_CASES)
@pytest.mark.usefixtures("own_compile_cache")
def test_compiled_step_matches_the_eager_step_and_the_full_pass(case):
    model = tiny_model(seed=18, dtype=torch.float64, **COMPILED_CASES[case], **{**SMALL_BLOCKS, "n_layers": 1})
    cfg = model.config
    images = random_images(2, 8, seed=19)
    labels = random_labels(2, 10, seed=20) if cfg.num_classes else None
    low_res = downsample_area(random_images(2, 8, seed=21), cfg.superres.low_res_size) if cfg.superres else None
    step = compile_decoding(model)
    # error_on_recompile: every step, the first (zeros) and the teacher-forced ones (strided
    # columns of the targets) alike, runs the one graph compiled at step 0.
    with torch._dynamo.config.patch(error_on_recompile=True):
        check_cached_equals_full(model, images, labels, low_res, step)
        with torch.no_grad():
            compiled = cached_params(model, images, labels, low_res, step)
    with torch.no_grad():
        eager = cached_params(model, images, labels, low_res)
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
    assert compile_decoding(model).compiled is step.compiled  # compiled once per model


@pytest.mark.slow
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.usefixtures("own_compile_cache")
def test_compiled_sampling_gives_the_eager_images(head):
    # float64: the compiled and eager parameters agree to ~1e-15, so every draw from the same
    # random numbers lands on the same value. Completion too: the given rows are teacher-forced
    # through the same graph (no recompilation).
    model = tiny_model(seed=22, head=head, dtype=torch.float64)
    prefix = random_images(3, 4, seed=23)
    for rows in (0, 2):
        given = dict(prefix=prefix, given_rows=rows) if rows else {}
        eager = sample(model, 3, generator=torch.Generator().manual_seed(8), **given)
        with torch._dynamo.config.patch(error_on_recompile=rows > 0):
            compiled = sample(model, 3, generator=torch.Generator().manual_seed(8), compiled=True, **given)
        assert torch.equal(compiled, eager)


def test_sampling_a_model_that_outputs_nan_fails_with_one_clear_error():
    # The heads draw without torch.multinomial's checks (they would read the device at every
    # step); the sampler checks the parameters once, after the loop.
    model = tiny_model(seed=24)
    with torch.no_grad():
        model.head.proj.bias.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="not finite"):
        sample(model, 2)


# ----- no host read per step ---------------------------------------------------------------------

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def host_reads(monkeypatch, run) -> int:
    """Reads of device values made from Python while ``run()`` runs (on a GPU each one waits for
    the device): the Tensor methods that read, patched and counted, as in test_host_reads.py.
    A compiled graph's reads are Python calls too (``.item()`` in the generated code, or in a
    guard on a value)."""
    count = [0]
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            def counted(tensor, *args, _original=getattr(torch.Tensor, name), **kwargs):
                count[0] += 1
                return _original(tensor, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        run()
    return count[0]


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.usefixtures("own_compile_cache")
def test_sampling_reads_the_device_a_fixed_number_of_times_not_per_step(monkeypatch, compiled):
    # Super-resolution with the cell add, the cell remainder and 2D rings: every decoding cache
    # that is indexed by the step. 48 steps against 192: the reads must not grow with them. A 0-d
    # step index into a table is read back as a Python int, in the graph as a .item().
    reads = []
    for size in (4, 8):
        model = tiny_model(seed=25, image_size=size, attention="local_2d", query_block_shape=(2, 6),
                           memory_flange=(1, 3), encoder_layers=1, low_res_size=size // 2,
                           low_res_reading="cell_add", cell_remainder_input=True)
        low_res = downsample_area(random_images(2, size, seed=26), size // 2)
        sample(model, 2, low_res=low_res, compiled=compiled)  # compiles, builds each pattern's tables
        reads.append(host_reads(monkeypatch, lambda: sample(model, 2, low_res=low_res, compiled=compiled)))
        assert model.order.length == 3 * size * size
    assert reads[0] == reads[1] <= 3, reads  # the given rows (once), the finiteness check (once)


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="CUDA graphs and host-device syncs need a GPU (the CPU tests above cover "
                                      "the compiled step's values and its host reads)")


@CUDA_ONLY
@pytest.mark.slow
@pytest.mark.parametrize("bounded", [False, True], ids=["", "superres_exact_box_means"])
def test_cuda_graph_step_matches_the_full_pass(bounded):
    # mode="reduce-overhead": the compiled step captured as a CUDA graph. cudagraph_or_error turns
    # a skipped capture (e.g. for the caches written in place) into an error. Bounded: the step also
    # returns its value bounds beside its parameters, a graph output copied out before the next replay.
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    low_res_fields = dict(encoder_layers=1, low_res_size=4, low_res_reading="cell_add", cell_remainder_input=True,
                          exact_box_means=True) if bounded else {}
    model = tiny_model(seed=27, dtype=torch.float64, head="dmol", attention="local_1d", relative_positions="rotary",
                       **low_res_fields, **SMALL_BLOCKS).cuda()
    images = random_images(2, 8, seed=28).cuda()
    low_res = downsample_area(images, 4) if bounded else None
    skips = counters["inductor"]["cudagraph_skips"]
    with inductor_config.patch({"triton.cudagraph_or_error": True}):
        check_cached_equals_full(model, images, low_res=low_res, step=compile_decoding(model, "reduce-overhead"))
    assert counters["inductor"]["cudagraph_skips"] == skips


@CUDA_ONLY
@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True, "reduce-overhead"])
def test_sampling_on_cuda_does_not_sync_per_step(compiled):
    import warnings

    model = tiny_model(seed=29, head="categorical", attention="local_1d", relative_positions="rotary",
                       **SMALL_BLOCKS).cuda()
    sample(model, 2, compiled=compiled)  # compiles (and captures)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            sample(model, 2, compiled=compiled, generator=torch.Generator("cuda").manual_seed(0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) < model.order.length // 16, [str(w.message) for w in syncs[:3]]  # 192 steps


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
        logits = full_pass(model, images)  # by causality, step t's logits depend only on steps < t
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
    # 12,288 steps: a dense (T, T) bool mask alone would be 151 MB. Decoding reads the kv-cache
    # from the pattern's blocks instead; the dense reference itself is the negative control.
    model = build_model(preset_model_config(REPO / "configs" / "imagenet64.yaml")).eval()
    t_squared = model.order.length ** 2
    assert largest_allocation(lambda: model.start_decoding(1)) < t_squared // 16
    assert largest_allocation(model.pattern.can_attend) >= t_squared


@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_a_completions_prefill_builds_nothing_of_size_t_squared(attention):
    # 56 of 64 rows given, 3,584 steps: one (t, cache + t) mask over them would take over t² bytes
    # (as SDPA's float mask, four times that). A prefill is the full pass over its steps' blocks:
    # it allocates no more than the full pass over the whole image, far below t² here.
    model = tiny_model(head="dmol", mixture_components=1, image_size=64, attention=attention, query_block_length=64,
                       query_block_shape=(8, 8), memory_flange=(8, 8))
    targets = model.targets(random_images(1, 64, seed=40))
    given = targets[:, : int(model.given_steps(56).sum())]
    length, cache = given.shape[1], model.start_decoding(1)  # the pattern's index built with the model, once
    full_pass = largest_allocation(lambda: model(previous_values(targets)))
    assert largest_allocation(lambda: model.prefill(given, cache)) <= full_pass < length**2 // 2


@pytest.mark.parametrize("sampler", [sample, sample_uncached])
def test_samplers_run_in_eval_mode_and_restore_the_callers_mode(sampler):
    # With dropout, a model left in train mode would sample from a different distribution.
    model = tiny_model(seed=17, dropout=0.3)
    expected = sampler(model, 2, generator=torch.Generator().manual_seed(4))  # tiny_model: eval mode
    model.train()
    got = sampler(model, 2, generator=torch.Generator().manual_seed(4))
    assert model.training
    assert torch.equal(got, expected)


# ----- completion in one pass, temperatures per image, progress ----------------------------------

def stepped_completion(model, prefix, rows, generator):
    """The completion loop before prefill: every step, the given ones too, through decode_step."""
    count = prefix.shape[0]
    given = model.given_steps(rows).tolist()
    forced = model.targets(prefix)
    cache = model.start_decoding(count)
    values, value = [], first_input(model, count)
    with torch.no_grad():
        for t in range(model.order.length):
            params = model.decode_step(value, cache)
            value = forced[:, t] if given[t] else model.head.sample(params[:, None], 1.0, generator)[:, 0]
            values.append(value)
    return model.images(torch.stack(values, dim=1)).to(torch.uint8)


@pytest.mark.parametrize("head,attention,rows", [("categorical", "local_1d", 3), ("dmol", "local_2d", 4),
                                                 ("dmol", "full", 5)])
def test_prefilled_completion_gives_the_images_of_stepping_through_the_given_rows(head, attention, rows):
    model = tiny_model(seed=30, dtype=torch.float64, head=head, attention=attention, query_block_shape=block_shape(head),
                       **SMALL_BLOCKS)
    prefix = random_images(3, 8, seed=31)
    stepped = stepped_completion(model, prefix, rows, torch.Generator().manual_seed(9))
    prefilled = sample(model, 3, prefix=prefix, given_rows=rows, generator=torch.Generator().manual_seed(9))
    assert torch.equal(prefilled, stepped)
    assert torch.equal(prefilled[:, :rows], prefix[:, :rows])


def test_completion_prefills_the_given_rows_and_steps_only_through_the_rest(monkeypatch):
    model = tiny_model(seed=32, head="dmol", attention="local_1d", **SMALL_BLOCKS)
    calls = {"prefill": [], "decode_step": 0}
    prefill, decode_step = model.prefill, model.decode_step

    def counted_prefill(given, cache):
        calls["prefill"].append(tuple(given.shape))
        return prefill(given, cache)

    def counted_step(previous, cache):
        calls["decode_step"] += 1
        return decode_step(previous, cache)

    monkeypatch.setattr(model, "prefill", counted_prefill)
    monkeypatch.setattr(model, "decode_step", counted_step)
    sample(model, 4, prefix=random_images(4, 8, seed=33), given_rows=6)
    assert calls == {"prefill": [(4, 48, 3)], "decode_step": 64 - 48}  # 6 of 8 rows of 8 pixels given


def test_prefill_refuses_a_cache_that_has_started_and_a_bad_length():
    model = tiny_model(seed=34)
    cache = model.start_decoding(1)
    model.decode_step(first_input(model, 1), cache)
    targets = model.targets(random_images(1, 4, seed=35))
    with pytest.raises(ValueError, match="fresh cache"):
        model.prefill(targets[:, :4], cache)
    with pytest.raises(ValueError, match="1..48 steps"):
        model.prefill(targets[:, :0], model.start_decoding(1))


def test_each_image_can_have_its_own_temperature():
    model = tiny_model(seed=36, head="dmol", dtype=torch.float64)
    greedy = sample(model, 1, temperature=0.0)
    mixed = sample(model, 3, temperature=[0.0, 1.0, 0.0], generator=torch.Generator().manual_seed(2))
    assert torch.equal(mixed[0], greedy[0]) and torch.equal(mixed[2], greedy[0])  # temperature 0: the argmax
    assert not torch.equal(mixed[1], greedy[0])
    # one temperature for all, given once or per image, draws the same images
    same = [sample(model, 2, temperature=t, generator=torch.Generator().manual_seed(4)) for t in (0.9, [0.9, 0.9])]
    assert torch.equal(*same)
    with pytest.raises(ValueError, match="2 temperatures for 3 images"):
        sample(model, 3, temperature=[1.0, 1.0])
    with pytest.raises(ValueError, match="temperature"):
        sample(model, 2, temperature=[1.0, -1.0])


def test_sampling_progressively_yields_the_images_as_they_grow():
    model = tiny_model(seed=37, head="dmol", image_size=8)
    prefix = random_images(2, 8, seed=38)
    row = model.order.length // 8  # steps of one image row (raster order)
    states = list(sample_progressively(model, 2, prefix=prefix, given_rows=3, every=row,
                                       generator=torch.Generator().manual_seed(5)))
    final = sample(model, 2, prefix=prefix, given_rows=3, generator=torch.Generator().manual_seed(5))
    assert [state.steps for state in states] == [3 * row, 4 * row, 5 * row, 6 * row, 7 * row, 8 * row]
    assert [state.done for state in states] == [False] * 5 + [True]
    assert torch.equal(states[-1].images, final)
    for state in states:  # each shows the rows decoded so far, the rest still 0
        rows = state.steps // row
        assert torch.equal(state.images[:, :rows], final[:, :rows])
        assert not state.images[:, rows:].any()
    with pytest.raises(ValueError, match="every"):
        next(sample_progressively(model, 1, every=0))


def test_the_progress_bar_updates_sparingly_when_its_output_is_not_a_terminal(monkeypatch, capsys):
    # A log file gets a line per update: there at most one every LOG_PROGRESS_SECONDS. The bars
    # are closed here (a bar left open writes to this test's captured stream after it is closed).
    stream = sys.stderr  # capsys's, for this test
    monkeypatch.setattr(stream, "isatty", lambda: False, raising=False)
    with progress_bar(range(3, 10), True) as logged:
        assert logged.mininterval == LOG_PROGRESS_SECONDS
    monkeypatch.setattr(stream, "isatty", lambda: True, raising=False)
    with progress_bar(range(3, 10), True) as terminal:  # a completion given 3 steps: its bar starts at 0 of 7
        assert terminal.mininterval < LOG_PROGRESS_SECONDS and terminal.n == 0 and terminal.total == 7
    monkeypatch.setattr(stream, "isatty", lambda: False, raising=False)
    capsys.readouterr()
    sample(tiny_model(seed=39, image_size=8), 1, progress=True)  # 192 steps
    updates = capsys.readouterr().err.count("sampling")
    assert 1 <= updates <= 3, updates  # the first draw, perhaps one more, and the last


def test_decoding_on_a_cpu_uses_one_thread_and_gives_the_callers_back(monkeypatch):
    """Small decoding steps on several threads wait for each other, 5-15x slower on a busy
    machine (docs/results.md): the steps run on DECODING_THREADS, the caller's count comes back
    between yields and after, and an OMP_NUM_THREADS the user set is obeyed."""
    from imagetx.model import sampler

    model = tiny_model(seed=39, head="dmol", image_size=8)
    seen = []
    decode_step = model.decode_step

    def recorded_step(previous, cache):
        seen.append(torch.get_num_threads())
        return decode_step(previous, cache)

    monkeypatch.setattr(model, "decode_step", recorded_step)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for name in sampler.THREADS_ASKED_BY:
            monkeypatch.delenv(name, raising=False)
        for state in sample_progressively(model, 2, every=8):
            assert torch.get_num_threads() == 2  # the caller's, while it holds a state
        sample(model, 2)
        assert set(seen) == {sampler.DECODING_THREADS} and torch.get_num_threads() == 2
        seen.clear()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # asked for: left as it is
        sample(model, 2)
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("reading", [None, "cross_attention", "cell_add"])
def test_every_decoder_layer_is_called_as_a_module_in_the_full_pass_and_in_decoding(reading):
    """The decoder runs each layer through its own call (``layer(x, cache, start, condition)``), a
    super-resolution model's with its reading of the encoder inside, so that forward hooks,
    activation checkpointing and per-layer wrappers (FSDP, regional compilation) see every layer,
    in the full pass and in each cached decoding step alike; what the call returns is what the
    model goes on with (a hook that replaces it changes the model's scores)."""
    from helpers import tiny_model

    from imagetx.model.superres import downsample_area

    superres = {} if reading is None else dict(image_size=8, encoder_layers=1, low_res_size=4, low_res_reading=reading)
    model = tiny_model(**superres).eval()
    layers = decoder_of(model).layers
    calls = []
    for index, layer in enumerate(layers):
        layer.register_forward_hook(lambda module, args, output, index=index: calls.append(index))
    images = torch.randint(0, 256, (1, model.config.image_size, model.config.image_size, 3))
    low_res = {"low_res": downsample_area(images, 4)} if reading else {}
    with torch.no_grad():
        scored = model.bits_per_dim(images, **low_res)
    assert calls == list(range(len(layers)))
    calls.clear()
    with torch.no_grad():
        sample(model, 1, **low_res)
    assert calls and set(calls) == set(range(len(layers)))
    layers[-1].register_forward_hook(lambda module, args, output: torch.zeros_like(output))
    with torch.no_grad():
        assert not torch.allclose(model.bits_per_dim(images, **low_res), scored)


@pytest.mark.parametrize("reading", [None, "cross_attention"])
def test_an_attention_of_its_own_width_decodes_as_its_full_pass(reading):
    """``attention.head_size`` other than d_model / n_heads (3 heads of 12 channels over d_model 16):
    the projections go to that width and back, every attention of the model alike (the encoder's and
    cross-attention too), and the cached decoder gives the full pass's parameters."""
    import dataclasses

    from helpers import tiny_config
    from imagetx.model.superres import build_model

    superres = {} if reading is None else dict(image_size=8, encoder_layers=1, low_res_size=4, low_res_reading=reading)
    config = tiny_config(n_heads=3, relative_positions="rotary", **superres)
    config = dataclasses.replace(config, attention=dataclasses.replace(config.attention, head_size=12)).validate()
    torch.manual_seed(11)
    model = build_model(config).double().eval()
    layer = decoder_of(model).layers[0]
    assert layer.self_attn.qkv.weight.shape == (3 * 36, 16)
    assert layer.self_attn.proj.weight.shape == (16, 36)
    if reading:
        assert layer.cross_attn.kv.weight.shape == (2 * 36, 16)
    images = random_images(2, config.image_size, seed=12)
    check_cached_equals_full(model, images, low_res=downsample_area(images, 4) if reading else None)
