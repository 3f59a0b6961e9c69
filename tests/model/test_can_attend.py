"""The can_attend matrices against an independent description written with plain loops.

docs/model.md §1 (orders of generation) and §4 (which key each query may see). Nothing here
reuses library code to build the expected answer: orders and masks are spelled out
cell by cell.
"""

from __future__ import annotations

import pytest
import torch

from helpers import random_images, tiny_model
from imagetx.codec.whole_ring import step_masks
from imagetx.model.patterns import FullCausal, GenerationOrder, Local1D, Local2D, PatternIndex, pattern_for, reach

# ----- independent references ------------------------------------------------------


def reference_local_1d(length: int, block: int, memory: int) -> list[list[bool]]:
    """Query i in block b sees blocks b-m..b-1 entirely and block b up to i."""
    out = []
    for i in range(length):
        b = i // block
        row = []
        for j in range(length):
            kb = j // block
            in_memory = max(0, b - memory) <= kb <= b - 1
            in_own = kb == b and j <= i
            row.append(in_memory or in_own)
        out.append(row)
    return out


def block_raster_cells(rows: int, cols: int, qh: int, qw: int) -> list[tuple[int, int]]:
    """Grid cells in block-raster order: blocks in raster order, cells inside a block in raster order."""
    cells = []
    for br in range(rows // qh):
        for bc in range(cols // qw):
            for r in range(qh):
                for c in range(qw):
                    cells.append((br * qh + r, bc * qw + c))
    return cells


def reference_local_2d(rows: int, cols: int, block, flange) -> list[list[bool]]:
    (qh, qw), (fh, fw) = block, flange
    cells = block_raster_cells(rows, cols, qh, qw)
    step_of = {cell: step for step, cell in enumerate(cells)}
    n = len(cells)
    out = [[False] * n for _ in range(n)]
    for i, (r, c) in enumerate(cells):
        r0, c0 = (r // qh) * qh, (c // qw) * qw
        allowed = set()
        for kr in range(r0 - fh, r0):  # top flange
            for kc in range(c0 - fw, c0 + qw + fw):
                allowed.add((kr, kc))
        for kr in range(r0, r0 + qh):  # left flange
            for kc in range(c0 - fw, c0):
                allowed.add((kr, kc))
        for kr in range(r0, r0 + qh):  # own block, causally
            for kc in range(c0, c0 + qw):
                if step_of[(kr, kc)] <= i:
                    allowed.add((kr, kc))
        for kr, kc in allowed:
            if 0 <= kr < rows and 0 <= kc < cols:  # clip to the grid
                out[i][step_of[(kr, kc)]] = True
    return out


def as_lists(mask: torch.Tensor) -> list[list[bool]]:
    return [[bool(x) for x in row] for row in mask.tolist()]


CASES_1D = [
    (10, 4, 0), (10, 4, 1), (10, 4, 2), (10, 4, 3), (16, 4, 1), (7, 8, 1), (1, 4, 0),
    (13, 5, 2), (12, 3, 6), (5, 1, 1), (5, 1, 0), (24, 6, 1),
]

CASES_2D = [
    (4, 6, (2, 3), (1, 2)),
    (4, 6, (2, 3), (0, 2)),   # fh = 0
    (4, 6, (2, 3), (2, 0)),   # fw = 0, flange height equal to block height
    (4, 6, (2, 2), (1, 5)),   # flange wider than the block
    (6, 6, (2, 2), (2, 3)),
    (4, 4, (1, 1), (1, 1)),
    (4, 8, (4, 2), (3, 4)),
    (2, 4, (2, 4), (1, 1)),   # one block row
    (4, 12, (2, 3), (0, 0)),  # no flange at all
    (6, 9, (3, 3), (1, 4)),
    (8, 8, (2, 4), (2, 2)),
    (6, 6, (2, 3), (4, 1)),   # flange taller than the block: two block rows above
    (8, 4, (1, 2), (3, 1)),   # three rows above one-row blocks
]


# ----- 1D -------------------------------------------------------------------------


@pytest.mark.parametrize("length,block,memory", CASES_1D)
def test_local_1d_matches_loop_reference(length, block, memory):
    mask = Local1D(GenerationOrder(1, length), block, memory).can_attend()
    assert mask.dtype == torch.bool and mask.shape == (length, length)
    assert as_lists(mask) == reference_local_1d(length, block, memory)


def test_local_1d_t2t_example():
    # lq = 4, one memory block: query 9 (block 2) sees 4..9 and nothing else.
    mask = Local1D(GenerationOrder(1, 12), 4, 1).can_attend()
    assert mask[9].nonzero().flatten().tolist() == [4, 5, 6, 7, 8, 9]
    assert mask[3].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]


def test_full_causal_matches_loop_reference():
    n = 9
    expected = [[j <= i for j in range(n)] for i in range(n)]
    assert as_lists(FullCausal(GenerationOrder(1, n)).can_attend()) == expected


# ----- 2D -------------------------------------------------------------------------


@pytest.mark.parametrize("rows,cols,block,flange", CASES_2D)
def test_local_2d_matches_loop_reference(rows, cols, block, flange):
    mask = Local2D(GenerationOrder(rows, cols, block), flange).can_attend()
    assert mask.dtype == torch.bool and mask.shape == (rows * cols, rows * cols)
    assert as_lists(mask) == reference_local_2d(rows, cols, block, flange)


def test_local_2d_hand_example():
    # 4×6 grid, blocks 2×3, flange (1, 2). Block-raster order:
    #   block (0,0): steps 0-5, block (0,3): 6-11, block (2,0): 12-17, block (2,3): 18-23.
    # Query at cell (3, 4) is in block (2,3), cell index 4 inside it -> step 22.
    # It sees the top flange row 1, cols 1..5 (cols 6, 7 are outside the grid),
    # the left flange rows 2-3, cols 1-2, and its own block up to itself.
    mask = Local2D(GenerationOrder(4, 6, (2, 3)), (1, 2)).can_attend()
    cells = block_raster_cells(4, 6, 2, 3)
    assert cells[22] == (3, 4)
    seen = sorted(cells[j] for j in mask[22].nonzero().flatten().tolist())
    expected = sorted(
        [(1, c) for c in range(1, 6)]
        + [(2, 1), (2, 2), (3, 1), (3, 2)]
        + [(2, 3), (2, 4), (2, 5), (3, 3), (3, 4)]
    )
    assert seen == expected


# ----- properties every pattern must have -----------------------------------------


def all_patterns():
    pats = [Local1D(GenerationOrder(1, n), b, m) for n, b, m in CASES_1D]
    pats += [Local2D(GenerationOrder(r, c, b), f) for r, c, b, f in CASES_2D]
    pats += [FullCausal(GenerationOrder(1, n)) for n in (1, 5, 12)]
    return pats


@pytest.mark.parametrize("pattern", all_patterns(), ids=lambda p: f"{p.describe()}-{p.length}")
def test_causal_and_sees_itself(pattern):
    mask = pattern.can_attend()
    n = pattern.length
    for i in range(n):
        assert mask[i, i], f"query {i} does not see itself"
        for j in range(i + 1, n):
            assert not mask[i, j], f"query {i} sees the later step {j}"


def blocks_laid_out(pattern, blocks=None) -> torch.Tensor:
    """The pattern's blocks (``pattern.blocks()``, or those given: a model's) laid back onto a
    dense (T, T) matrix by hand."""
    blocks = pattern.blocks() if blocks is None else blocks
    n = pattern.length
    dense = torch.zeros(n, n + 1, dtype=torch.bool)  # column n: the zero key
    for b in range(blocks.key_steps.shape[0]):
        for l in range(blocks.can_attend.shape[1]):
            query = b * blocks.can_attend.shape[1] + l
            if query >= n:
                continue  # end padding
            for s, key in enumerate(blocks.key_steps[b].tolist()):
                if blocks.can_attend[b, l, s]:
                    assert key < n, f"query {query} may read the zero key"
                    dense[query, key] = True
    return dense[:, :n]


@pytest.mark.parametrize("pattern", all_patterns(), ids=lambda p: f"{p.describe()}-{p.length}")
def test_blocks_spell_out_exactly_can_attend(pattern):
    # The blocks that the training pass and the decoding ring are read from are the reference.
    assert torch.equal(blocks_laid_out(pattern), pattern.can_attend())


def test_the_blocks_follow_the_rule_and_a_kv_cache_refuses_one_that_is_not_causal():
    # One definition: the blocks' masks are the rule on the keys where the blocks look, so a rule
    # that also lets a query see the key after it shows in them (inside a block), and the ring,
    # sized from them, refuses it.
    pattern = Local1D(GenerationOrder(1, 12), 4, 1)
    honest = pattern.mask_rule()
    pattern.mask_rule = lambda: (lambda query, key: honest(query, key) | (key == query + 1))
    seen = blocks_laid_out(pattern)
    assert seen[1, 2] and seen[5, 6] and not seen[3, 4]  # 4 is in the next block, where block 0 does not look
    with pytest.raises(ValueError, match="cached decoding needs a causal pattern"):
        reach(pattern.blocks(), pattern.length)


@pytest.mark.parametrize("pattern", all_patterns(), ids=lambda p: f"{p.describe()}-{p.length}")
def test_the_kv_cache_holds_the_widest_reach_and_the_step_itself(pattern):
    # A step's key is kept, then the step reads its block's keys: the cache must hold the keys back to
    # the farthest one any step reads, and its own, and need hold no more (tests/model/test_attention.py:
    # decoding through it equals the full pass; one step fewer does not).
    mask = pattern.can_attend()
    widest = max(t - int(mask[t].nonzero().min()) for t in range(pattern.length))
    assert reach(pattern.blocks(), pattern.length) == max(1, widest)
    assert PatternIndex(pattern).cache_length == max(1, widest) + 1


@pytest.mark.parametrize("pattern", all_patterns(), ids=lambda p: f"{p.describe()}-{p.length}")
def test_the_codecs_whole_ring_masks_are_the_dense_matrix_at_the_steps_its_ring_holds(pattern):
    # Formats 1 to 6 (imagetx/codec/whole_ring.py): step s's row, slot j holding the latest step before
    # s that is j modulo the ring (none yet: unseen), the last column s itself; at the ring those
    # formats used and at one slot fewer.
    mask = pattern.can_attend()
    ring = reach(pattern.blocks(), pattern.length)
    for slots in {ring, max(1, ring - 1)}:
        expected = torch.zeros(pattern.length, slots + 1, dtype=torch.bool)
        for step in range(pattern.length):
            for slot in range(slots):
                held = [earlier for earlier in range(step) if earlier % slots == slot]
                expected[step, slot] = bool(held) and bool(mask[step, held[-1]])
            expected[step, slots] = mask[step, step]
        assert torch.equal(step_masks(pattern.blocks(), pattern.length, slots), expected), slots


@pytest.mark.parametrize("rows,cols,block,flange", CASES_2D)  # tall flanges included
def test_2d_flange_is_generated_before_the_block(rows, cols, block, flange):
    (qh, qw) = block
    block_len = qh * qw
    mask = Local2D(GenerationOrder(rows, cols, block), flange).can_attend()
    for i in range(rows * cols):
        first = (i // block_len) * block_len  # first step of the query's block
        for j in mask[i].nonzero().flatten().tolist():
            if not first <= j < first + block_len:
                assert j < first, f"flange key {j} of query {i} is generated after the block starts at {first}"


def test_2d_flange_count_in_the_interior():
    # A block away from every edge sees exactly fh·(qw+2fw) + qh·fw flange cells.
    rows, cols, (qh, qw), (fh, fw) = 6, 12, (2, 3), (1, 2)
    mask = Local2D(GenerationOrder(rows, cols, (qh, qw)), (fh, fw)).can_attend()
    cells = block_raster_cells(rows, cols, qh, qw)
    step = cells.index((2, 3))  # top-left cell of an interior block
    assert int(mask[step].sum()) == fh * (qw + 2 * fw) + qh * fw + 1


# ----- orders -----------------------------------------------------------------------


@pytest.mark.parametrize("rows,cols,block", [(4, 6, None), (4, 6, (2, 3)), (6, 9, (3, 3)), (4, 8, (4, 2)), (3, 5, None)])
def test_grid_sequence_round_trip(rows, cols, block):
    order = GenerationOrder(rows, cols, block)
    grid = torch.randn(2, rows, cols, 3)
    seq = order.grid_to_sequence(grid)
    assert seq.shape == (2, rows * cols, 3)
    assert torch.equal(order.sequence_to_grid(seq), grid)
    seq2 = torch.randn(2, rows * cols)
    assert torch.equal(order.grid_to_sequence(order.sequence_to_grid(seq2)), seq2)


@pytest.mark.parametrize("rows,cols,block", [(4, 6, (2, 3)), (6, 9, (3, 3)), (4, 8, (4, 2)), (4, 6, (1, 6)), (4, 6, None)])
def test_order_is_block_raster(rows, cols, block):
    order = GenerationOrder(rows, cols, block)
    if block is None:
        expected = [(r, c) for r in range(rows) for c in range(cols)]
    else:
        expected = block_raster_cells(rows, cols, *block)
    # grid_to_sequence on a grid whose entries name their own cell
    grid = torch.tensor([[[r, c] for c in range(cols)] for r in range(rows)])[None]
    seq = order.grid_to_sequence(grid)[0]
    assert [tuple(x) for x in seq.tolist()] == expected
    step_rows, step_cols = order.grid_cell()
    assert list(zip(step_rows.tolist(), step_cols.tolist())) == expected


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_model_targets_follow_generation_order(head, attention):
    model = tiny_model(head=head, attention=attention, query_block_shape=(2, 2))
    images = random_images(2, 4, seed=3)
    targets = model.targets(images)
    rows, cols = (4, 12) if head == "categorical" else (4, 4)
    cells = block_raster_cells(rows, cols, 2, 2) if attention == "local_2d" else \
        [(r, c) for r in range(rows) for c in range(cols)]
    for b in range(2):
        for step, (r, c) in enumerate(cells):
            if head == "categorical":  # column = 3·pixel column + channel
                assert targets[b, step] == images[b, r, c // 3, c % 3]
            else:
                assert targets[b, step].tolist() == images[b, r, c].tolist()


@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_model_pattern_matches_reference(head, attention):
    model = tiny_model(head=head, attention=attention, query_block_length=5, memory_blocks=2,
                       query_block_shape=(2, 2), memory_flange=(1, 3))
    rows, cols = (4, 12) if head == "categorical" else (4, 4)
    n = rows * cols
    if attention == "local_1d":
        expected = reference_local_1d(n, 5, 2)
    elif attention == "local_2d":
        expected = reference_local_2d(rows, cols, (2, 2), (1, 3))
    else:
        expected = [[j <= i for j in range(n)] for i in range(n)]
    assert as_lists(model.pattern.can_attend()) == expected
    assert as_lists(pattern_for(model.config).can_attend()) == expected
    for layer in model.layers:  # what each layer reads: its index's gathered blocks
        assert as_lists(blocks_laid_out(model.pattern, layer.self_attn.index.blocks)) == expected
