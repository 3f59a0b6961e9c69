"""Local self-attention patterns and multi-head attention (docs/model.md §3, §4).

One layout throughout: q, k, v are sequence-first (T, N, e), N = batch·heads and e the
head size, the layout the projections of a (T, B, d) input give as views.

Every pattern answers two questions about a sequence in generation order:

* ``can_attend()``: the dense boolean ``can_attend[query, key]`` matrix (True = the
  query may attend to the key), built by comparing position indices. It is the
  reference: ``dense_attention`` with it defines the right answer.
* ``attend(q, k, v)``: the fast path, computed block by block at a cost of
  O(n·(lq + lm)·d), never by masking an n×n matrix. Tests prove the two equal.

Decoding one step at a time, ``MultiHeadAttention.forward(x, cache=...)`` runs the same
projections on the step's input and reads earlier keys and values from the cache
(``start_decoding``): a ring buffer whose readable slots come from the same
``can_attend``, so the cached and the full pass share one definition of locality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .order import GenerationOrder
from .position_bias import RelativePositionBias


def dense_attention(q: Tensor, k: Tensor, v: Tensor, can_attend: Tensor, bias: Tensor | None = None) -> Tensor:
    """Reference softmax attention: q (Tq, N, e), k and v (Tk, N, e), can_attend (Tq, Tk) -> (Tq, N, e).

    Written out by hand (no fused kernel) so the fast paths have something
    independent to be compared with. A query with no allowed key gets zeros.
    ``bias`` (h, Tq, Tk): added to the scores of head i of every image (N = batch·h).
    """
    scores = torch.einsum("qne,kne->nqk", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = (rearrange(scores, "(b h) q k -> b h q k", h=bias.shape[0]) + bias).flatten(0, 1)
    scores = scores.masked_fill(~can_attend, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("nqk,kne->qne", weights, v)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """(Tq, N, e) queries over every key of (Tk, N, e), or causally: one fused call on views."""
    q, k, v = (rearrange(t, "t n e -> 1 n t e") for t in (q, k, v))
    return rearrange(F.scaled_dot_product_attention(q, k, v, is_causal=causal), "1 n t e -> t n e")


def biased_mask(bias: Tensor, can_attend: Tensor) -> Tensor:
    """A float mask for SDPA: the position bias where ``can_attend`` allows, −∞ elsewhere."""
    return bias.masked_fill(~can_attend, float("-inf"))


def attend_in_blocks(q: Tensor, k: Tensor, v: Tensor, key_steps: Tensor, can_attend: Tensor,
                     position_bias: RelativePositionBias | None = None) -> Tensor:
    """Queries in blocks of L consecutive steps, each block over its own gathered keys.

    q (n·L, N, e); k, v (T, N, e); key_steps (n, S): each block's keys as steps, where step
    T stands for a zero key (outside the grid, before the sequence); can_attend (n, L, S).
    The blocks are the batch axis of one fused call; with a position bias, a per-head
    float mask (heads split out of N) -> (n·L, N, e).
    """
    n_blocks, n_keys = key_steps.shape
    zero = q.new_zeros(1, *q.shape[1:])
    keys, values = (rearrange(torch.cat([t, zero]).index_select(0, key_steps.flatten()),
                              "(b s) n e -> b n s e", s=n_keys) for t in (k, v))
    queries = rearrange(q, "(b l) n e -> b n l e", b=n_blocks)
    if position_bias is None:
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend[:, None])
        return rearrange(out, "b n l e -> (b l) n e")
    h, block_len = position_bias.n_heads, can_attend.shape[1]
    query_steps = torch.arange(n_blocks * block_len, device=q.device).view(n_blocks, block_len)
    bias = position_bias(query_steps[:, :, None], key_steps[:, None, :])  # (h, n, L, S)
    mask = biased_mask(rearrange(bias, "h b l s -> b 1 h l s"), can_attend[:, None, None])
    split = (rearrange(t, "b (B h) l e -> b B h l e", h=h) for t in (queries, keys, values))
    out = F.scaled_dot_product_attention(*split, attn_mask=mask)
    return rearrange(out, "b B h l e -> (b l) (B h) e")


class AttentionPattern:
    """Which keys each query sees, over a sequence of ``length`` positions."""

    length: int

    def can_attend(self) -> Tensor:
        """(T, T) bool, True where the query (row) may attend to the key (column)."""
        raise NotImplementedError

    def attend(self, q: Tensor, k: Tensor, v: Tensor, position_bias: RelativePositionBias | None = None) -> Tensor:
        """(T, N, e) q, k, v -> (T, N, e), equal to ``dense_attention`` with ``can_attend()``
        (and, with a position bias, the bias of every query-key pair added to its score)."""
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class FullCausal(AttentionPattern):
    """Every query sees every earlier position and itself: the O(n²) baseline."""

    def __init__(self, length: int) -> None:
        self.length = length

    def can_attend(self) -> Tensor:
        steps = torch.arange(self.length)
        return steps[None, :] <= steps[:, None]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, position_bias: RelativePositionBias | None = None) -> Tensor:
        if position_bias is None:
            return fused_attention(q, k, v, causal=True)
        # With a bias: one block holding the whole sequence, through the biased block path.
        steps = torch.arange(self.length, device=q.device)
        return attend_in_blocks(q, k, v, steps[None], self.can_attend().to(q.device)[None], position_bias)


class Local1D(AttentionPattern):
    """Query blocks of ``block_length`` positions in raster order (docs/model.md §4, 1D).

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

    def block_keys(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Block b's keys: the steps of blocks b−m .. b, (n_blocks, (m+1)·lq), with step T for
        those before the sequence or in the end padding; can_attend (n_blocks, lq, (m+1)·lq)."""
        lq, m = self.block_length, self.memory_blocks
        n_blocks = -(-self.length // lq)
        key_steps = (torch.arange(n_blocks)[:, None] - m) * lq + torch.arange((m + 1) * lq)
        query_steps = torch.arange(n_blocks * lq).view(n_blocks, lq)
        can_attend = (key_steps[:, None, :] >= 0) & (key_steps[:, None, :] <= query_steps[:, :, None])
        key_steps = key_steps.masked_fill((key_steps < 0) | (key_steps >= self.length), self.length)
        return key_steps.to(device), can_attend.to(device)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, position_bias: RelativePositionBias | None = None) -> Tensor:
        """Blocks 0..m−1 have every earlier position in memory: one causal call. Every
        later block b needs the window of blocks [b−m, b]. Windows that start at
        blocks s, s+(m+1), s+2(m+1), … do not overlap, so for each s in 0..m they are
        a plain view of k and v (no gathered copies); the last block of each window
        is queried against the whole window with one shared (lq, (m+1)·lq) mask.

        A position bias differs from window to window (unless lq is a multiple of the
        grid's width), so with one the blocks run through ``attend_in_blocks`` instead.
        """
        lq, m, length = self.block_length, self.memory_blocks, q.shape[0]
        n_blocks = -(-length // lq)
        pad = n_blocks * lq - length
        if pad:  # padding comes after every real position: causality keeps it unseen
            q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        if position_bias is not None:
            return attend_in_blocks(q, k, v, *self.block_keys(q.device), position_bias)[:length]
        out = q.new_empty(q.shape)
        head = min(m, n_blocks) * lq
        out[:head] = fused_attention(q[:head], k[:head], v[:head], causal=True)
        window = (m + 1) * lq
        can_attend = torch.ones(lq, window, dtype=torch.bool, device=q.device).tril(m * lq)
        blocks_out = rearrange(out, "(b l) n e -> b l n e", l=lq)
        for s in range(m + 1):
            n_windows = -(-(n_blocks - m - s) // (m + 1))
            if n_windows <= 0:
                continue
            span = slice(s * lq, (s + n_windows * (m + 1)) * lq)
            # windows: (w, n, (m+1)·lq, e) views; queries: the last block of each window
            keys, values = (rearrange(t[span], "(w l) n e -> w n l e", l=window) for t in (k, v))
            queries = rearrange(q[span], "(w j l) n e -> w j n l e", j=m + 1, l=lq)[:, m]
            attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend)
            first_block = s + m
            blocks_out[first_block : first_block + n_windows * (m + 1) : m + 1] = rearrange(
                attended, "w n l e -> w l n e")
        return out[:length]

    def describe(self) -> str:
        return f"Local1D(lq={self.block_length}, memory_blocks={self.memory_blocks})"


class Local2D(AttentionPattern):
    """Query blocks of qh×qw grid cells with a memory flange (docs/model.md §4, 2D).

    The sequence is in block-raster order. A block with top-left cell (r0, c0) sees
    the top flange rows [r0−fh, r0) × cols [c0−fw, c0+qw+fw), the left flange rows
    [r0, r0+qh) × cols [c0−fw, c0), and itself causally. Cells outside the grid are
    never attended.
    """

    def __init__(self, rows: int, cols: int, block: tuple[int, int], flange: tuple[int, int]) -> None:
        self.order = GenerationOrder(rows, cols, block)
        self.length = rows * cols
        self.block, self.flange = tuple(block), tuple(flange)
        self.block_keys_on: tuple[Tensor, Tensor] | None = None  # block_keys(), on the last device asked for

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
        step T, which ``attend`` maps to a zero key. can_attend (n_blocks, L, M + L):
        inside-the-grid flange cells, and the block's own cells causally.
        """
        if self.block_keys_on is None or self.block_keys_on[0].device != device:
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
            self.block_keys_on = (key_steps.to(device), can_attend.to(device))
        return self.block_keys_on

    def attend(self, q: Tensor, k: Tensor, v: Tensor, position_bias: RelativePositionBias | None = None) -> Tensor:
        """Each block's keys are gathered with one index_select (an appended zero row
        stands for cells outside the grid), and the blocks run as the batch axis of
        one fused attention call with a per-block mask (``attend_in_blocks``).
        """
        return attend_in_blocks(q, k, v, *self.block_keys(q.device), position_bias)

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
        """q (Tq, N, e), k and v (Tk, N, e) -> (Tq, N, e)."""
        n_groups, n_keys = self.key_index.shape
        queries = rearrange(q.index_select(0, self.query_order), "(g l) n e -> n g l e", g=n_groups)
        keys, values = (rearrange(t.index_select(0, self.key_index.flatten()), "(g s) n e -> n g s e", s=n_keys)
                        for t in (k, v))
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.key_allowed)
        return rearrange(out, "n g l e -> (g l) n e").index_select(0, self.query_position)


# ----- decoding one step at a time ------------------------------------------------------

class StepIndex:
    """Ring-buffer geometry for decoding under a causal (T, T) ``can_attend``.

    Step s's key and value live in slot s % ring until step s + ring overwrites them.
    ``ring``: the fewest slots that still hold the oldest key any later query reads.
    ``can_read`` (T, ring): step t attends to slot j iff j holds a key can_attend[t] allows.
    Slots not yet written, or holding keys the step may not see, are masked.
    """

    def __init__(self, can_attend: Tensor) -> None:
        queries, keys = can_attend.nonzero(as_tuple=True)
        if bool((keys > queries).any()):
            raise ValueError("cached decoding needs a causal can_attend: a query sees a later key")
        self.ring = int((queries - keys).max()) + 1
        self.can_read = torch.zeros(can_attend.shape[0], self.ring, dtype=torch.bool)
        self.can_read[queries, keys % self.ring] = True

    def to(self, device: torch.device) -> "StepIndex":
        self.can_read = self.can_read.to(device)
        return self


@dataclass
class SelfAttentionCache:
    """What one self-attention layer keeps between decoding steps: keys and values
    (N, ring, e) in ring buffers laid out by ``index``; ``step``: the next step to decode."""

    index: StepIndex
    keys: Tensor
    values: Tensor
    step: int = 0


@dataclass
class CrossAttentionCache:
    """The context's keys and values (N, S, e), projected once; ``can_attend`` (T, S) or None
    (every key); ``step``: the next step to decode."""

    keys: Tensor
    values: Tensor
    can_attend: Tensor | None
    step: int = 0


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-attention under a pattern (unmasked without one, as in
    the encoder), or cross-attention to a context, in the full pass or one step at a time."""

    def __init__(self, d_model: int, n_heads: int, pattern: AttentionPattern | None = None,
                 position_bias: RelativePositionBias | None = None) -> None:
        super().__init__()
        self.n_heads, self.pattern = n_heads, pattern
        self.position_bias = position_bias  # self-attention under a pattern only
        # T2T's attention projections carry no bias.
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_k = nn.Linear(d_model, d_model, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)

    def heads(self, x: Tensor, proj: nn.Linear) -> Tensor:
        """(B, T, d) -> (T, B·h, e): projected, sequence-first, the heads folded into the
        batch axis. Projecting the transposed (T, B, d) input makes the fold a view."""
        return rearrange(proj(x.transpose(0, 1)), "t b (h e) -> t (b h) e", h=self.n_heads)

    def merge_heads(self, out: Tensor) -> Tensor:
        """(T, B·h, e) -> (B, T, d) through the output projection."""
        return self.to_out(rearrange(out, "t (b h) e -> t b (h e)", h=self.n_heads)).transpose(0, 1)

    def start_decoding(self, batch: int, context: Tensor | None = None, local: LocalCrossAttention | None = None,
                       index: StepIndex | None = None) -> SelfAttentionCache | CrossAttentionCache:
        """A cache for ``forward(..., cache=)``. Self-attention: empty rings laid out by
        ``index`` (layers with one pattern share it; built from this pattern if None).
        Cross-attention (``context`` given): the context's keys and values, projected here once."""
        if context is not None:
            keys, values = (rearrange(self.heads(context, proj), "s n e -> n s e").contiguous()
                            for proj in (self.to_k, self.to_v))
            return CrossAttentionCache(keys, values, None if local is None else local.can_attend)
        if self.pattern is None:
            raise ValueError("unmasked self-attention (no pattern) is not causal: it cannot decode step by step")
        weight = self.to_k.weight
        index = (StepIndex(self.pattern.can_attend()) if index is None else index).to(weight.device)
        shape = (batch * self.n_heads, index.ring, weight.shape[0] // self.n_heads)
        keys = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        return SelfAttentionCache(index, keys, torch.zeros_like(keys))

    def forward(self, x: Tensor, context: Tensor | None = None, local: LocalCrossAttention | None = None,
                cache: SelfAttentionCache | CrossAttentionCache | None = None) -> Tensor:
        """x (B, T, d) -> (B, T, d).

        Self-attention without ``context``; cross-attention to ``context`` (B, S, d), to all
        of it or, with ``local``, only to the keys it allows. With ``cache``, x is one
        step (B, 1, d), step ``cache.step``: self-attention writes its key and value into
        the ring and reads the slots it may see; cross-attention reads the cached context
        (``context`` is not needed). The cache is updated in place (its ring, ``step`` + 1).
        """
        q = self.heads(x, self.to_q)
        if isinstance(cache, CrossAttentionCache):
            mask = None if cache.can_attend is None else cache.can_attend[cache.step : cache.step + 1]
            cache.step += 1
            return self.merge_heads(self.attend_step(q, cache.keys, cache.values, mask))
        source = x if context is None else context
        k, v = self.heads(source, self.to_k), self.heads(source, self.to_v)
        if cache is not None:
            t, index = cache.step, cache.index
            cache.keys[:, t % index.ring], cache.values[:, t % index.ring] = k[0], v[0]
            cache.step += 1
            out = self.attend_step(q, cache.keys, cache.values, self.step_mask(t, index, q.shape[1]))
        elif local is not None:
            out = local.attend(q, k, v)
        elif context is None and self.pattern is not None:
            out = self.pattern.attend(q, k, v, self.position_bias)
        else:
            out = fused_attention(q, k, v)
        return self.merge_heads(out)

    def step_mask(self, t: int, index: StepIndex, n: int) -> Tensor:
        """Step t's mask over the ring: bool (1, S), or with a position bias float (N, 1, S)."""
        can_read = index.can_read[t : t + 1]
        if self.position_bias is None:
            return can_read
        slots = torch.arange(index.ring, device=can_read.device)
        key_steps = t - (t - slots) % index.ring  # the step whose key slot j holds now
        bias = self.position_bias(torch.tensor([t], device=can_read.device), key_steps)  # (h, S)
        return biased_mask(bias, can_read)[:, None, :].repeat(n // self.n_heads, 1, 1)  # N = (batch heads)

    @staticmethod
    def attend_step(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
        """One step's queries (1, N, e) over cached keys and values (N, S, e) -> (1, N, e).
        ``mask``: the slots it may read, bool (1, S) or a float mask (N, 1, S); None: all."""
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)  # (N, 1, e)
        return out.transpose(0, 1)
