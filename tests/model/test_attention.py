"""Every fast attention path equals the dense reference (docs/model.md §4).

attend(q, k, v, PatternIndex(pattern), "sdpa") is computed block by block; dense_attention(q, k, v,
pattern.can_attend()) masks an n×n matrix. Outputs and gradients must agree to
float64 precision, and the float32 / bfloat16 paths must stay close to that.
q, k, v are (B, h, T, e), as attention kernels take them. Decoding one step at a time
through a cache equals the full pass.
"""

from __future__ import annotations

import math

import pytest
import torch
from einops import rearrange

from helpers import dense_attention
from imagetx.model import attention, patterns
from imagetx.model.attention import CrossAttention, SelfAttention, attend, attend_in_blocks, project_heads
from imagetx.model.flops import pairs_computed
from imagetx.model.patterns import FullCausal, GenerationOrder, Local1D, Local2D, PatternIndex


def local_1d(length: int, block: int, memory: int = 1) -> Local1D:
    return Local1D(GenerationOrder(1, length), block, memory)


def local_2d(rows: int, cols: int, block, flange) -> Local2D:
    return Local2D(GenerationOrder(rows, cols, block), flange)


def full_causal(length: int) -> FullCausal:
    return FullCausal(GenerationOrder(1, length))


def sdpa_attend(pattern):
    """(q, k, v) -> the pattern's attention through the SDPA reference path (``attention.attend``)."""
    return lambda q, k, v: attend(q, k, v, PatternIndex(pattern), "sdpa")

CASES_1D = [
    (10, 4, 0), (10, 4, 1), (10, 4, 2), (10, 4, 3),  # length not divisible by the block
    (16, 4, 1), (16, 4, 0), (16, 4, 3),               # divisible
    (7, 8, 1), (3, 8, 0), (1, 4, 2),                  # shorter than one block
    (13, 5, 2), (12, 3, 6),                           # more memory than there are blocks
    (5, 1, 1), (9, 2, 3), (50, 7, 2),
]

CASES_2D = [
    (4, 6, (2, 3), (1, 2)),
    (4, 6, (2, 3), (0, 2)),   # fh = 0
    (4, 6, (2, 3), (2, 0)),   # fw = 0, flange height equal to block height
    (4, 6, (2, 2), (1, 5)),   # flange wider than the block (and than the grid)
    (6, 6, (2, 2), (2, 3)),
    (4, 4, (1, 1), (1, 1)),
    (4, 8, (4, 2), (3, 4)),
    (2, 4, (2, 4), (1, 1)),   # a single block row
    (4, 12, (2, 3), (0, 0)),  # no flange at all
    (6, 9, (3, 3), (1, 4)),
    (8, 8, (2, 4), (2, 2)),
    (2, 2, (2, 2), (2, 2)),   # a single block
    (6, 6, (2, 3), (4, 1)),   # flange taller than the block: two block rows above
    (8, 4, (1, 2), (3, 1)),   # three rows above one-row blocks
]


