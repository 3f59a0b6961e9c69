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
no BLAS: its exp, log, tanh, sigmoid, softmax and sums are ``float64``'s, IEEE basic operations in a
fixed order, so it gives the same bits on every CPU, under any of ATen's kernels and either
of glibc's variants (FMA or not); only the float32 network before it depends on the
arithmetic settings (arithmetic.py). That is format 6's way; formats 4 and 5 (coder.py,
LIBM_FREE_VERSION) took the DMOL head's coupling coefficients' tanh from torch, and decode so
(``TorchTanhPixelDistributions``); files of formats 1 to 3 were coded with torch's float64
functions and decode with them (``TorchPixelDistributions``, ``torch_categorical_probs``, at the end).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model.config import HALF_RANGE, LEVELS
from ..model.heads import HALF_BIN, DMOLHead, coupled_mean, log_mass
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
    p = probs.numpy()  # (numpy: a call on these small arrays costs a fraction of a torch call)
    if not np.isfinite(p).all() or (p < 0).any():
        raise FloatingPointError("the model's probabilities are not finite (NaN or infinite weights?)")
    free = TOTAL - LEVELS * MIN_FREQUENCY
    freq = np.floor(np.minimum(p, 1.0) * free).astype(np.int64) + MIN_FREQUENCY
    rows = np.arange(freq.shape[0])
    largest = freq.argmax(axis=-1)  # the first, at a tie
    freq[rows, largest] += TOTAL - freq.sum(axis=-1)
    return torch.from_numpy(freq)


def categorical_probs(logits: Tensor) -> Tensor:
    """(N, 256) logits -> (N, 256) float64 probabilities."""
    return torch.from_numpy(float64.softmax(logits.double().numpy()))


# The mixture's CDF at the 255 edges e_j = e_0 + 2j·HALF_BIN: for each component, with
# a = (e_0 − m)·e^−s and d = 2·HALF_BIN·e^−s, e^−(a + jd) for j = 16p + q is the product of
# e^−(a + 16p·d) and e^−(q·d), so 2 × 16 exps give all 256 (the last unused), not 255 exps.
# (The two saturate where e^−(a + jd) passes 1e±307, where the CDF is 0 or 1 to 1e-307.)
EDGE_BLOCK = 16
assert EDGE_BLOCK * EDGE_BLOCK >= LEVELS - 1


