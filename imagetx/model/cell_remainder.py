"""What the rest of each low-resolution cell must average to: an exact extra input for
super-resolution decoders (docs/model.md §6; ``superres.cell_remainder_input``). Not part of
the paper's model.

The low-resolution input is the rounded box mean of the target (4×4 cells for 8×8 →
32×32), so each cell's N = 16 values of a channel sum to N·m within ±N/2. Before step t
the values already generated in t's cell are known; the ones still to come (t's own
included) must average to

    (N·m − sum of the earlier ones) / (number still to come)

within ±(N/2) / (number still to come): for the last pixel of a cell, its own value ±8.
A decoder could learn to add up a cell's earlier pixels through attention; given this
number it need not. It reads only values generated before step t, so the model stays
autoregressive (tests perturb later steps and check earlier outputs do not move).
Decoding, ``cell_state`` keeps each group's running sum in a ``RemainderCache`` instead of
summing the whole sequence, for one step or many at once (a prefill) alike. The steps come from
the model's decoding cache, which owns the counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .config import CHANNELS, HALF_RANGE, LEVELS, ModelConfig
from .heads import full_precision_linear, head_type, scoring_dtype


@dataclass
class RemainderCache:
    """Decoding state: (B, T, c) the low-res value(s) of each step's group, and (B, groups, c)
    sums of each group's values generated so far."""

    low_values: Tensor
    sums: Tensor


