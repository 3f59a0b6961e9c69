"""Local cross-attention (docs/model.md §6): the pattern of a super-resolution decoder's
attention to the encoder's output when ``cross_attention_radius`` is set. Each decoder step
sees only the encoder sub-pixels whose low-resolution cell lies within the radius of its own.

Like a self-attention pattern (``patterns.py``) it has a dense ``can_attend`` (here the
reference and the lookup table at once: Tq × Tk with Tk the low-resolution input's size, 192
for 8×8, so it is small) and two kernels that compute the same attention: its keys gathered
per group of queries through SDPA (``attend``), and FlexAttention under a block mask built
once per device (``attend_flex``). A decoding step reads its row of ``can_attend``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask

from .flex import MaskRule, build_block_mask, flex_attend
from .patterns import BuiltOnce


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
    per query instead of masking all 192. ``patterns.dense_attention`` with ``can_attend`` is the
    reference. Tk is the low-resolution input's size, so the (Tq, Tk) matrix is small; a
    decoding step reads its row, and FlexAttention's ``mask_mod`` (``attend_flex``) looks
    each pair up in it.
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
        self.built = BuiltOnce()  # the block mask, per device
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

    def mask_rule(self, device: torch.device | str) -> MaskRule:
        """``can_attend`` looked up pair by pair, on ``device``."""
        can_attend = self.can_attend.to(device)
        last_query, last_key = can_attend.shape[0] - 1, can_attend.shape[1] - 1

        def rule(query: Tensor, key: Tensor) -> Tensor:
            # A kernel's last block may ask about steps past the ends; it discards those pairs,
            # and the clamp keeps the lookup inside the matrix.
            return can_attend[query.clamp(max=last_query), key.clamp(max=last_key)]

        return rule

    def block_mask(self, device: torch.device | str) -> BlockMask:
        """FlexAttention's block mask of ``can_attend`` (built once per device)."""
        return self.built.once("block_mask", device,
                         lambda: build_block_mask(self.mask_rule(device), *self.can_attend.shape, device))

    def attend_flex(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``attend`` through FlexAttention."""
        return flex_attend(q, k, v, self.block_mask(q.device))
