"""Output distributions (docs/model.md §5): categorical over 256 values, and the discretised
mixture of logistics (DMOL) of PixelCNN++. A head maps the decoder output (B, T, d) to distribution
parameters, scores targets (log p in nats, per position) and samples with a temperature, in float32
at least, even under bf16 autocast (``full_precision_linear``). Value bounds (each step's c lowest
values then its c highest, (..., 2c) long; docs/model.md §6) travel beside the parameters and restrict
each step to them, renormalised. A head also owns what one step is (a sub-pixel or a pixel), how
images lie on the grid and how a step's input value is embedded (§2).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import UserError
from .config import CHANNELS, HALF_RANGE, LEVELS, ModelConfig

HALF_BIN = 1.0 / (LEVELS - 1)  # half-width of one value's bin on the [-1, 1] scale
MIN_LOG_SCALE = -7.0  # PixelCNN++ clamp: keeps inv_s = exp(-s) below ~1100
# Standardised bin widths below this take log(gap) for log(1 − e^(−gap)) (``log_mass``), off by gap/2,
# far below float32's resolution; above it the direct form's gradient 1/gap stays below 1e30, where at
# float32's smallest gaps (1.2e-38: log-scales near 88, which no clamp forbids) it would exceed 3.4e38.
TINY_GAP = 1e-30
# Each channel's coupling coefficients, by index into the K-wide coefficient rows (PixelCNN++'s α, β, γ):
# R none, G α·x_R, B β·x_R + γ·x_G.
COUPLINGS = ((), (0,), (1, 2))


def scoring_dtype(tensor: Tensor) -> torch.dtype:
    """float32, or the tensor's own dtype where it is wider (a float64 model works in float64): the
    network's two ends never narrower (docs/model.md §5), as on [-1, 1] neighbouring levels are 2/255 ≈
    0.0078 apart, and bfloat16 resolves steps of 1/128 ≈ 0.0078 near ±1, so it would merge them."""
    return torch.promote_types(tensor.dtype, torch.float32)


def full_precision_linear(proj: nn.Linear, x: Tensor) -> Tensor:
    """``proj(x)`` in ``scoring_dtype`` of the weights, with autocast off."""
    dtype = scoring_dtype(proj.weight)
    bias = None if proj.bias is None else proj.bias.to(dtype)
    # (the meta device of FLOP counting has no autocast to turn off)
    with nullcontext() if x.is_meta else torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(dtype), proj.weight.to(dtype), bias)


class SubPixelEmbedding(nn.Module):
    """Values (B, T) with channel ids (T,) -> (B, T, d): row v + 256·c, times √d."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(CHANNELS * LEVELS, d_model)
        # T2T initialises with std d^-½ so that after the √d scale entries are ~unit size.
        nn.init.normal_(self.table.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    def forward(self, values: Tensor, channels: Tensor) -> Tensor:
        return self.table(values.long() + LEVELS * channels) * self.scale


class PixelEmbedding(nn.Module):
    """Pixels (B, T, 3) -> (B, T, d); T2T's 1×3 stride-3 convolution is this linear map."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(CHANNELS, d_model)

    def forward(self, pixels: Tensor, channels: Tensor | None = None) -> Tensor:
        """``channels``: not read (a pixel holds all three), taken as ``SubPixelEmbedding`` takes them."""
        values = pixels.to(scoring_dtype(self.proj.weight)) / HALF_RANGE - 1.0
        return torch.relu(full_precision_linear(self.proj, values))


def draw(logits: Tensor, temperature: float, generator: torch.Generator | None = None) -> Tensor:
    """(..., n) logits -> (...) indices drawn from softmax(logits / temperature), temperature 0 the arg-max:
    the exponential race argmax(p / E), E ~ Exp(1), the draws of ``torch.multinomial`` without its
    checks, which read the probabilities back (a host sync on a GPU)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(-1)


def log_mass(lower: Tensor, upper: Tensor, gap: Tensor, log_gap: Tensor, open_below: Tensor,
             open_above: Tensor, tiny_gap: float = TINY_GAP) -> Tensor:
    """log of a standard logistic's mass between standardised edges ``lower`` and ``upper`` (from −∞
    where ``open_below``, to +∞ where ``open_above``); ``gap`` = upper − lower and its log ``log_gap``
    as the caller has them, exactly. σ(u) − σ(l) = σ(u)·σ(−l)·(1 − e^(l−u)): in logs nothing cancels,
    so the mass keeps float32's precision however far in a tail. ``tiny_gap`` 0: the direct form
    everywhere, as compressed files of formats 1 to 3 are coded (codec/distributions.py)."""
    tiny = gap < tiny_gap
    # A harmless gap where the direct form is not used: torch.where multiplies the gradient of the
    # branch it leaves out by 0, and 0 times infinity is NaN.
    direct = torch.log(-torch.expm1(-torch.where(tiny, torch.ones_like(gap), gap)))
    interior = F.logsigmoid(upper) + F.logsigmoid(-lower) + torch.where(tiny, log_gap, direct)
    below = torch.where(open_above, torch.zeros_like(upper), F.logsigmoid(upper))
    return torch.where(open_below, below, torch.where(open_above, F.logsigmoid(-lower), interior))


def coupled_mean(means, coeffs, earlier: list, channel: int):
    """``means``, ``coeffs`` (..., 3, K) -> channel ``channel``'s coupled means (..., K) given the earlier
    channels' values ``earlier`` on [-1, 1], each broadcasting against (..., K) (docs/model.md §5). Sums
    and products only, in this order: torch tensors and numpy float64 arrays give the same bits."""
    mean = means[..., channel, :]
    for coefficient, x in zip(COUPLINGS[channel], earlier):
        mean = mean + coeffs[..., coefficient, :] * x
    return mean


def truncated_logistic(u: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """Uniform u in [0, 1) -> a standard logistic draw restricted to (lower, upper) (±inf allowed),
    z = F⁻¹(F(l) + u·(F(u) − F(l))) in logs, float64. An interval above the mean is drawn as its
    mirror image, where F is small and its logs keep every digit."""
    mirrored = lower > 0
    low, high = torch.where(mirrored, -upper, lower), torch.where(mirrored, -lower, upper)
    log_low, log_high = F.logsigmoid(low), F.logsigmoid(high)
    log_p = log_high + torch.log(u + (1 - u) * torch.exp(log_low - log_high))  # log of F(z), z <= high
    z = log_p - torch.log1p(-torch.exp(log_p))  # logit
    return torch.where(mirrored, -z, z)


def split_bounds(bounds: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(..., 2c) bounds -> (lowest, highest), each (..., c) long; None for None."""
    return None if bounds is None else tuple(bounds.long().chunk(2, dim=-1))


def within(bounds: tuple[Tensor, Tensor], values: Tensor) -> Tensor:
    """Whether ``values`` lie within (lowest, highest) ``bounds``, elementwise after broadcasting."""
    lowest, highest = bounds
    return (values >= lowest) & (values <= highest)


def params_and_bounds(outputs: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    """A model's outputs -> (the head's parameters, each step's (..., 2c) value bounds or None)."""
    return outputs if isinstance(outputs, tuple) else (outputs, None)


class Head(nn.Module):
    """What both heads share."""

    value_shape: tuple[int, ...]  # one step's value: () a sub-pixel, (3,) a pixel
    proj: nn.Linear  # d -> the distribution's parameters

    def fits(self, targets: Tensor, bounds: Tensor | None) -> Tensor:
        """(B, T) whether each step's target values (all c of them) lie within its ``bounds`` (all do: None)."""
        values = targets if self.value_shape else targets[..., None]  # (B, T, c)
        if bounds is None:
            return torch.ones_like(values[..., 0], dtype=torch.bool)
        return within(split_bounds(bounds), values).all(-1)

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, d) -> (B, T, P) the distribution's parameters: 256 logits, or DMOL's 10K."""
        return full_precision_linear(self.proj, hidden)


def check_temperature(temperature: float) -> None:
    if not temperature >= 0 or math.isinf(temperature):
        raise UserError(f"temperature {temperature} is invalid: temperatures must be finite and >= 0 "
                        "(0 = always the most likely value)")


class CategoricalHead(Head):
    """One linear map d -> 256 shared by the three channels; one position per sub-pixel."""

    steps_per_pixel = CHANNELS  # a step is a sub-pixel: a grid row holds 3W of them
    value_shape: tuple[int, ...] = ()  # one step's value: one sub-pixel
    input_embedding = SubPixelEmbedding  # of a step's input value: a table row per channel and value

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, LEVELS)

    @classmethod
    def from_config(cls, config: ModelConfig) -> "CategoricalHead":
        return cls(config.d_model)

    @staticmethod
    def to_grid(images: Tensor) -> Tensor:
        """(B, H, W, 3) -> (B, H, 3W) sub-pixels, a pixel's channels side by side."""
        return rearrange(images, "b h w c -> b h (w c)")

    @staticmethod
    def to_images(grid: Tensor) -> Tensor:
        """``to_grid``'s inverse: (B, H, 3W) -> (B, H, W, 3)."""
        return rearrange(grid, "b h (w c) -> b h w c", c=CHANNELS)

    def logits(self, params: Tensor, bounds: Tensor | None = None) -> Tensor:
        """The logits in the scoring precision, values outside a step's bounds masked to −inf."""
        logits = params.to(scoring_dtype(params))
        if bounds is None:
            return logits
        return logits.masked_fill(~within(split_bounds(bounds), torch.arange(LEVELS, device=params.device)), -math.inf)

    def log_prob(self, params: Tensor, targets: Tensor, bounds: Tensor | None = None) -> Tensor:
        """params (B, T, 256) logits, targets (B, T) ints[, bounds (B, T, 2)] -> (B, T) log p in nats,
        −inf outside the bounds (also bounds that hold no value)."""
        targets = targets.long()
        log_p = torch.log_softmax(self.logits(params, bounds), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return log_p if bounds is None else torch.where(self.fits(targets, bounds), log_p, -math.inf)

    def sample(self, params: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None,
               bounds: Tensor | None = None) -> Tensor:
        """(B, T, 256) logits[, bounds (B, T, 2)] -> (B, T) values; temperature 0 takes the arg-max."""
        check_temperature(temperature)
        return draw(self.logits(params, bounds), temperature, generator)


class DMOLHead(Head):
    """Discretised mixture of K logistics over a pixel's three channels. Parameters per position (10·K,
    as PixelCNN++): K mixture logits, then for each channel K means, K log-scales, K coupling coefficients."""

    steps_per_pixel = 1  # a step is a whole pixel
    value_shape = (CHANNELS,)  # one step's value: a pixel's three
    input_embedding = PixelEmbedding  # of a step's input value: a linear map of the pixel's three values

    def __init__(self, d_model: int, components: int) -> None:
        super().__init__()
        self.components = components
        self.size = components * (1 + 3 * CHANNELS)  # parameters of the distribution
        self.proj = nn.Linear(d_model, self.size)

    @classmethod
    def from_config(cls, config: ModelConfig) -> "DMOLHead":
        return cls(config.d_model, config.mixture_components)

    @staticmethod
    def to_grid(images: Tensor) -> Tensor:
        """(B, H, W, 3) -> the grid (B, H, W, 3): a cell is a pixel."""
        return images

    @staticmethod
    def to_images(grid: Tensor) -> Tensor:
        return grid

    def split(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> logits (..., K), means, log_scales, coeffs each (..., 3, K)."""
        logits, means, log_scales, coupling = self.split_raw(params)
        return logits, means, log_scales, torch.tanh(coupling)

    def split_raw(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``split`` with the coupling coefficients before their tanh (codec/distributions.py computes
        that tanh its own way)."""
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
        """-> log p (..., 3, K) of each component's and channel's target bin [x − 1/255, x + 1/255] (end bins
        stretched to ∓∞), and the mixture log-weights (..., K). Given bounds, each is divided by the mass of
        the bounds' bins under the same logistic; a value outside them has log p −inf (docs/model.md §6)."""
        logits, means, log_scales, coeffs = self.split(params)
        values = targets.long().unsqueeze(-1)  # (..., 3, 1)
        x = values.to(means.dtype) / HALF_RANGE - 1.0  # the bin centre, as precise as the parameters
        centered = x - self.coupled_means(means, coeffs, x)
        inv_s = torch.exp(-log_scales)
        log_p = log_mass(inv_s * (centered - HALF_BIN), inv_s * (centered + HALF_BIN), 2.0 * HALF_BIN * inv_s,
                         math.log(2.0 * HALF_BIN) - log_scales, values == 0, values == LEVELS - 1)
        if bounds is not None:
            lowest, highest = (b.unsqueeze(-1) for b in split_bounds(bounds))  # (..., 3, 1)
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
        """(B, T, 10K)[, bounds (B, T, 6)] -> (B, T, 3) values, from exactly the distribution ``log_prob``
        scores: a component, then R, G, B in turn, each channel's rounded *level* (not its continuous draw)
        entering the later channels' coupled means. Temperature divides the mixture logits and scales the
        logistic noise; 0 takes the most likely component and its means (clamped to the bounds)."""
        check_temperature(temperature)
        logits, means, log_scales, coeffs = self.split(params)
        component = draw(logits, temperature, generator)
        pick = F.one_hot(component, self.components).to(means.dtype).unsqueeze(-2)  # (..., 1, K)
        # the picked component's means and coefficients (..., 3, 1), and log-scales (..., 3)
        means, coeffs = ((t * pick).sum(-1, keepdim=True).double() for t in (means, coeffs))
        log_scales = (log_scales * pick).sum(-1).double()
        # Logistic noise by inversion, in float64: u from the smallest positive float64, as u = 0 gives −inf;
        # the largest u below 1 caps a draw at about 37 scale units, leaving out a mass of about 1e-16.
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
    """The class of the output head ``config.head`` names (``from_config`` builds it)."""
    return CategoricalHead if config.head == "categorical" else DMOLHead