class CellRemainder(nn.Module):
    """Targets (B, T[, 3]) and the low-res image -> (B, T, c + 1): per step, the mean the
    not-yet-generated values of its cell (and channel) must have, and how many they are
    (as 1 / count); ``embed`` maps them into the decoder's input."""

    def __init__(self, config: ModelConfig, low_res_pixel_of_step: Tensor, step_channels: Tensor) -> None:
        """``low_res_pixel_of_step`` (T,): the low-res pixel under each step, as a raster index
        (the model's ``low_res_pixel_of_step()``); ``step_channels``: each step's channel (used
        by categorical steps)."""
        super().__init__()
        scale = config.image_size // config.superres.low_res_size
        self.cell_size = scale * scale  # values of one channel under one low-res pixel
        self.sub_pixel_steps = head_type(config).value_shape == ()  # a step is a sub-pixel, not a pixel
        # A group is what one low-res value summarises: a cell's sub-pixels of one channel
        # (categorical steps are sub-pixels), or a cell's pixels (DMOL steps are pixels).
        groups = low_res_pixel_of_step * CHANNELS + step_channels if self.sub_pixel_steps else low_res_pixel_of_step
        order = torch.argsort(groups, stable=True)  # each group's steps together, in generation order
        earlier = torch.empty_like(order)
        earlier[order] = torch.arange(order.numel()) % self.cell_size  # steps of its group before it
        self.register_buffer("groups", groups, persistent=False)
        self.register_buffer("order", order, persistent=False)
        self.register_buffer("inverse", torch.argsort(order), persistent=False)
        self.register_buffer("still_to_come", (self.cell_size - earlier).float(), persistent=False)
        values_per_step = 1 if self.sub_pixel_steps else CHANNELS
        self.proj = nn.Linear(values_per_step + 1, config.d_model)

    @property
    def n_groups(self) -> int:
        return self.groups.numel() // self.cell_size

    @property
    def sum_dtype(self) -> torch.dtype:
        """At least float32 (a bf16 model too): sums up to 16·255 must stay exact."""
        return scoring_dtype(self.proj.weight)

    def step_values(self, values: Tensor) -> Tensor:
        """(B, T) sub-pixels or (B, T, 3) pixels -> (B, T, c) floats, c values per step."""
        values = values.to(self.sum_dtype)
        return values[..., None] if self.sub_pixel_steps else values

    def low_res_values(self, low_res: Tensor) -> Tensor:
        """(B, h, w, 3) -> (B, T, c): the low-res value(s) each step's group averages to."""
        if self.sub_pixel_steps:
            flat = rearrange(low_res, "b h w c -> b (h w c)")  # index = cell·3 + channel = group
            return self.step_values(flat[:, self.groups])
        return self.step_values(rearrange(low_res, "b h w c -> b (h w) c")[:, self.groups])

    def features(self, earlier_sum: Tensor, low_values: Tensor, still_to_come: Tensor) -> Tensor:
        """(B, t, c) sums of the earlier values, (B, t, c) low-res values, (t,) counts -> (B, t, c + 1):
        the remainder mean on the [-1, 1] scale of pixel values, and 1 / (count still to come)."""
        still_to_come = still_to_come.to(self.sum_dtype)
        remainder_mean = (self.cell_size * low_values - earlier_sum) / still_to_come[:, None]
        uncertainty = (1.0 / still_to_come)[None, :, None].expand(*remainder_mean.shape[:2], 1)
        return torch.cat([remainder_mean / HALF_RANGE - 1.0, uncertainty], dim=-1)

    def embed(self, features: Tensor) -> Tensor:
        """(B, t, c + 1) features -> (B, t, d), added to the decoder's input; in float32 under
        mixed precision, as it reads raw values (heads.py, ``full_precision_linear``)."""
        return full_precision_linear(self.proj, features)

    def start_decoding(self, low_res: Tensor) -> RemainderCache:
        """An empty cache for decoding the images of ``low_res`` (B, h, w, 3) one step at a time."""
        low_values = self.low_res_values(low_res)
        sums = low_values.new_zeros(low_values.shape[0], self.n_groups, low_values.shape[-1])
        return RemainderCache(low_values, sums)

    def earlier_sums(self, values: Tensor) -> Tensor:
        """(B, T, c) values of every step -> (B, T, c): per step, the sum of its group's values at
        earlier steps."""
        grouped = rearrange(values[:, self.order], "b (g n) c -> b g n c", n=self.cell_size)
        earlier = grouped.cumsum(dim=2) - grouped  # exclusive: the group's earlier steps only
        return rearrange(earlier, "b g n c -> b (g n) c")[:, self.inverse]

    def cell_state(self, previous: Tensor, steps: Tensor, low_res: Tensor | None = None,
                   cache: RemainderCache | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(B, t[, 3]) the value before each of ``steps`` (t,) -> per step, (B, t, c) the sum of its
        group's earlier values, (B, t, c) its group's low-res value(s) and (t,) how many values its
        group still has to come: what ``features`` and ``bounds`` read.

        Without ``cache``: every step from 0, given ``low_res``. With ``cache``: the steps go on
        from those its sums hold (the low-res values are the cache's), which then hold these too
        but the last: a step's value is added by the next step, as the decoder reads it."""
        length = self.groups.numel()
        if cache is None:  # every step's value but the last's, which no step reads
            values = F.pad(self.step_values(previous[:, 1:]), (0, 0, 0, length - previous.shape[1] + 1))
            earlier = self.earlier_sums(values)[:, :steps.numel()]
            return earlier, self.low_res_values(low_res)[:, steps], self.still_to_come[steps]
        values = self.step_values(previous) * (steps > 0)[:, None]  # (B, t, c): step s − 1's value, none at s = 0
        sources = F.one_hot(self.groups[(steps - 1) % length], self.n_groups).to(values.dtype)  # (t, G): its group
        added = torch.einsum("tg,btc->btgc", sources, values).cumsum(dim=1)  # (B, t, G, c): the chunk's sums so far
        groups, chunk = self.groups[steps], torch.arange(steps.numel(), device=steps.device)
        earlier = cache.sums[:, groups] + added[:, chunk, groups]  # sums integers: exact in floats
        cache.sums += added[:, -1]
        return earlier, cache.low_values[:, steps], self.still_to_come[steps]

    def bounds(self, earlier_sum: Tensor, low_values: Tensor, still_to_come: Tensor) -> Tensor:
        """``cell_state``'s per-step state -> (B, t, 2c): each step's lowest, then highest value(s)
        that leave its cell able to meet its rounded box mean m (``exact_box_means``). The cell's
        N values must sum to within [N·m − N/2, N·m + N/2 − 1] (``downsample_area`` rounds half
        up); the n still to come, this one first, each lie in [0, 255]: this one takes at least
        what the other n − 1 cannot reach at 255, at most what leaves them 0."""
        n = still_to_come.to(self.sum_dtype)[:, None]
        low_sum = self.cell_size * low_values - self.cell_size // 2 - earlier_sum
        high_sum = self.cell_size * low_values + self.cell_size // 2 - 1 - earlier_sum
        lowest = (low_sum - (LEVELS - 1) * (n - 1)).clamp(min=0)
        highest = high_sum.clamp(max=LEVELS - 1)
        return torch.cat([lowest, highest], dim=-1).long()  # sums in floats hold integers exactly