class PixelDistributions:
    """The DMOL head's three channel distributions of one step's pixels, channel by channel.

    ``channel(c)`` gives (N, 256) probabilities of channel c given the levels of the earlier
    channels, which ``observe(c, levels)`` records (the encoder: the true levels; the decoder:
    the levels just decoded; both the same). Computed on numpy float64 arrays (float64.py)."""

    def __init__(self, head: DMOLHead, params: Tensor) -> None:
        logits, means, log_scales, coeffs = self.split(head, params)
        self.means, self.coeffs = means, coeffs  # (N, 3, K) each
        # (each exp or log of this step's arrays that can, in one call: float64.at_once)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        self.inv_scales, odds = float64.at_once(float64.exp, -log_scales, shifted)  # (N, 3, K), (N, K)
        total = float64.tree_sum(odds, -1)[..., None]
        # log(1 − e^−w), w = 2·HALF_BIN·e^−s: the log of an interior bin's width factor, every channel
        width = (2.0 * HALF_BIN) * self.inv_scales
        narrow = float64.exp(-width)
        log_narrow, log_total = float64.at_once(float64.log, narrow, total)
        self.log_gaps = float64.log(-float64.expm1_from(-width, narrow, log_narrow))
        # (N, K) each: the components' posterior and its log, before any channel (a softmax)
        self.weights, self.log_weights = odds / total, shifted - log_total
        self.levels: list[np.ndarray] = []  # (N,) int64, R then G (B's too, once observed)
        self.posterior_of = 0  # the channels taken into the posterior so far (``observe`` leaves it to ``channel``)
        block = np.arange(EDGE_BLOCK, dtype=np.float64)
        self.steps = (block * EDGE_BLOCK, block)  # j = 16p + q: the multiples of d in p's and q's factor

    @staticmethod
    def split(head: DMOLHead, params: Tensor) -> tuple[np.ndarray, ...]:
        """The head's parameters as float64 arrays: logits, means, log-scales and the coupling
        coefficients, whose tanh is float64's (format 6 on)."""
        logits, means, log_scales, coupling = (part.numpy() for part in head.split_raw(params.double()))
        return logits, means, log_scales, float64.tanh(coupling)

    def coupled_mean(self, channel: int) -> np.ndarray:
        """(N, K) for the channel: m_R = μ_R, m_G = μ_G + α x_R, m_B = μ_B + β x_R + γ x_G (docs/model.md §5)."""
        x = [(level.astype(np.float64) / HALF_RANGE - 1.0)[:, None] for level in self.levels[:channel]]
        return coupled_mean(self.means, self.coeffs, x, channel)

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
        a = ((HALF_BIN - 1.0) - mean) * inv_s  # the first edge, standardised
        d = (2.0 * HALF_BIN) * inv_s  # the standardised distance between neighbouring edges
        # (N, K, 32): the exponents of e^−(a + 16p·d), then of e^−(q·d)
        exponents = -np.concatenate([a[..., None] + d[..., None] * self.steps[0], d[..., None] * self.steps[1]], -1)
        while self.posterior_of < channel - 1:  # (a channel observed but never asked for)
            self.take_in(exponents[..., :0])
        if self.posterior_of < channel:  # the posterior given the earlier channel's levels, first
            factors = self.take_in(exponents)
        else:
            factors = float64.exp(exponents)
        coarse, fine = factors[..., :EDGE_BLOCK], factors[..., EDGE_BLOCK:]
        tail = (coarse[..., :, None] * fine[..., None, :]).reshape(*a.shape, -1)[..., :LEVELS - 1]
        sigmoid = 1.0 / (1.0 + tail)  # (N, K, 255): each component's CDF at the edges
        # the mixture's CDF, Σ_k w_k·σ_k, (N, 255): summed over k in a fixed order
        cdf = float64.tree_sum(self.weights[..., None] * sigmoid, 1)
        count = cdf.shape[0]
        padded = np.concatenate([np.zeros((count, 1)), cdf, np.ones((count, 1))], axis=1)
        return torch.from_numpy(np.maximum(padded[:, 1:] - padded[:, :-1], 0.0))

    def take_in(self, exponents: np.ndarray) -> np.ndarray:
        """The posterior given the last observed channel's levels, in ``weights`` and
        ``log_weights``; -> e^``exponents``, computed in the same exp call."""
        observed = self.posterior_of
        levels = self.levels[observed]
        # log of each component's mass of the observed levels, by ``heads.log_mass``'s formula (in
        # logs: no mass lost far in a tail) in float64's own functions; without its guard of tiny
        # gaps, which keeps a float32 gradient finite (none is taken here, and float64 holds the gap)
        inv_s = self.inv_scales[:, observed]  # (N, K)
        centered = (levels.astype(np.float64) / HALF_RANGE - 1.0)[:, None] - self.coupled_mean(observed)
        upper = inv_s * (centered + HALF_BIN)
        lower = inv_s * (centered - HALF_BIN)
        edges = np.stack([upper, -lower])  # (2, N, K): log σ of both, at once
        tails, exps = float64.at_once(float64.exp, -np.abs(edges), exponents)
        below_upper, above_lower = float64.logsigmoid_from(edges, tails)
        interior = below_upper + above_lower + self.log_gaps[:, observed]
        lowest, highest = (levels == 0)[:, None], (levels == LEVELS - 1)[:, None]
        log_mass = np.where(lowest, below_upper, np.where(highest, above_lower, interior))
        self.weights, self.log_weights = float64.softmax_and_log(self.log_weights + log_mass)
        self.posterior_of += 1
        return exps

    def observe(self, channel: int, levels: Tensor) -> None:
        """The channel's levels (N,) long, known: the components' posterior takes them in (when
        the next channel is asked for: B's, the last, never is)."""
        if channel != len(self.levels):
            raise ValueError(f"observe channel {channel} after channels 0..{channel - 1}")
        self.levels.append(levels.numpy())