def rand_qkv(length: int, dtype=torch.float64, batch=2, heads=2, dim=4, seed=0):
    """q, k, v (batch, heads, length, dim)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
            for _ in range(3)]


def outputs_and_grads(fn, q, k, v, seed=1):
    out = fn(q, k, v)
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)
    grads = torch.autograd.grad((out * proj).sum(), (q, k, v))
    return out.detach(), [g.detach() for g in grads]


def check_against_dense(pattern, atol=1e-10):
    q, k, v = rand_qkv(pattern.length)
    mask = pattern.can_attend()
    fast, fast_grads = outputs_and_grads(sdpa_attend(pattern), q, k, v)
    ref, ref_grads = outputs_and_grads(lambda a, b, c: dense_attention(a, b, c, mask), q, k, v)
    assert fast.shape == ref.shape == q.shape
    assert fast.dtype == torch.float64
    torch.testing.assert_close(fast, ref, atol=atol, rtol=0)
    for name, g, r in zip("qkv", fast_grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=0, msg=lambda m: f"grad w.r.t. {name}: {m}")


@pytest.mark.parametrize("length,block,memory", CASES_1D)
def test_local_1d_equals_dense(length, block, memory):
    check_against_dense(local_1d(length, block, memory))


@pytest.mark.parametrize("rows,cols,block,flange", CASES_2D)
def test_local_2d_equals_dense(rows, cols, block, flange):
    check_against_dense(local_2d(rows, cols, block, flange))


@pytest.mark.parametrize("length", [1, 7, 16])
def test_full_causal_equals_dense(length):
    check_against_dense(full_causal(length))


def test_dense_reference_is_plain_softmax_attention():
    # The reference itself, against a per-query loop.
    q, k, v = (t.detach() for t in rand_qkv(6, batch=1, heads=1))
    mask = local_1d(6, 2, 1).can_attend()
    out = dense_attention(q, k, v, mask)
    for i in range(6):
        keys = mask[i].nonzero().flatten()
        scores = (k[0, 0, keys] @ q[0, 0, i]) / math.sqrt(q.shape[-1])
        expected = torch.softmax(scores, dim=0) @ v[0, 0, keys]
        torch.testing.assert_close(out[0, 0, i], expected, atol=1e-12, rtol=0)


def test_the_comparison_detects_a_wrong_mask():
    # Negative control: a fast path compared with a different pattern's mask must not pass.
    pattern = local_1d(12, 4, 1)
    q, k, v = rand_qkv(12)
    wrong = local_1d(12, 4, 2).can_attend()
    assert not torch.allclose(attend(q, k, v, PatternIndex(pattern), "sdpa"), dense_attention(q, k, v, wrong), atol=1e-6)
    pattern2d = local_2d(4, 6, (2, 3), (1, 2))
    wrong2d = local_2d(4, 6, (2, 3), (1, 1)).can_attend()
    q, k, v = rand_qkv(24)
    assert not torch.allclose(attend(q, k, v, PatternIndex(pattern2d), "sdpa"), dense_attention(q, k, v, wrong2d), atol=1e-6)


# ----- lower precision --------------------------------------------------------------

LOW_PRECISION_PATTERNS = [
    local_1d(50, 8, 1), local_1d(10, 4, 0), local_1d(30, 4, 3),
    local_2d(4, 6, (2, 3), (1, 2)), local_2d(8, 8, (2, 4), (2, 2)), local_2d(4, 6, (2, 2), (1, 5)),
    full_causal(20),
]


@pytest.mark.parametrize("pattern", LOW_PRECISION_PATTERNS, ids=lambda p: p.describe())
@pytest.mark.parametrize("dtype,atol,grad_atol", [(torch.float32, 5e-6, 1e-5), (torch.bfloat16, 3e-2, 6e-2)])
def test_low_precision_close_to_float64(pattern, dtype, atol, grad_atol):
    # bf16 errors include rounding the inputs themselves to 8 bits of mantissa (~4e-3 relative).
    q64, k64, v64 = rand_qkv(pattern.length, dim=8)
    ref, ref_grads = outputs_and_grads(lambda a, b, c: dense_attention(a, b, c, pattern.can_attend()), q64, k64, v64)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64))
    out, grads = outputs_and_grads(sdpa_attend(pattern), q, k, v)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=0)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), r, atol=grad_atol, rtol=0)


# ----- the 2D sequence is in block-raster order ---------------------------------------


def grid_reference_attention(qg, kg, vg, block, flange):
    """Attention computed on the grid (b, h, rows, cols, d) with keys chosen cell by cell."""
    (qh, qw), (fh, fw) = block, flange
    _, _, rows, cols, d = qg.shape
    out = torch.zeros_like(qg)
    for r in range(rows):
        for c in range(cols):
            r0, c0 = r // qh * qh, c // qw * qw
            keys = []
            for kr in range(rows):
                for kc in range(cols):
                    top = r0 - fh <= kr < r0 and c0 - fw <= kc < c0 + qw + fw
                    left = r0 <= kr < r0 + qh and c0 - fw <= kc < c0
                    # own block, raster order inside the block: earlier rows, or same row up to c
                    own = (r0 <= kr < r0 + qh and c0 <= kc < c0 + qw) and (kr < r or (kr == r and kc <= c))
                    if top or left or own:
                        keys.append((kr, kc))
            kk = torch.stack([kg[:, :, kr, kc] for kr, kc in keys], dim=2)  # b h n d
            vv = torch.stack([vg[:, :, kr, kc] for kr, kc in keys], dim=2)
            scores = torch.einsum("bhd,bhnd->bhn", qg[:, :, r, c], kk) / math.sqrt(d)
            out[:, :, r, c] = torch.einsum("bhn,bhnd->bhd", torch.softmax(scores, -1), vv)
    return out


@pytest.mark.parametrize("rows,cols,block,flange", [(4, 6, (2, 3), (1, 2)), (6, 6, (3, 2), (2, 1)), (4, 8, (2, 4), (0, 3))])
def test_local_2d_sequence_is_block_raster(rows, cols, block, flange):
    """Attention on grid cells, moved to and from the sequence with GenerationOrder."""
    gen = torch.Generator().manual_seed(5)
    qg, kg, vg = (torch.randn(1, 2, rows, cols, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    order = GenerationOrder(rows, cols, block)

    def to_seq(t):  # (b, h, rows, cols, d) -> (b, h, T, d) in generation order
        return rearrange(order.grid_to_sequence(t.permute(0, 2, 3, 1, 4)), "b t h d -> b h t d")

    def to_grid(seq, order):  # (b, h, T, d) -> (b, h, rows, cols, d)
        return order.sequence_to_grid(rearrange(seq, "b h t d -> b t h d")).permute(0, 3, 1, 2, 4)

    out_seq = attend(to_seq(qg), to_seq(kg), to_seq(vg), PatternIndex(local_2d(rows, cols, block, flange)), "sdpa")
    out_grid = to_grid(out_seq, order)
    expected = grid_reference_attention(qg, kg, vg, block, flange)
    torch.testing.assert_close(out_grid, expected, atol=1e-10, rtol=0)
    # ... and a raster-ordered input would give a different answer (the test can fail).
    raster = GenerationOrder(rows, cols)

    def to_raster(t):
        return rearrange(raster.grid_to_sequence(t.permute(0, 2, 3, 1, 4)), "b t h d -> b h t d")

    wrong = attend(to_raster(qg), to_raster(kg), to_raster(vg), PatternIndex(local_2d(rows, cols, block, flange)), "sdpa")
    wrong_grid = to_grid(wrong, raster)
    assert not torch.allclose(wrong_grid, expected, atol=1e-6)


# ----- multi-head wrapper ------------------------------------------------------------


def test_self_attention_matches_dense_per_head():
    torch.manual_seed(0)
    d, h, n = 16, 4, 20
    pattern = local_1d(n, 6, 1)
    attn = SelfAttention(d, h, PatternIndex(pattern)).double()
    x = torch.randn(2, n, d, dtype=torch.float64)
    # q, k, v written out from the fused weight, whose output rows are ordered (q|k|v, head, e)
    weight = attn.qkv.weight.view(3, h, d // h, d)
    q, k, v = (torch.einsum("btd,hed->bhte", x, weight[i]) for i in range(3))
    ref = rearrange(dense_attention(q, k, v, pattern.can_attend()), "b h t e -> b t (h e)")
    torch.testing.assert_close(attn(x), attn.proj(ref), atol=1e-10, rtol=0)
    # project_heads gives those same q, k, v (as views of one projection)
    for got, want in zip(project_heads(attn.qkv, x, h, 3), (q, k, v)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# ----- one step at a time, through the cache --------------------------------------------


def decode_in_chunks(attn, x, chunks, context=None):
    """Run x (B, T, d) through ``attn`` with a cache, ``chunks`` steps at a time (a list of
    lengths summing to T: 1s are decoding steps, longer ones prefills): (B, T, d)."""
    cache = attn.start_decoding(x.shape[0]) if context is None else attn.prepare(context)
    outputs, start = [], 0
    for length in chunks:
        part = x[:, start : start + length]
        # the model's decoding cache owns the counter: a layer is handed its start, a 0-d tensor
        outputs.append(attn(part, cache, torch.tensor(start)) if context is None else attn(part, cache))
        start += length
    return torch.cat(outputs, dim=1)


def decode_step_by_step(attn, x, context=None):
    return decode_in_chunks(attn, x, [1] * x.shape[1], context)


@pytest.mark.parametrize("gathers", [False, True], ids=["whole_cache", "gathered_keys"])
@pytest.mark.parametrize("pattern", [local_1d(20, 6, 1), local_1d(20, 4, 2), local_2d(4, 6, (2, 3), (1, 2)),
                                     local_2d(4, 24, (2, 3), (1, 2)), full_causal(20)], ids=lambda p: p.describe())
def test_cached_self_attention_equals_the_full_pass(pattern, gathers):
    # A decoding step reads the whole kv-cache or gathers its block's keys (PatternIndex.gathers): both.
    torch.manual_seed(0)
    index = PatternIndex(pattern)
    index.gathers = gathers
    attn = SelfAttention(16, 4, index).double()
    x = torch.randn(3, pattern.length, 16, dtype=torch.float64)
    with torch.no_grad():
        full = attn(x)
        cached = decode_step_by_step(attn, x)
        cache = attn.start_decoding(3)
    torch.testing.assert_close(cached, full, atol=1e-12, rtol=0)
    # the kv-cache holds fewer keys than full attention's (every step's) wherever the pattern is local
    assert (cache.keys.shape[2] < pattern.length) == (not isinstance(pattern, FullCausal))


@pytest.mark.parametrize("pattern", [local_1d(20, 6, 1), local_2d(4, 6, (2, 3), (1, 2)), full_causal(20)],
                         ids=lambda p: p.describe())
@pytest.mark.parametrize("chunks", [[20], [13, 1, 1, 5], [3, 9, 1, 7], [1, 1, 18]], ids=str)
def test_prefills_and_steps_mixed_equal_the_full_pass(pattern, chunks):
    """The same forward takes any number of steps with the cache: a prefill longer than the cache,
    then steps, then another prefill, leave the cache as single steps would."""
    torch.manual_seed(0)
    attn = SelfAttention(16, 4, PatternIndex(pattern)).double()
    x = torch.randn(2, pattern.length, 16, dtype=torch.float64)
    with torch.no_grad():
        rest = [pattern.length - sum(chunks)] if pattern.length > sum(chunks) else []
        torch.testing.assert_close(decode_in_chunks(attn, x, chunks + rest), attn(x), atol=1e-12, rtol=0)


def prefill_reads(monkeypatch, attn, x, length):
    """What a prefill of ``x``'s first ``length`` steps through ``attn``'s cache attends, counted at
    ``attention.attend_in_blocks``: the blocks of every call."""
    calls = []

    def counted(q, k, v, blocks):
        calls.append(blocks)
        return attend_in_blocks(q, k, v, blocks)

    with monkeypatch.context() as patched, torch.no_grad():
        patched.setattr(attention, "attend_in_blocks", counted)
        attn(x[:, :length], attn.start_decoding(x.shape[0]), torch.tensor(0))
    return calls


@pytest.mark.parametrize("pattern", [local_1d(240, 6, 1), local_2d(24, 12, (2, 3), (1, 2))], ids=lambda p: p.describe())
def test_a_prefill_is_the_full_pass_over_its_steps(pattern, monkeypatch):
    """A prefill of t steps is one call over the full pass's blocks that its steps fall in: the pairs
    the full pass spends on them, linear in t, under the index's own masks (no (t, cache + t) mask
    is built; docs/model.md §7)."""
    torch.manual_seed(0)
    index = PatternIndex(pattern)
    attn = SelfAttention(16, 4, index)
    x = torch.randn(1, pattern.length, 16)
    block_length, keys = pattern.block_length, index.key_steps.shape[1]
    for length in (4 * block_length + 1, 8 * block_length + 1):
        (blocks,) = prefill_reads(monkeypatch, attn, x, length)
        n_blocks = -(-length // block_length)
        assert pairs_computed(blocks) == n_blocks * block_length * keys
        assert blocks.can_attend.data_ptr() == index.can_attend.data_ptr()  # a view of the index's masks


def test_a_cache_that_forgets_a_key_is_caught(monkeypatch):
    """Negative control: a kv-cache one step short loses the oldest key a step still reads."""
    torch.manual_seed(0)
    monkeypatch.setattr(patterns, "reach", lambda blocks, length, reach=patterns.reach: reach(blocks, length) - 1)
    attn = SelfAttention(16, 4, PatternIndex(local_1d(20, 6, 1))).double()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    with torch.no_grad():
        assert attn.start_decoding(2).keys.shape[2] == 11
        assert not torch.allclose(decode_step_by_step(attn, x), attn(x), atol=1e-6)


def test_cached_cross_attention_equals_the_full_pass():
    torch.manual_seed(0)
    attn = CrossAttention(16, 4).double()
    x, context = torch.randn(2, 48, 16, dtype=torch.float64), torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        full = attn(x, attn.prepare(context))  # every step's queries at once
        cached = decode_step_by_step(attn, x, context)
    torch.testing.assert_close(cached, full, atol=1e-12, rtol=0)
