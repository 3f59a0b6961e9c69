"""Output distributions (docs/model.md §5): categorical over 256 values, and the
discretised mixture of logistics (DMOL) of PixelCNN++.

Each head maps the decoder output (B, T, d) to distribution parameters and can
score targets (log-likelihood in nats, per position) and sample with a
temperature. The head's projection, its scores and its draws run in float32 at least, even
under bf16 autocast, and in float64 for a float64 model (``embedding.py`` says why, at ``full_precision_linear``).

A head's output is its distribution's parameters only. Value bounds (a super-resolution model
with ``exact_box_means``: each step's c lowest values then its c highest, (..., 2c) long) travel
beside them: that model returns (parameters, bounds) (``params_and_bounds``), and ``log_prob``,
``sample`` and ``fits`` take the bounds as an argument, restricting each step to them, renormalised.

A head also owns what differs between the two kinds of model: what one generation step is (a
sub-pixel, or a pixel: ``steps_per_pixel``, ``value_shape``), how images lie on the generation
grid (``to_grid``, ``to_images``) and how a step's input value is embedded (``input_embedding``).
``head_type(config)`` names the config's; nothing else reads the head's kind.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .config import CHANNELS, HALF_RANGE, LEVELS, ModelConfig
from .embedding import PixelEmbedding, SubPixelEmbedding, full_precision_linear, scoring_dtype

HALF_BIN = 1.0 / (LEVELS - 1)  # half-width of one value's bin on the [-1, 1] scale
MIN_LOG_SCALE = -7.0  # PixelCNN++ clamp: keeps inv_s = exp(-s) below ~1100
# Standardised bin widths below this take log(gap) for log(1 − e^(−gap)) (``log_mass``): the direct
# form's gradient, 1/gap, would reach float32's largest value (3.4e38) as the gap nears its smallest
# (1.2e-38), at log-scales near 88 (no clamp stops a network's output there: wide components are legal);
# above it the direct form is exact to float32's precision, and below it log(gap) differs by gap/2.
TINY_GAP = 1e-30
# The coupling coefficients each channel's mean reads the earlier channels through, by index into
# the K-wide coefficient rows of the parameters (PixelCNN++'s α, β, γ in its order): R none, G α·x_R,
# B β·x_R + γ·x_G.
COUPLINGS = ((), (0,), (1, 2))


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """(..., n) probabilities -> (...) indices, index i drawn with probability probs[..., i].

    The exponential race argmax(p / E), E ~ Exp(1), which is how ``torch.multinomial`` draws
    one sample (the same random numbers, the same draws), without its two checks of the
    probabilities, which read them back: on a GPU a host sync at every sampling step."""
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(-1)


def log_mass(lower: Tensor, upper: Tensor, gap: Tensor, log_gap: Tensor, open_below: Tensor,
             open_above: Tensor, tiny_gap: float = TINY_GAP) -> Tensor:
    """log of a standard logistic's mass between ``lower`` and ``upper`` (standardised edges;
    ``gap`` = upper − lower, which the caller has exactly, unlike their difference, and its log
    ``log_gap``, which the caller has without underflow), or from −∞ where ``open_below``, to +∞
    where ``open_above``. σ(u) − σ(l) = σ(u)·σ(−l)·(1 − e^(l−u)) exactly: in logs no term
    cancels, so the mass stays accurate in float32 however small it is (the plain difference of
    two sigmoids loses every digit far in a tail). A gap below ``TINY_GAP`` (a scale so wide that
    e^(−s) nears float32's smallest numbers) takes log(1 − e^(−gap)) = log(gap) − gap/2 + ...
    as log_gap: its value is then exact, and its gradient finite where 1/gap would overflow
    (``tiny_gap`` 0: never, the direct form everywhere, as compressed files of formats 1 to 3 were
    coded: codec/distributions.py)."""
    tiny = gap < tiny_gap
    # (the direct form on a harmless gap where it is not used: the gradient of a branch torch.where
    # leaves out is multiplied by 0, and 0 times its infinity would be NaN)
    direct = torch.log(-torch.expm1(-torch.where(tiny, torch.ones_like(gap), gap)))
    interior = F.logsigmoid(upper) + F.logsigmoid(-lower) + torch.where(tiny, log_gap, direct)
    below = torch.where(open_above, torch.zeros_like(upper), F.logsigmoid(upper))
    return torch.where(open_below, below, torch.where(open_above, F.logsigmoid(-lower), interior))


def coupled_mean(means, coeffs, earlier: list, channel: int):
    """Channel ``channel``'s logistic means given the earlier channels' values ``earlier`` (one per
    earlier channel, on the [-1, 1] scale, each broadcasting against (..., K)): m_R = μ_R,
    m_G = μ_G + α x_R, m_B = μ_B + β x_R + γ x_G (docs/model.md §5). ``means``, ``coeffs``
    (..., 3, K) -> (..., K). The one place the coupling is written: scoring, sampling and the codec
    read it, on torch tensors or on the codec's numpy float64 arrays (sums and products only, in
    this order: the same bits either way)."""
    mean = means[..., channel, :]
    for coefficient, x in zip(COUPLINGS[channel], earlier):
        mean = mean + coeffs[..., coefficient, :] * x
    return mean


def truncated_logistic(u: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """Uniform u in [0, 1) -> a standard logistic draw restricted to (lower, upper) (±inf
    allowed), by inverting its distribution function F: z = F⁻¹(F(l) + u·(F(u) − F(l))), in logs.
    An interval above the mean is drawn as the mirror image of the one below it, where F is
    small and its logs keep every digit, however far out the interval lies; float64."""
    mirrored = lower > 0
    low, high = torch.where(mirrored, -upper, lower), torch.where(mirrored, -lower, upper)
    log_low, log_high = F.logsigmoid(low), F.logsigmoid(high)
    log_p = log_high + torch.log(u + (1 - u) * torch.exp(log_low - log_high))  # log of F(z), z <= high
    z = log_p - torch.log1p(-torch.exp(log_p))  # logit
    return torch.where(mirrored, -z, z)


def split_bounds(bounds: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(..., 2c) bounds -> (lowest, highest), each (..., c) long; None for None."""
    if bounds is None:
        return None
    lowest, highest = bounds.long().chunk(2, dim=-1)
    return lowest, highest


