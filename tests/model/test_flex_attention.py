"""FlexAttention (imagetx/model/flex.py, ``build_model(..., kernel="flex")``) against the dense
reference (docs/model.md §4).

FlexAttention runs its compiled forward on the CPU but has no backward there, so on the CPU
these tests check values: every pattern (float32 and bfloat16) equals ``dense_attention`` with
``can_attend``, including patterns finer than the kernel's 128 × 128 blocks and lengths that
are not a multiple of 128; bits/dim, causality (by perturbing the future) and the cached
sampler through the flex kernel. Gradients are checked by a test that runs where CUDA is.

Each new shape, dtype or rule compiles the kernel once (a few seconds on the CPU): the
models below share one batch size and the patterns a few lengths.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.attention.flex_attention as flex_module

from helpers import (bits_per_dim, decode_embeddings, decoder_of, dense_attention, random_images, random_labels, tiny_model,
                     value_embeddings)
from imagetx.model import flex, patterns
from imagetx.model.superres import downsample_area
from imagetx.model.transformer import previous_values
from imagetx.model.attention import attend, uses_flex
from imagetx.model.flex import block_mask, build_block_mask
from imagetx.model.patterns import FullCausal, GenerationOrder, Local1D, Local2D, PatternIndex
from imagetx.model.scoring import full_pass
from test_sampler import cached_params

HEADS = 2
KERNEL_BLOCK = 128  # FlexAttention's default block: create_block_mask's BLOCK_SIZE


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels_only():
    """The tests compile more variants than dynamo's default of 8 per function; past the
    limit it would silently run flex uncompiled, so fail instead. The compiled variants are
    dropped afterwards, so that later tests start from dynamo's defaults."""
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


# One-row grids (GenerationOrder(1, T)) are avoided: their step-to-cell lookups are stride-0
# views, which the CPU kernel cannot read as captured tensors (see the report of issue 26).
PATTERNS = [
    Local1D(GenerationOrder(10, 30), 30, 1),           # one-row blocks of 30 < 128; T = 300, not a multiple of 128
    Local1D(GenerationOrder(10, 30), 8, 2),            # blocks of 8, two memory blocks
    Local2D(GenerationOrder(8, 12, (2, 3)), (1, 2)),   # T = 96 < one kernel block; 1-cell flange
    Local2D(GenerationOrder(16, 24, (4, 8)), (4, 8)),  # T = 384 = 3 kernel blocks
    Local2D(GenerationOrder(6, 6, (2, 3)), (4, 1)),    # flange taller than the block
    FullCausal(GenerationOrder(10, 13)),               # T = 130
]


def rand_qkv(length: int, batch: int = 2, dim: int = 8, seed: int = 0, device="cpu") -> list[torch.Tensor]:
    """q, k, v (batch, heads, length, dim), float64."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, length, dim, generator=gen, dtype=torch.float64).to(device) for _ in range(3)]


def dense_reference(pattern, q, k, v) -> torch.Tensor:
    """``dense_attention`` with the pattern's ``can_attend``, float64."""
    return dense_attention(q, k, v, pattern.can_attend().to(q.device))


# ----- every pattern equals the dense reference ----------------------------------------------

@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.describe())
def test_flex_equals_dense_reference(pattern):
    q, k, v = rand_qkv(pattern.length)
    with torch.no_grad():
        got = attend(q.float(), k.float(), v.float(), PatternIndex(pattern, KERNEL_BLOCK), "flex")
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), dense_reference(pattern, q, k, v), atol=2e-6, rtol=0)


@pytest.mark.parametrize("pattern", [PATTERNS[0], PATTERNS[2]], ids=lambda p: p.describe())
def test_flex_in_bfloat16_is_close_to_float64(pattern):
    # bf16 errors include rounding the inputs themselves to 8 bits of mantissa (~4e-3 relative).
    q, k, v = rand_qkv(pattern.length)
    with torch.no_grad():
        got = attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), PatternIndex(pattern, KERNEL_BLOCK), "flex")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), dense_reference(pattern, q, k, v), atol=3e-2, rtol=0)


def test_a_wrong_mask_mod_is_caught():
    # Negative control: flex under a rule one memory block short must differ from the reference.
    pattern, short = Local1D(GenerationOrder(10, 30), 30, 1), Local1D(GenerationOrder(10, 30), 30, 0)
    q, k, v = rand_qkv(pattern.length)
    with torch.no_grad():
        wrong = attend(q.float(), k.float(), v.float(), PatternIndex(short, KERNEL_BLOCK), "flex")
    assert not torch.allclose(wrong.double(), dense_reference(pattern, q, k, v), atol=1e-3)


