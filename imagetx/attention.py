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


class AttentionPattern:
    """Which keys each query sees, over a sequence of ``length`` positions."""

    length: int

    def can_attend(self) -> Tensor:
        raise NotImplementedError

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
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

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        lq, m, length = self.block_length, self.memory_blocks, q.shape[2]
        n_blocks = -(-length // lq)
        pad = n_blocks * lq - length
        if pad:
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))

        # Blocks 0..m-1 have every earlier position in memory: plain causal attention.
        head = min(m, n_blocks) * lq
        outputs = [F.scaled_dot_product_attention(q[:, :, :head], k[:, :, :head], v[:, :, :head], is_causal=True)]
        if n_blocks > m:
            # Later blocks: own-block queries against [m previous blocks, own block],
            # blocks folded into the batch axis. One (lq, (m+1)·lq) mask serves every
            # block; on torch ≥ 2.5 the fused CPU kernel takes it (measured faster than
            # running causal attention over the whole window and dropping rows).
            queries = rearrange(q[:, :, m * lq:], "b h (n l) d -> (b n) h l d", l=lq)
            keys, values = self._windows(k), self._windows(v)
            can_attend = torch.ones(lq, (m + 1) * lq, dtype=torch.bool, device=q.device).tril(m * lq)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=can_attend)
            outputs.append(rearrange(out, "(b n) h l d -> b h (n l) d", b=q.shape[0]))
        return torch.cat(outputs, dim=2)[:, :, :length]

    def _windows(self, t: Tensor) -> Tensor:
        """Keys of block b ≥ m: its m predecessors then itself, blocks folded into the batch axis."""
        m = self.memory_blocks
        blocks = rearrange(t, "b h (n l) d -> b h n l d", l=self.block_length)
        n_windows = blocks.shape[2] - m
        window = torch.cat([blocks[:, :, j : j + n_windows] for j in range(m + 1)], dim=3)
        return rearrange(window, "b h n l d -> (b n) h l d")

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
        self._memory_valid: Tensor | None = None

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

    @property
    def memory_size(self) -> int:
        (qh, qw), (fh, fw) = self.block, self.flange
        return fh * (qw + 2 * fw) + qh * fw

    def gather_memory(self, t: Tensor) -> Tensor:
        """(b, h, T, d) in block-raster order -> (b, h, n_blocks, memory_size, d) flange cells."""
        (qh, qw), (fh, fw) = self.block, self.flange
        grid = self.order.sequence_to_grid(rearrange(t, "b h t d -> b t h d"))  # b rows cols h d
        grid = F.pad(grid, (0, 0, 0, 0, fw, fw, fh, 0))  # zero cells above and either side
        # windows: b, nh, nw, h, d, fh+qh, qw+2fw — each block's rows and columns of context
        windows = grid.unfold(1, fh + qh, qh).unfold(2, qw + 2 * fw, qw)
        top = rearrange(windows[..., :fh, :], "b nh nw h d r c -> b h (nh nw) (r c) d")
        left = rearrange(windows[..., fh:, :fw], "b nh nw h d r c -> b h (nh nw) (r c) d")
        return torch.cat([top, left], dim=3)

    def memory_valid(self, device: torch.device) -> Tensor:
        """(n_blocks, memory_size) bool: which gathered flange cells lie inside the grid."""
        if self._memory_valid is None or self._memory_valid.device != device:
            inside = torch.ones(1, 1, self.length, 1, device=device)
            self._memory_valid = self.gather_memory(inside)[0, 0, :, :, 0].bool()
        return self._memory_valid

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        (qh, qw) = self.block
        block_len = qh * qw
        # keys per block: [flange memory, own block]; (b, h, n, M + L, d)
        k_all = torch.cat([self.gather_memory(k), rearrange(k, "b h (n l) d -> b h n l d", l=block_len)], dim=3)
        v_all = torch.cat([self.gather_memory(v), rearrange(v, "b h (n l) d -> b h n l d", l=block_len)], dim=3)
        q_blocks = rearrange(q, "b h (n l) d -> b h n l d", l=block_len)
        causal = torch.ones(block_len, block_len, dtype=torch.bool, device=q.device).tril()
        memory = self.memory_valid(q.device)[:, None, :].expand(-1, block_len, -1)  # n, L, M
        can_attend = torch.cat([memory, causal.expand(memory.shape[0], -1, -1)], dim=2)  # n, L, M + L
        out = F.scaled_dot_product_attention(q_blocks, k_all, v_all, attn_mask=can_attend)
        return rearrange(out, "b h n l d -> b h (n l) d")

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

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        source = x if context is None else context
        q, k, v = (self.split_heads(proj(inp)) for proj, inp in
                   ((self.to_q, x), (self.to_k, source), (self.to_v, source)))
        if self.pattern is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = self.pattern.attend(q, k, v)
        return self.merge_heads(out)
