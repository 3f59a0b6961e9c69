"""2D decoding costs what the pattern does: a prefill computes no more query-key pairs than the full
pass spends on the same queries, and a decoding step no more than its query block's keys, at every
image width, though a 2D kv-cache grows with the width. Counted where the work is done:
``scaled_dot_product_attention``, which every attention path of ``imagetx.model.attention`` calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from imagetx.model.attention import SelfAttention
from imagetx.model.flops import pairs_computed
from imagetx.model.patterns import GenerationOrder, Local2D, PatternIndex

SIZES = (32, 64, 128)  # image sizes, px: the kv-cache grows with the width, the blocks' keys do not
# (columns per image column, query block, flange): a small DMOL pattern (kv-caches of
# 384 / 640 / 1,152 steps) and configs/cifar10_2d.yaml's categorical one (3 sub-pixels a pixel)
PATTERNS = {"dmol_8x8": (1, (8, 8), (8, 8)), "cifar10_2d": (3, (16, 16), (16, 32))}
D_MODEL, N_HEADS = 8, 2  # the count does not depend on them: small, so 128 px runs in seconds


def pattern_at(name: str, size: int) -> Local2D:
    per_pixel, block, flange = PATTERNS[name]
    return Local2D(GenerationOrder(size, size * per_pixel, block), flange)


def counted_pairs(monkeypatch, run) -> int:
    """Query-key pairs per image and head that ``run()`` computes, over every SDPA call (masked pairs
    included, as the kernel computes them; a causal call's upper half skipped, as
    ``pairs_computed`` counts it)."""
    sdpa, pairs = F.scaled_dot_product_attention, []

    def counting(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        queries, keys = q.shape[-2], k.shape[-2]
        per_head = queries * (queries + 1) // 2 if is_causal else queries * keys
        pairs.append(q.shape[:-3].numel() * per_head)  # leading axes: the blocks of one fused call
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    with monkeypatch.context() as patched, torch.no_grad():
        patched.setattr(F, "scaled_dot_product_attention", counting)
        run()
    return sum(pairs)


def prefill(attn: SelfAttention, x, length: int):
    return attn(x[:, :length], attn.start_decoding(x.shape[0]), torch.tensor(0))


# The small pattern at every size; the paper's categorical one at 32 px only (at 128 px it is 49,152 steps).
CASES = [("dmol_8x8", size) for size in SIZES] + [("cifar10_2d", SIZES[0])]


@pytest.mark.parametrize("name, size", CASES)
def test_a_2d_prefill_costs_no_more_than_the_full_pass(name, size, monkeypatch):
    pattern = pattern_at(name, size)
    attn = SelfAttention(D_MODEL, N_HEADS, PatternIndex(pattern), kernel="sdpa")
    x = torch.randn(1, pattern.length, D_MODEL)
    full = pairs_computed(pattern.blocks())
    # every step prefilled, the most a prefill does; and a completion's, every image row but the last
    last_row_start = pattern.length - size * PATTERNS[name][0]
    for length in (pattern.length, last_row_start):
        pairs = counted_pairs(monkeypatch, lambda: prefill(attn, x, length))
        assert pairs <= full, f"{pattern.describe()} at {size} px: prefill of {length} " \
                              f"steps {pairs / full:.2f}x the full pass"


@pytest.mark.parametrize("name, size", CASES)
def test_a_2d_decoding_step_reads_at_most_twice_its_blocks_keys(name, size, monkeypatch):
    # The whole kv-cache in place where it holds at most twice a block's S keys, else those S gathered:
    # at 128 px the cache (1,152 steps) is 3.6 times a block's keys.
    pattern = pattern_at(name, size)
    attn = SelfAttention(D_MODEL, N_HEADS, PatternIndex(pattern), kernel="sdpa")
    cache = attn.start_decoding(1)
    x = torch.randn(1, 1, D_MODEL)
    pairs = counted_pairs(monkeypatch, lambda: attn(x, cache, torch.tensor([pattern.length // 2])[0]))
    keys, length = attn.index.key_steps.shape[1], cache.keys.shape[2]
    assert pairs == (keys if attn.index.gathers else length) <= 2 * keys, (pairs, keys, length)
    assert attn.index.gathers == (size == SIZES[-1] and name == "dmol_8x8")


@pytest.mark.parametrize("name", PATTERNS)
def test_the_full_pass_computes_what_pairs_computed_says(name, monkeypatch):
    # the yardstick above, tied to the SDPA path it describes
    pattern = pattern_at(name, SIZES[0])
    attn = SelfAttention(D_MODEL, N_HEADS, PatternIndex(pattern), kernel="sdpa")
    x = torch.randn(1, pattern.length, D_MODEL)
    assert counted_pairs(monkeypatch, lambda: attn(x)) == pairs_computed(pattern.blocks())


@pytest.mark.parametrize("name", PATTERNS)
def test_a_2d_prefill_then_steps_equal_the_full_pass(name):
    # the cheaper reads give the full pass's outputs: a prefill that ends inside a query block,
    # then single steps across the next block's start
    pattern = pattern_at(name, SIZES[0])
    torch.manual_seed(0)
    attn = SelfAttention(D_MODEL, N_HEADS, PatternIndex(pattern), kernel="sdpa").double()
    x = torch.randn(2, pattern.length, D_MODEL, dtype=torch.float64)
    given = 3 * pattern.block_length - 5
    with torch.no_grad():
        full = attn(x)
        cache = attn.start_decoding(2)
        parts = [attn(x[:, :given], cache, torch.tensor(0))]
        parts += [attn(x[:, s: s + 1], cache, torch.tensor(s)) for s in range(given, given + 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full[:, : given + 10], atol=1e-12, rtol=0)