def assert_runs_exactly_the_kernel_blocks_with_an_allowed_pair(pattern, block: int) -> None:
    """Kernel blocks (block × block pairs) with no allowed pair are skipped, those with some are
    run, and only those the rule allows whole are run without the mask_mod: read off can_attend,
    tile by tile, the end padding counted as not allowed."""
    mask = block_mask(PatternIndex(pattern, block))  # as a model keeps it, rebuilt from its buffers
    assert mask.BLOCK_SIZE == (block, block)
    tiles = -(-pattern.length // block) * block
    allowed = torch.zeros(tiles, tiles, dtype=torch.bool)
    allowed[: pattern.length, : pattern.length] = pattern.can_attend()
    per_tile = allowed.view(tiles // block, block, -1, block).transpose(1, 2)
    assert torch.equal(mask.to_dense()[0, 0].bool(), per_tile.any(-1).any(-1))
    full = torch.zeros_like(per_tile[..., 0, 0])
    for row, count in enumerate(mask.full_kv_num_blocks[0, 0].tolist()):
        full[row, mask.full_kv_indices[0, 0, row, :count]] = True
    assert torch.equal(full, per_tile.all(-1).all(-1))


@pytest.mark.parametrize("pattern", PATTERNS + [Local1D(GenerationOrder(32, 32), 32, 1)], ids=lambda p: p.describe())
def test_block_mask_runs_exactly_the_kernel_blocks_with_an_allowed_pair(pattern):
    assert_runs_exactly_the_kernel_blocks_with_an_allowed_pair(pattern, KERNEL_BLOCK)
    if pattern.length == 1024:  # 1D blocks of one 32-wide row: 8 kernel blocks, each needs 2
        assert int(build_block_mask(pattern, KERNEL_BLOCK).to_dense().sum()) == 8 + 7


# Kernel blocks smaller than FlexAttention's default (build_model's flex_block_size): the one-row
# pattern of the GPU recipe (32 x 32 pixels, blocks of one row over the row above) in blocks of
# a half, one and two rows; a 2D pattern and full attention in blocks that do not divide T.
def in_blocks(pattern, block: int):
    """A (pattern, kernel block size) case, named by both."""
    return pytest.param(pattern, block, id=f"{pattern.describe()}-block{block}")


FINE_BLOCKS = [in_blocks(Local1D(GenerationOrder(32, 32), 32, 1), size) for size in (16, 32, 64)] + [
    in_blocks(Local2D(GenerationOrder(16, 24, (4, 8)), (4, 8)), 32), in_blocks(FullCausal(GenerationOrder(10, 13)), 16)]


@pytest.mark.parametrize("pattern,block", FINE_BLOCKS)
def test_smaller_kernel_blocks_equal_the_dense_reference(pattern, block):
    q, k, v = rand_qkv(pattern.length)
    with torch.no_grad():
        got = attend(q.float(), k.float(), v.float(), PatternIndex(pattern, block), "flex")
    torch.testing.assert_close(got.double(), dense_reference(pattern, q, k, v), atol=2e-6, rtol=0)
    assert_runs_exactly_the_kernel_blocks_with_an_allowed_pair(pattern, block)
    if isinstance(pattern, Local1D) and block == 32:
        # one block per row: the first row's diagonal block, then 2 for each later row; of the
        # 128-pair default's 8 x 2 - 1 blocks of 16,384 pairs, a quarter of the pairs
        assert int(build_block_mask(pattern, block).to_dense().sum()) == 32 + 31


def test_tile_options_pin_cuda_tiles_to_blocks_smaller_than_the_default():
    # The CUDA kernel's tiles must divide the mask's blocks (and N1 % M1 == M2 % N2 == 0).
    pattern = Local1D(GenerationOrder(32, 32), 32, 1)
    fine, default = (build_block_mask(pattern, size) for size in (32, 128))
    options = flex.tile_options(fine, torch.device("cuda"))
    assert options == {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 32}
    assert flex.tile_options(default, torch.device("cuda")) is None  # the kernel's own tiles
    assert flex.tile_options(fine, torch.device("cpu")) is None  # the CPU kernel has no tiles to pin


# ----- the kernel a model runs ------------------------------------------------------------------

def test_auto_is_flex_on_cuda_only_for_heads_its_cuda_kernel_takes():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [uses_flex(kernel, cpu, 32) for kernel in ("auto", "flex", "sdpa")] == [False, True, False]
    assert [uses_flex(kernel, cuda, 32) for kernel in ("auto", "flex", "sdpa")] == [True, True, False]
    # 8-channel heads (a tiny model's): FlexAttention's CUDA kernel refuses them (the 2026-11-26
    # lease's one failing CUDA test), so auto takes SDPA there; the CPU kernel takes them.
    assert [uses_flex(kernel, cuda, 8) for kernel in ("auto", "sdpa")] == [False, False]
    assert uses_flex("flex", cpu, 8) and uses_flex("auto", cuda, 16)
    with pytest.raises(ValueError, match="'flex' needs heads of at least 16 channels on CUDA, got 8"):
        uses_flex("flex", cuda, 8)
    with pytest.raises(ValueError, match="attention kernel 'triton' is unknown: choose one of auto, flex, sdpa"):
        tiny_model(attention_kernel="triton")


# Tiny models that share one batch of 2 (each compiles the kernel once per rule and shape):
# 1D blocks of one 24-wide grid row with classes; 2D blocks with a 1-row, 2-column flange,
# rotary positions and cross-attention; full attention with rotary positions; 2D with the cell add
# and the cell remainder input; 1D blocks with rotary positions; 2D blocks alone.
MODELS = {
    "local_1d_classes": dict(head="categorical", attention="local_1d", image_size=8, query_block_length=24,
                             num_classes=10),
    "local_2d_cross": dict(head="dmol", attention="local_2d", image_size=8, query_block_shape=(2, 4),
                           memory_flange=(1, 2), encoder_layers=1, low_res_size=4,
                           relative_positions="rotary"),
    "full_rotary": dict(head="categorical", attention="full", relative_positions="rotary"),
    "local_2d_cell_add": dict(head="categorical", attention="local_2d", image_size=8, query_block_shape=(4, 8),
                              memory_flange=(2, 4), encoder_layers=1, low_res_size=4, low_res_reading="cell_add",
                              cell_remainder_input=True),
    "local_1d_rotary": dict(head="dmol", attention="local_1d", image_size=8, query_block_length=8,
                            relative_positions="rotary"),
    "local_2d": dict(head="categorical", attention="local_2d", image_size=8, query_block_shape=(2, 4),
                     memory_flange=(1, 2)),
    # the GPU recipe's kind in miniature: one-row blocks, rotary, DMOL, kernel blocks of one row
    "local_1d_rotary_row_blocks": dict(head="dmol", attention="local_1d", image_size=16, query_block_length=16,
                                       relative_positions="rotary", flex_block_size=16),
}


def model_and_inputs(name: str, kernel: str, seed: int = 0):
    """A two-layer tiny model of MODELS[name] running ``kernel``, with images and whatever
    conditioning it takes."""
    config = MODELS[name]
    model = tiny_model(seed=seed, n_layers=2, attention_kernel=kernel, **config)
    size = config.get("image_size", 4)
    images = random_images(2, size, seed=seed + 1)
    labels = random_labels(2, 10, seed=seed + 2) if config.get("num_classes") else None
    low_res = downsample_area(random_images(2, size, seed=seed + 3), config["low_res_size"]) \
        if config.get("encoder_layers") else None
    return model, images, labels, low_res


def count_flex_calls(monkeypatch) -> list[int]:
    calls = [0]
    original = flex.flex_attend

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(flex, "flex_attend", counted)
    return calls


@pytest.mark.parametrize("name", MODELS)
def test_bits_per_dim_through_flex_equals_sdpa(name, monkeypatch):
    flex_model, images, labels, low_res = model_and_inputs(name, "flex")
    sdpa_model, *_ = model_and_inputs(name, "sdpa")
    calls = count_flex_calls(monkeypatch)
    with torch.no_grad():
        expected = bits_per_dim(sdpa_model, images, labels, low_res)
        assert calls[0] == 0
        got = bits_per_dim(flex_model, images, labels, low_res)
    assert calls[0] == len(decoder_of(flex_model).layers)  # every layer's self-attention ran flex (cross-attention: SDPA)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_block_mask_is_built_once_for_every_layer(monkeypatch):
    built = []
    original = flex_module.create_block_mask  # what flex.py imports where it builds one
    monkeypatch.setattr(flex_module, "create_block_mask",
                        lambda *args, **kwargs: built.append(args) or original(*args, **kwargs))
    model, images, labels, low_res = model_and_inputs("local_2d_cross", "flex")
    assert len(built) == 1  # with the model
    with torch.no_grad():
        bits_per_dim(model, images, labels, low_res)
        bits_per_dim(model, images, labels, low_res)
    assert len(built) == 1  # one pattern, for two layers and two passes: none built in a pass
    assert [args[3:5] for args in built] == [(64, 64)]


def future_changes(model, emb: torch.Tensor, low_res, labels, step: int) -> tuple[bool, bool]:
    """Perturb every input from ``step`` on: (whether any output up to ``step`` changed,
    whether the output of step + 1 changed). Step t's input is the value of step t − 1."""
    perturbed = emb.clone()
    perturbed[:, step:] = torch.randn(perturbed[:, step:].shape, generator=torch.Generator().manual_seed(step))
    with torch.no_grad():
        before = decode_embeddings(model, emb, labels, low_res)
        after = decode_embeddings(model, perturbed, labels, low_res)
    past_changed = not torch.equal(before[:, : step + 1], after[:, : step + 1])
    next_changed = step + 1 < emb.shape[1] and not torch.allclose(before[:, step + 1], after[:, step + 1])
    return past_changed, next_changed


def steps_to_perturb(length: int) -> list[int]:
    return sorted({0, 1, length // 3, length // 2 - 1, length // 2, length - 2})


@pytest.mark.parametrize("name", ["local_1d_classes", "local_2d_cross", "full_rotary", "local_1d_rotary",
                                  "local_1d_rotary_row_blocks"])
def test_flex_is_causal_by_perturbation(name):
    model, images, labels, low_res = model_and_inputs(name, "flex")
    emb = value_embeddings(model, model.targets(images)).detach()
    for step in steps_to_perturb(emb.shape[1]):
        past_changed, next_changed = future_changes(model, emb, low_res, labels, step)
        assert not past_changed, f"step {step}: an output up to it depends on later inputs"
        assert next_changed, f"step {step}: the next output ignores the perturbed input"


def test_perturbation_catches_a_mask_mod_that_sees_the_next_step(monkeypatch):
    # Negative control: the same check on a model whose rule also lets each query see the next key
    # (its block mask built from that rule; no kv-cache sized, which would refuse a rule that sees ahead).
    honest = Local1D.mask_rule
    monkeypatch.setattr(Local1D, "mask_rule",
                        lambda self: (lambda query, key: honest(self)(query, key) | (key == query + 1)))
    monkeypatch.setattr(patterns, "reach", lambda blocks, length: 1)
    model, images, labels, low_res = model_and_inputs("local_1d_classes", "flex")
    emb = value_embeddings(model, model.targets(images)).detach()
    leaks = [future_changes(model, emb, None, labels, step)[0] for step in steps_to_perturb(emb.shape[1])]
    assert all(leaks)


@pytest.mark.parametrize("name", ["local_1d_classes", "local_2d_cross", "full_rotary", "local_2d_cell_add",
                                  "local_1d_rotary", "local_2d"])
def test_cached_sampler_equals_the_flex_full_pass(name):
    model, images, labels, low_res = model_and_inputs(name, "flex")
    with torch.no_grad():
        full = full_pass(model, images, labels, low_res)
        cached = cached_params(model, images, labels, low_res)
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=2e-5)


def test_compiled_model_through_flex_equals_eager():
    # The block mask is rebuilt from the model's buffers inside its graph, the kernel compiled as
    # part of it.
    model, images, labels, low_res = model_and_inputs("local_2d_cross", "flex")
    with torch.no_grad():
        expected = full_pass(model, images, labels, low_res)
        got = torch.compile(model)(previous_values(model.targets(images)), **model.conditioning(len(images), labels, low_res=low_res))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# ----- gradients: on a GPU --------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason=f"FlexAttention has no backward on the CPU (torch {torch.__version__}); runs on a GPU")
@pytest.mark.parametrize("pattern,block", [in_blocks(p, KERNEL_BLOCK) for p in PATTERNS] + FINE_BLOCKS)
def test_flex_values_and_gradients_equal_dense_on_cuda(pattern, block):
    device = torch.device("cuda")
    q64, k64, v64 = (t.requires_grad_() for t in rand_qkv(pattern.length, dim=16, device=device))
    projection = torch.randn(q64.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(device)

    def grads(out, inputs):
        return torch.autograd.grad((out.double() * projection).sum(), inputs)

    ref = dense_reference(pattern, q64, k64, v64)
    ref_grads = grads(ref, [q64, k64, v64])
    q, k, v = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    got = attend(q, k, v, PatternIndex(pattern, block).to(device), "flex")
    got_grads = grads(got, [q, k, v])
    torch.testing.assert_close(got.double(), ref, atol=1e-4, rtol=0)
    for name, g, r in zip(["q", "k", "v"], got_grads, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-3, msg=lambda m: f"grad {name}: {m}")
