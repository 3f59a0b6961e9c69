"""Each sub-pixel's distribution, as integer frequencies, in the order the codec codes them.

The codec (docs/compress.md) codes an image sub-pixel by sub-pixel in the model's generation
order. What it needs at every sub-pixel is one categorical distribution over the 256 values,
quantised to integers that encoder and decoder compute identically:

* categorical head: softmax of the step's logits;
* DMOL head: one step predicts a whole pixel (docs/model.md §5). Its joint mass factors exactly
  into R, then G given R, then B given R and G: each channel's distribution is the mixture of
  its components' bin masses (the edge bins 0 and 255 taking all mass beyond them), weighted by
  the components' posterior given the earlier channels of the pixel, whose levels also enter
  the coupled means. The product of the three is the model's ``log_prob`` of the pixel.

Everything is computed in float64 on the CPU from the step's float parameters, then turned
into integers by one rounding (``quantise``); the rest is integer arithmetic. The same
parameters give the same integers, so encoder and decoder agree exactly as long as they run
the same decoding computation (``coder.py`` sees to that). The float64 step uses no libm and
no BLAS: its exp, log, sigmoid, softmax and sums are ``float64``'s, IEEE basic operations in a
fixed order, so it gives the same bits on every CPU, under any of ATen's kernels and either
of glibc's variants (FMA or not); only the float32 network before it depends on the
arithmetic settings (arithmetic.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.config import HALF_RANGE, LEVELS
from ..model.heads import HALF_BIN, DMOLHead
from . import float64

# The integer frequencies of one distribution sum to 2**PRECISION. 24 bits is the precision of
# constriction's default range coder (32-bit words, 24-bit probabilities), so the integers pass
# through it exactly (and are exact in float32). A value the model gives mass p costs at most
# 24 bits (mass 1 / 2**24) and otherwise about -log2(p); the flooring below costs at most
# LEVELS / 2**24 of relative mass per distribution, about 2e-5 bits per sub-pixel.
PRECISION = 24
TOTAL = 1 << PRECISION
# Every value keeps at least this frequency, so that any image can be coded.
MIN_FREQUENCY = 1


def quantise(probs: Tensor) -> Tensor:
    """(N, 256) float64 probabilities (each row summing to 1 up to rounding) -> (N, 256) int64
    frequencies, each >= 1, each row summing to exactly ``TOTAL``.

    One float -> int rounding (floor of p · (TOTAL − 256)), then integers only: every value
    gets 1 more, and what is left of TOTAL goes to the row's largest frequency (the first, at a
    tie), which holds at least TOTAL / 256, so no value can fall below 1."""
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise FloatingPointError("the model's probabilities are not finite (NaN or infinite weights?)")
    free = TOTAL - LEVELS * MIN_FREQUENCY
    freq = torch.floor(probs.clamp(max=1.0) * free).long() + MIN_FREQUENCY
    largest = freq.argmax(dim=-1, keepdim=True)
    left = TOTAL - freq.sum(dim=-1, keepdim=True)
    return freq.scatter_add(-1, largest, left)


def categorical_probs(logits: Tensor) -> Tensor:
    """(N, 256) logits -> (N, 256) float64 probabilities."""
    return float64.softmax(logits.double())


class PixelDistributions:
    """The DMOL head's three channel distributions of one step's pixels, channel by channel.

    ``channel(c)`` gives (N, 256) probabilities of channel c given the levels of the earlier
    channels, which ``observe(c, levels)`` records (the encoder: the true levels; the decoder:
    the levels just decoded; both the same)."""

    def __init__(self, head: DMOLHead, params: Tensor) -> None:
        logits, means, log_scales, coeffs = head.split(params.double())  # (N, K), (N, 3, K) each
        self.means, self.coeffs = means, coeffs
        self.inv_scales = float64.exp(-log_scales)  # (N, 3, K)
        self.log_weights = float64.log_softmax(logits)  # (N, K): the posterior, before any channel
        self.levels: list[Tensor] = []  # (N,) long, R then G
        self.bins = torch.arange(LEVELS, dtype=torch.float64) / HALF_RANGE - 1.0  # each level's bin centre
        self.edges = (self.bins[:-1] + HALF_BIN)[None, None, :]  # the upper edge of every level but the last

    def coupled_mean(self, channel: int) -> Tensor:
        """(N, K): m_R = μ_R, m_G = μ_G + α x_R, m_B = μ_B + β x_R + γ x_G (docs/model.md §5)."""
        x = [level.double() / HALF_RANGE - 1.0 for level in self.levels]
        mean = self.means[:, channel]
        if channel >= 1:
            mean = mean + self.coeffs[:, 0 if channel == 1 else 1] * x[0][:, None]
        if channel == 2:
            mean = mean + self.coeffs[:, 2] * x[1][:, None]
        return mean

    def channel(self, channel: int) -> Tensor:
        """(N, 256) float64: p(channel's level | the earlier channels' levels).

        Through the mixture's CDF at the 255 edges between neighbouring bins: level 0 takes all
        mass below the first edge, level 255 all mass above the last (the edge bins), level v
        the difference of the CDF at its two edges. In float64 a difference loses masses below
        about 1e-16, far below the 2**-24 every value keeps anyway (``quantise``)."""
        if channel != len(self.levels):
            raise ValueError(f"channel {channel} asked before channels 0..{channel - 1} were observed")
        mean = self.coupled_mean(channel)  # (N, K)
        inv_s = self.inv_scales[:, channel]
        # (edge − m)·e^−s for every component and edge, (N, K, 255): −m·e^−s + e^−s·edge, one product
        # and one sum each (as addcmul computes it without an FMA)
        standard = (-mean * inv_s)[:, :, None] + inv_s[:, :, None] * self.edges
        # the mixture's CDF, Σ_k w_k·σ(standard_k), (N, 255): summed over k in a fixed order
        weighted = float64.exp(self.log_weights)[:, :, None] * float64.sigmoid(standard)
        cdf = float64.tree_sum(weighted, 1)
        count = cdf.shape[0]
        below, above = cdf.new_zeros(count, 1), cdf.new_ones(count, 1)
        return torch.diff(cdf, prepend=below, append=above).clamp(min=0.0)

    def level_log_mass(self, channel: int, levels: Tensor) -> Tensor:
        """(N, K): log of each component's mass of the given levels, exactly as
        ``DMOLHead.channel_log_probs`` computes it (in logs: no mass lost far in a tail)."""
        inv_s = self.inv_scales[:, channel]  # (N, K)
        centered = (levels.double() / HALF_RANGE - 1.0)[:, None] - self.coupled_mean(channel)
        upper = inv_s * (centered + HALF_BIN)
        lower = inv_s * (centered - HALF_BIN)
        log_sigmoid = float64.logsigmoid
        interior = log_sigmoid(upper) + log_sigmoid(-lower) + float64.log(-float64.expm1(-2.0 * HALF_BIN * inv_s))
        lowest, highest = (levels == 0)[:, None], (levels == LEVELS - 1)[:, None]
        return torch.where(lowest, log_sigmoid(upper), torch.where(highest, log_sigmoid(-lower), interior))

    def observe(self, channel: int, levels: Tensor) -> None:
        """The channel's levels (N,) long, known: the components' posterior takes them in."""
        if channel != len(self.levels):
            raise ValueError(f"observe channel {channel} after channels 0..{channel - 1}")
        self.log_weights = float64.log_softmax(self.log_weights + self.level_log_mass(channel, levels))
        self.levels.append(levels)