class TorchTanhPixelDistributions(PixelDistributions):
    """``PixelDistributions`` as files of formats 4 and 5 were coded (coder.py, OWN_TANH_VERSION):
    the coupling coefficients' tanh is torch's (the head's ``split``: glibc's under ATen's baseline
    kernels, which glibc picks by CPU), the rest float64's."""

    @staticmethod
    def split(head: DMOLHead, params: Tensor) -> tuple[np.ndarray, ...]:
        return tuple(part.numpy() for part in head.split(params.double()))


# Formats 1 to 3 (coder.py, LIBM_FREE_VERSION): torch's functions, as those files were coded.


def torch_categorical_probs(logits: Tensor) -> Tensor:
    """``categorical_probs`` as files of formats 1 to 3 were coded: torch's float64 softmax."""
    return torch.softmax(logits.double(), dim=-1)


class TorchPixelDistributions:
    """``PixelDistributions`` as files of formats 1 to 3 were coded (before issue 111): with torch's
    float64 functions, glibc's under ATen's baseline kernels, and a float64 bmm (MKL's DGEMM);
    kept as it was, so that those files decode as they were coded.

    The DMOL head's three channel distributions of one step's pixels, channel by channel.

    ``channel(c)`` gives (N, 256) probabilities of channel c given the levels of the earlier
    channels, which ``observe(c, levels)`` records (the encoder: the true levels; the decoder:
    the levels just decoded; both the same)."""

    def __init__(self, head: DMOLHead, params: Tensor) -> None:
        logits, means, log_scales, coeffs = head.split(params.double())  # (N, K), (N, 3, K) each
        self.means, self.coeffs = means, coeffs
        self.inv_scales = torch.exp(-log_scales)  # (N, 3, K)
        self.log_weights = torch.log_softmax(logits, dim=-1)  # (N, K): the posterior, before any channel
        self.levels: list[Tensor] = []  # (N,) long, R then G
        self.bins = torch.arange(LEVELS, dtype=torch.float64) / HALF_RANGE - 1.0  # each level's bin centre
        self.edges = (self.bins[:-1] + HALF_BIN)[None, None, :]  # the upper edge of every level but the last

    def coupled_mean(self, channel: int) -> Tensor:
        """(N, K): m_R = μ_R, m_G = μ_G + α x_R, m_B = μ_B + β x_R + γ x_G (docs/model.md §5)."""
        x = [(level.double() / HALF_RANGE - 1.0)[:, None] for level in self.levels[:channel]]
        return coupled_mean(self.means, self.coeffs, x, channel)

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
        # (edge − m)·e^−s for every component and edge, (N, K, 255), in one pass
        standard = torch.addcmul((-mean * inv_s)[:, :, None], inv_s[:, :, None], self.edges)
        cdf = torch.bmm(self.log_weights.exp()[:, None, :], standard.sigmoid_())[:, 0]  # (N, 255)
        count = cdf.shape[0]
        below, above = cdf.new_zeros(count, 1), cdf.new_ones(count, 1)
        return torch.diff(cdf, prepend=below, append=above).clamp(min=0.0)

    def level_log_mass(self, channel: int, levels: Tensor) -> Tensor:
        """(N, K): log of each component's mass of the given levels, by ``DMOLHead.channel_log_probs``'s
        ``log_mass`` (in logs: no mass lost far in a tail) without its guard of tiny gaps, as these
        files were coded (a float32 gradient's guard: float64 needs none)."""
        inv_s = self.inv_scales[:, channel]  # (N, K)
        centered = (levels.double() / HALF_RANGE - 1.0)[:, None] - self.coupled_mean(channel)
        lowest, highest = (levels == 0)[:, None], (levels == LEVELS - 1)[:, None]
        gap = 2.0 * HALF_BIN * inv_s
        return log_mass(inv_s * (centered - HALF_BIN), inv_s * (centered + HALF_BIN), gap, gap.log(), lowest, highest,
                        tiny_gap=0.0)

    def observe(self, channel: int, levels: Tensor) -> None:
        """The channel's levels (N,) long, known: the components' posterior takes them in."""
        if channel != len(self.levels):
            raise ValueError(f"observe channel {channel} after channels 0..{channel - 1}")
        self.log_weights = torch.log_softmax(self.log_weights + self.level_log_mass(channel, levels), dim=-1)
        self.levels.append(levels)
