"""Local self-attention patterns and multi-head attention (SPEC §3, §4).

Every pattern answers two questions about a sequence in generation order:

* ``can_attend()`` — the dense boolean ``can_attend[query, key]`` matrix (True = the
  query may attend to the key), built by comparing position indices. It is the
  reference: ``dense_attention`` with it defines the right answer.
* ``attend(q, k, v)`` — the fast path, computed block by block at a cost of
  O(n·(lq + lm)·d), never by masking an n×n matrix. Tests prove the two equal.

Shapes: q, k, v are (batch, heads, length, head_dim) in generation order.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .order import GenerationOrder


def dense_attention(q: Tensor, k: Tensor, v: Tensor, can_attend: Tensor) -> Tensor:
    """Reference softmax attention over an explicit (Tq, Tk) ``can_attend`` matrix.

    Written out by hand (no fused kernel) so the fast paths have something
    independent to be compared with. A query with no allowed key gets zeros.
    """
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~can_attend, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v)


def cross_can_attend(query_cells: tuple[Tensor, Tensor], key_cells: tuple[Tensor, Tensor], radius: int) -> Tensor:
    """(Tq, Tk) local cross-attention: True where the key's low-resolution cell lies
    within ``radius`` rows and columns of the query's. Cells are (rows, cols) index
    tensors on the same low-resolution grid."""
    (q_rows, q_cols), (k_rows, k_cols) = query_cells, key_cells
    near_row = (q_rows[:, None] - k_rows[None, :]).abs() <= radius
    near_col = (q_cols[:, None] - k_cols[None, :]).abs() <= radius
    return near_row & near_col


class LocalCrossAttention(nn.Module):
    """Cross-attention limited by a fixed (Tq, Tk) ``can_attend`` (True = may attend), run
    on the keys it allows only.

    Queries whose rows of ``can_attend`` are equal (the decoder positions over one
    low-resolution cell) form groups of equal size; each group is attended against its
    own gathered keys, as the batch of one 4-D fused call. With radius 0 that is 3 keys
    per query instead of masking all 192. ``dense_attention`` with ``can_attend`` is the
    reference.
    """

    def __init__(self, can_attend: Tensor) -> None:
        super().__init__()
        if not can_attend.any(dim=1).all():
            raise ValueError("local cross-attention: every query needs at least one key it may attend to")
        _, set_of_query = torch.unique(can_attend, dim=0, return_inverse=True)
        # Groups of equal size: each set's queries cut into runs of the gcd of the set sizes
        # (sets can differ in size where cells at the edge share a neighbourhood).
        query_order = torch.argsort(set_of_query, stable=True)
        size = math.gcd(*torch.bincount(set_of_query).tolist())
        rows = can_attend[query_order[::size]]  # (groups, Tk): the key set of each group
        n_keys = int(rows.sum(dim=1).max())
        # Each group's allowed keys first (stable sort keeps them in index order), padded
        # with disallowed ones that the mask hides.
        key_index = torch.argsort((~rows).to(torch.int8), dim=1, stable=True)[:, :n_keys]
        key_allowed = torch.gather(rows, 1, key_index)
        self.register_buffer("can_attend", can_attend, persistent=False)
        self.register_buffer("query_order", query_order, persistent=False)
        self.register_buffer("query_position", torch.argsort(query_order), persistent=False)
        self.register_buffer("key_index", key_index, persistent=False)
        # None when every group sees equally many keys: no mask lets SDPA use its fused kernel.
        self.register_buffer("key_allowed", None if key_allowed.all() else key_allowed[:, None, :], persistent=False)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q (B, h, Tq, d), k and v (B, h, Tk, d) -> (B, h, Tq, d)."""
        n_groups = self.key_index.shape[0]
        queries = rearrange(q[:, :, self.query_order], "b h (g n) d -> (b h) g n d", g=n_groups)
        keys, values = (rearrange(t[:, :, self.key_index], "b h g s d -> (b h) g s d") for t in (k, v))
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.key_allowed)
        out = rearrange(out, "(b h) g n d -> b h (g n) d", b=q.shape[0])
        return out[:, :, self.query_position]