def within(bounds: tuple[Tensor, Tensor], values: Tensor) -> Tensor:
    """Whether ``values`` lie within (lowest, highest) ``bounds``, elementwise after broadcasting."""
    lowest, highest = bounds
    return (values >= lowest) & (values <= highest)


def all_within(bounds: tuple[Tensor, Tensor] | None, values: Tensor) -> Tensor:
    """Values (..., c) -> (...) whether all c lie within their ``bounds`` (all do: no bounds)."""
    if bounds is None:
        return torch.ones_like(values[..., 0], dtype=torch.bool)
    return within(bounds, values).all(-1)


def params_and_bounds(outputs: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    """A model's outputs -> (the head's parameters, each step's (..., 2c) value bounds or None): a
    model with ``exact_box_means`` returns both, any other its parameters."""
    return outputs if isinstance(outputs, tuple) else (outputs, None)


class Head(nn.Module):
    """What both heads share."""

    value_shape: tuple[int, ...]  # one step's value: () a sub-pixel, (3,) a pixel

    def fits(self, targets: Tensor, bounds: Tensor | None) -> Tensor:
        """(B, T) whether each step's target values lie within its ``bounds`` (all do: None)."""
        return all_within(split_bounds(bounds), targets if self.value_shape else targets[..., None])


def check_temperature(temperature: float) -> None:
    if not temperature >= 0 or math.isinf(temperature):
        raise UserError(f"temperature {temperature} is invalid: temperatures must be finite and >= 0 "
                        "(0 = always the most likely value)")


class CategoricalHead(Head):
    """One linear map d -> 256 shared by the three channels; one position per sub-pixel."""

    steps_per_pixel = CHANNELS  # a step is a sub-pixel: a grid row holds 3W of them
    value_shape: tuple[int, ...] = ()  # one step's value: one sub-pixel

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, LEVELS)

    @classmethod
    def from_config(cls, config: ModelConfig) -> "CategoricalHead":
        return cls(config.d_model)

    @staticmethod
    def input_embedding(d_model: int) -> SubPixelEmbedding:
        """The embedding of a step's input value: a table row per channel and value."""
        return SubPixelEmbedding(d_model)

    @staticmethod
    def to_grid(images: Tensor) -> Tensor:
        """(B, H, W, 3) -> (B, H, 3W) sub-pixels, a pixel's channels side by side."""
        return rearrange(images, "b h w c -> b h (w c)")

    @staticmethod
    def to_images(grid: Tensor) -> Tensor:
        """``to_grid``'s inverse: (B, H, 3W) -> (B, H, W, 3)."""
        return rearrange(grid, "b h (w c) -> b h w c", c=CHANNELS)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, d) -> (B, T, 256) logits."""
        return full_precision_linear(self.proj, hidden)

    def logits(self, params: Tensor, bounds: Tensor | None = None) -> Tensor:
        """The logits in the scoring precision, those of values outside a step's bounds at −inf."""
        logits = params.to(scoring_dtype(params))
        limits = split_bounds(bounds)
        if limits is None:
            return logits
        return logits.masked_fill(~within(limits, torch.arange(LEVELS, device=params.device)), -math.inf)

    def log_prob(self, params: Tensor, targets: Tensor, bounds: Tensor | None = None) -> Tensor:
        """params (B, T, 256) logits, targets (B, T) ints[, bounds (B, T, 2)] -> (B, T) log p in nats
        (−inf outside the bounds, also where a target's cell cannot meet its input's mean: bounds
        that hold no value)."""
        targets = targets.long()
        log_p = torch.log_softmax(self.logits(params, bounds), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return log_p if bounds is None else torch.where(self.fits(targets, bounds), log_p, -math.inf)

    def sample(self, params: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None,
               bounds: Tensor | None = None) -> Tensor:
        """(B, T, 256) logits[, bounds (B, T, 2)] -> (B, T) values; temperature 0 takes the arg-max."""
        check_temperature(temperature)
        logits = self.logits(params, bounds)
        if temperature == 0:
            return logits.argmax(-1)
        return draw(torch.softmax(logits / temperature, dim=-1), generator)


class DMOLHead(Head):
    """Discretised mixture of K logistics over one pixel's three channels.

    Parameter layout per position (10·K numbers, as PixelCNN++): K mixture logits,
    then for each channel K means, K log-scales and K coupling coefficients.
    """

    steps_per_pixel = 1  # a step is a whole pixel
    value_shape = (CHANNELS,)  # one step's value: a pixel's three

    def __init__(self, d_model: int, components: int) -> None:
        super().__init__()
        self.components = components
        self.size = components * (1 + 3 * CHANNELS)  # parameters of the distribution
        self.proj = nn.Linear(d_model, self.size)

    @classmethod
    def from_config(cls, config: ModelConfig) -> "DMOLHead":
        return cls(config.d_model, config.mixture_components)

    @staticmethod
    def input_embedding(d_model: int) -> PixelEmbedding:
        """The embedding of a step's input value: a linear map of the pixel's three values."""
        return PixelEmbedding(d_model)

    @staticmethod
    def to_grid(images: Tensor) -> Tensor:
        """(B, H, W, 3) -> the grid (B, H, W, 3): a cell is a pixel."""
        return images

    @staticmethod
    def to_images(grid: Tensor) -> Tensor:
        return grid

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, d) -> (B, T, 10K) parameters."""
        return full_precision_linear(self.proj, hidden)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> logits (..., K), means, log_scales, coeffs each (..., 3, K)."""
        logits, means, log_scales, coupling = self.split_raw(params)
        return logits, means, log_scales, torch.tanh(coupling)

    def split_raw(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``split`` with the coupling coefficients before their tanh (the codec computes that
        tanh its own way: codec/distributions.py)."""
        params = params.to(scoring_dtype(params))
        k = self.components
        rest = rearrange(params[..., k:], "... (c p k) -> ... c p k", c=CHANNELS, p=3, k=k)
        log_scales = rest[..., 1, :].clamp(min=MIN_LOG_SCALE)
        return params[..., :k], rest[..., 0, :], log_scales, rest[..., 2, :]

    @staticmethod
    def coupled_means(means: Tensor, coeffs: Tensor, x: Tensor) -> Tensor:
        """(..., 3, K): every channel's ``coupled_mean`` given the pixel's values x (..., 3, 1) on [-1, 1]."""
        earlier = list(x.unbind(-2))  # (..., 1) each
        return torch.stack([coupled_mean(means, coeffs, earlier[:c], c) for c in range(CHANNELS)], dim=-2)

    def channel_log_probs(self, params: Tensor, targets: Tensor,
                          bounds: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Per component and channel log p of the target bin: (..., 3, K), and the mixture log-weights (..., K).

        Channel c's bin [x − 1/255, x + 1/255] (the lowest and highest bins stretched to
        ∓∞) under the logistic with mean m_c and scale e^s, in standardised units
        lower = (x − m − 1/255)/e^s and upper = (x − m + 1/255)/e^s. Given bounds, the head divides each
        by the mass of the channel's bounds [lo, hi] under the same logistic (its end bins
        stretched as the values' are): each component's channels, given the earlier ones, are
        then distributions over the bounds; a value outside them has log p −inf.
        """
        logits, means, log_scales, coeffs = self.split(params)
        values = targets.long().unsqueeze(-1)  # (..., 3, 1)
        x = values.to(means.dtype) / HALF_RANGE - 1.0  # the bin centre, as precise as the parameters
        centered = x - self.coupled_means(means, coeffs, x)
        inv_s = torch.exp(-log_scales)
        log_p = log_mass(inv_s * (centered - HALF_BIN), inv_s * (centered + HALF_BIN), 2.0 * HALF_BIN * inv_s,
                         math.log(2.0 * HALF_BIN) - log_scales, values == 0, values == LEVELS - 1)
        limits = split_bounds(bounds)
        if limits is not None:
            lowest, highest = (b.unsqueeze(-1) for b in limits)  # (..., 3, 1)
            lower = centered - (values - lowest).to(means.dtype) / HALF_RANGE - HALF_BIN
            upper = centered + (highest - values).to(means.dtype) / HALF_RANGE + HALF_BIN
            width = (highest - lowest + 1).to(means.dtype) * 2.0 * HALF_BIN
            inside = log_mass(inv_s * lower, inv_s * upper, inv_s * width, torch.log(width) - log_scales,
                              lowest == 0, highest == LEVELS - 1)
            log_p = torch.where(within((lowest, highest), values), log_p - inside, -math.inf)
        return log_p, torch.log_softmax(logits, dim=-1)

    def log_prob(self, params: Tensor, targets: Tensor, bounds: Tensor | None = None) -> Tensor:
        """params (B, T, 10K), targets (B, T, 3) ints[, bounds (B, T, 6)] -> (B, T) joint log p of
        each pixel, in nats."""
        log_p, log_weights = self.channel_log_probs(params, targets, bounds)
        return torch.logsumexp(log_weights + log_p.sum(dim=-2), dim=-1)

    def sample(self, params: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None,
               bounds: Tensor | None = None) -> Tensor:
        """(B, T, 10K)[, bounds (B, T, 6)] -> (B, T, 3) values, drawn from exactly the distribution
        ``log_prob`` scores.

        Pick a component, then draw R, G, B in turn: a logistic draw, rounded to its level
        (the bins of ``channel_log_probs``; values beyond ±1 fall in the edge bins), and
        that *level* (not the continuous draw) enters the coupled means of the later
        channels, as it does in ``log_prob``. Given bounds, it draws each channel from its
        logistic restricted to the bounds' bins. Temperature divides the mixture logits and
        scales the logistic noise; 0 takes the most likely component and its means (clamped
        to the bounds).
        """
        check_temperature(temperature)
        logits, means, log_scales, coeffs = self.split(params)
        if temperature == 0:
            component = logits.argmax(-1)
        else:
            component = draw(torch.softmax(logits / temperature, dim=-1), generator)
        pick = F.one_hot(component, self.components).to(means.dtype).unsqueeze(-2)  # (..., 1, K)
        # the picked component's means and coefficients (..., 3, 1), as ``coupled_mean`` reads them,
        # and log-scales (..., 3)
        means, coeffs = ((t * pick).sum(-1, keepdim=True).double() for t in (means, coeffs))
        log_scales = (log_scales * pick).sum(-1).double()
        # Logistic noise by inversion, in float64: u = 0 would give −inf, so it starts at the
        # smallest positive float64; the largest u below 1 caps the draw at about 37 scale
        # units, leaving out a mass of about 1e-16.
        u = torch.rand(log_scales.shape, generator=generator, device=means.device, dtype=torch.float64)
        u = u.clamp(min=torch.finfo(torch.float64).tiny)
        noise = torch.log(u) - torch.log1p(-u)  # (..., 3) standard logistic draws
        limits = split_bounds(bounds)

        def level(y: Tensor) -> Tensor:  # a point on the [-1, 1] scale -> its bin's level (long)
            return torch.round((y.clamp(-1.0, 1.0) + 1.0) * HALF_RANGE).long()

        def scaled(v: Tensor) -> Tensor:  # a level -> its bin centre on the [-1, 1] scale
            return v.double() / HALF_RANGE - 1.0

        levels: list[Tensor] = []
        for c in range(CHANNELS):
            # the mean given the earlier channels' levels (not their continuous draws)
            centre = coupled_mean(means, coeffs, [scaled(v)[..., None] for v in levels], c)[..., 0]
            z = noise[..., c]
            if limits is not None and temperature > 0:  # the draw restricted to the bounds' bins
                lowest, highest = limits[0][..., c], limits[1][..., c]
                unit = torch.exp(log_scales[..., c]) * temperature
                lower = torch.where(lowest == 0, -math.inf, scaled(lowest) - HALF_BIN)
                upper = torch.where(highest == LEVELS - 1, math.inf, scaled(highest) + HALF_BIN)
                z = truncated_logistic(u[..., c], (lower - centre) / unit, (upper - centre) / unit)
            value = level(centre + torch.exp(log_scales[..., c]) * z * temperature)
            levels.append(value if limits is None else value.clamp(limits[0][..., c], limits[1][..., c]))
        return torch.stack(levels, dim=-1)


def head_type(config: ModelConfig) -> type[CategoricalHead] | type[DMOLHead]:
    """The class of the output head ``config.head`` names (``from_config`` builds it): the one
    place the head's name is read, beside the config's own checks."""
    return CategoricalHead if config.head == "categorical" else DMOLHead