class AttentionPattern:
    """Which keys each query sees, over a sequence of ``length`` positions.

    Two layouts of the same computation: ``attend`` takes (batch, heads, T, d);
    ``attend_folded`` takes sequence-first (T, batch·heads, d), the layout the
    projections produce without copies. A pattern implements either one.
    """

    length: int

    def can_attend(self) -> Tensor:
        raise NotImplementedError

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        batch = q.shape[0]
        q, k, v = (rearrange(t, "b h t d -> t (b h) d") for t in (q, k, v))
        return rearrange(self.attend_folded(q, k, v), "t (b h) d -> b h t d", b=batch)

    def attend_folded(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (rearrange(t, "t n d -> 1 n t d") for t in (q, k, v))
        return rearrange(self.attend(q, k, v), "1 n t d -> t n d")

    def describe(self) -> str:
        return type(self).__name__


class FullCausal(AttentionPattern):
    """Every query sees every earlier position and itself: the O(n²) baseline."""

    def __init__(self, length: int) -> None:
        self.length = length

    def can_attend(self) -> Tensor:
        steps = torch.arange(self.length)
        return steps[None, :] <= steps[:, None]

    def attend_folded(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = (rearrange(t, "t n d -> 1 n t d") for t in (q, k, v))  # views
        return rearrange(F.scaled_dot_product_attention(q, k, v, is_causal=True), "1 n t d -> t n d")


class Local1D(AttentionPattern):
    """Query blocks of ``block_length`` positions in raster order (SPEC §4, 1D).

    A query sees every position of the previous ``memory_blocks`` blocks and its own
    block up to and including itself. The sequence's end is padded to whole blocks;
    padding comes after every real position, so causality alone keeps it unseen.
    """

    def __init__(self, length: int, block_length: int, memory_blocks: int = 1) -> None:
        self.length, self.block_length, self.memory_blocks = length, block_length, memory_blocks

    def can_attend(self) -> Tensor:
        steps = torch.arange(self.length)
        query, key = steps[:, None], steps[None, :]
        query_block, key_block = query // self.block_length, key // self.block_length
        return (key <= query) & (key_block >= query_block - self.memory_blocks)

    def attend_folded(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(T, N, d) sequence-first -> (T, N, d), N = batch·heads.

        Blocks 0..m−1 have every earlier position in memory: one causal call. Every
        later block b needs the window of blocks [b−m, b]. Windows that start at
        blocks s, s+(m+1), s+2(m+1), … do not overlap, so for each s in 0..m they are
        a plain view of k and v (no gathered copies); the last block of each window
        is queried against the whole window with one shared (lq, (m+1)·lq) mask.
        """
        lq, m, length = self.block_length, self.memory_blocks, q.shape[0]
        n_blocks = -(-length // lq)
        pad = n_blocks * lq - length
        if pad:  # padding comes after every real position: causality keeps it unseen
            q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        out = q.new_empty(q.shape)
        head = min(m, n_blocks) * lq
        first = F.scaled_dot_product_attention(*(rearrange(t[:head], "t n d -> 1 n t d") for t in (q, k, v)),
                                               is_causal=True)
        out[:head] = rearrange(first, "1 n t d -> t n d")
        window = (m + 1) * lq
        can_attend = torch.ones(lq, window, dtype=torch.bool, device=q.device).tril(m * lq)
        blocks_out = rearrange(out, "(b l) n d -> b l n d", l=lq)
        for s in range(m + 1):
            n_windows = -(-(n_blocks - m - s) // (m + 1))
            if n_windows <= 0:
                continue
            span = slice(s * lq, (s + n_windows * (m + 1)) * lq)
            # windows: (w, n, (m+1)·lq, d) views; queries: the last block of each window
            keys, values = (rearrange(t[span], "(w l) n d -> w n l d", l=window) for t in (k, v))
            queries = rearrange(q[span], "(w j l) n d -> w j n l d", j=m + 1, l=lq)[:, m]
            attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend)
            first_block = s + m
            blocks_out[first_block : first_block + n_windows * (m + 1) : m + 1] = rearrange(
                attended, "w n l d -> w l n d")
        return out[:length]

    def describe(self) -> str:
        return f"Local1D(lq={self.block_length}, memory_blocks={self.memory_blocks})"


class Local2D(AttentionPattern):
    """Query blocks of qh×qw grid cells with a memory flange (SPEC §4, 2D).

    The sequence is in block-raster order. A block with top-left cell (r0, c0) sees
    the top flange rows [r0−fh, r0) × cols [c0−fw, c0+qw+fw), the left flange rows
    [r0, r0+qh) × cols [c0−fw, c0), and itself causally. Cells outside the grid are
    never attended.
    """

    def __init__(self, rows: int, cols: int, block: tuple[int, int], flange: tuple[int, int]) -> None:
        self.order = GenerationOrder(rows, cols, block)
        self.length = rows * cols
        self.block, self.flange = tuple(block), tuple(flange)
        self._block_keys: tuple[Tensor, Tensor] | None = None

    def can_attend(self) -> Tensor:
        (qh, qw), (fh, fw) = self.block, self.flange
        rows, cols = self.order.cell_of_step()
        steps = torch.arange(self.length)
        r0, c0 = (rows // qh * qh)[:, None], (cols // qw * qw)[:, None]  # query block corner
        key_row, key_col = rows[None, :], cols[None, :]
        top = (key_row >= r0 - fh) & (key_row < r0) & (key_col >= c0 - fw) & (key_col < c0 + qw + fw)
        left = (key_row >= r0) & (key_row < r0 + qh) & (key_col >= c0 - fw) & (key_col < c0)
        same_block = (key_row // qh * qh == r0) & (key_col // qw * qw == c0)
        own = same_block & (steps[None, :] <= steps[:, None])
        return top | left | own

    def block_keys(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Every block's keys as generation steps, and which each of its queries may see.

        -> key_steps (n_blocks, M + L), M flange cells and L = qh·qw block cells: the top
        flange (raster), the left flange, then the block itself; a cell outside the grid is
        step T, which ``attend_folded`` maps to a zero key. can_attend (n_blocks, L, M + L): inside-the-grid flange cells, and the
        block's own cells causally.
        """
        if self._block_keys is None or self._block_keys[0].device != device:
            (qh, qw), (fh, fw) = self.block, self.flange
            block_len = qh * qw
            # Step numbers laid on the grid, padded with 0 ("outside") above and either side;
            # windows: nh, nw, fh+qh, qw+2fw — each block's rows and columns of context.
            steps = self.order.sequence_to_grid(torch.arange(1, self.length + 1)[None])[0]
            windows = F.pad(steps, (fw, fw, fh, 0)).unfold(0, fh + qh, qh).unfold(1, qw + 2 * fw, qw)
            top = rearrange(windows[:, :, :fh, :], "nh nw r c -> (nh nw) (r c)")
            left = rearrange(windows[:, :, fh:, :fw], "nh nw r c -> (nh nw) (r c)")
            own = rearrange(torch.arange(1, self.length + 1), "(n l) -> n l", l=block_len)
            key_steps = torch.cat([top, left, own], dim=1) - 1  # -1: outside the grid
            n_blocks, n_memory = top.shape[0], top.shape[1] + left.shape[1]
            causal = torch.ones(block_len, block_len, dtype=torch.bool).tril()
            memory = (key_steps[:, None, :n_memory] >= 0).expand(-1, block_len, -1)
            can_attend = torch.cat([memory, causal.expand(n_blocks, -1, -1)], dim=2)
            key_steps = key_steps.masked_fill(key_steps < 0, self.length)
            self._block_keys = (key_steps.to(device), can_attend.to(device))
        return self._block_keys

    def attend_folded(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(T, N, d) sequence-first in block-raster order -> (T, N, d), N = batch·heads.

        Each block's keys are gathered with one index_select (an appended zero row
        stands for cells outside the grid), and the blocks run as the batch axis of
        one 4-D fused attention call with a per-block mask.
        """
        key_steps, can_attend = self.block_keys(q.device)
        n_blocks, n_keys = key_steps.shape
        zero = q.new_zeros(1, *q.shape[1:])
        keys, values = (rearrange(torch.cat([t, zero]).index_select(0, key_steps.flatten()),
                                  "(n s) N d -> n N s d", s=n_keys) for t in (k, v))
        queries = rearrange(q, "(n l) N d -> n N l d", n=n_blocks)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend[:, None])
        return rearrange(out, "n N l d -> (n l) N d")

    def describe(self) -> str:
        return f"Local2D(query={self.block}, flange={self.flange})"


def pattern_for(config, length: int | None = None) -> AttentionPattern:
    """The self-attention pattern a decoder built from ``config`` uses."""
    rows, cols = config.grid_shape
    length = rows * cols if length is None else length
    if config.attention == "full":
        return FullCausal(length)
    if config.attention == "local_1d":
        return Local1D(length, config.query_block_length, config.memory_blocks)
    return Local2D(rows, cols, config.query_block_shape, config.memory_flange)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-attention under a pattern, or unmasked (encoder, cross)."""

    def __init__(self, d_model: int, n_heads: int, pattern: AttentionPattern | None = None) -> None:
        super().__init__()
        self.n_heads, self.pattern = n_heads, pattern
        # T2T's attention projections carry no bias.
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_k = nn.Linear(d_model, d_model, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def split_heads(self, x: Tensor) -> Tensor:
        return rearrange(x, "b t (h d) -> b h t d", h=self.n_heads)

    def merge_heads(self, x: Tensor) -> Tensor:
        return self.to_out(rearrange(x, "b h t d -> b t (h d)"))

    def forward(self, x: Tensor, context: Tensor | None = None, local: LocalCrossAttention | None = None) -> Tensor:
        """Self-attention under the pattern, or attention to ``context`` (cross-attention),
        over every context position or, with ``local``, only those it allows."""
        if context is None and self.pattern is not None:
            return self.self_attend(x)
        source = x if context is None else context
        q, k, v = (self.split_heads(proj(inp)) for proj, inp in
                   ((self.to_q, x), (self.to_k, source), (self.to_v, source)))
        if local is not None:
            out = local.attend(q, k, v)
        elif self.pattern is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = self.pattern.attend(q, k, v)
        return self.merge_heads(out)

    def self_attend(self, x: Tensor) -> Tensor:
        """Self-attention under the pattern in the sequence-first layout: the
        projections of (T, B, d) fold heads into the batch axis as views."""
        x = rearrange(x, "b t d -> t b d")
        q, k, v = (rearrange(proj(x), "t b (h d) -> t (b h) d", h=self.n_heads)
                   for proj in (self.to_q, self.to_k, self.to_v))
        out = self.pattern.attend_folded(q, k, v)
        out = self.to_out(rearrange(out, "t (b h) d -> t b (h d)", h=self.n_heads))
        return rearrange(out, "t b d -> b t d")
