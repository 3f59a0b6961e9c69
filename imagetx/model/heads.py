"""Output distributions (docs/model.md §5): categorical over 256 values, and the
discretised mixture of logistics (DMOL) of PixelCNN++.

Each head maps the decoder output (B, T, d) to distribution parameters and can
score targets (log-likelihood in nats, per position) and sample with a
temperature. The head's projection, its scores and its draws run in float32 at least, even
under bf16 autocast, and in float64 for a float64 model (``precision.py`` says why).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .config import CHANNELS, HALF_RANGE, LEVELS
from .precision import full_precision_linear, scoring_dtype

HALF_BIN = 1.0 / (LEVELS - 1)  # half-width of one value's bin on the [-1, 1] scale
MIN_LOG_SCALE = -7.0  # PixelCNN++ clamp: keeps inv_s = exp(-s) below ~1100


def draw(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """(..., n) probabilities -> (...) indices, index i drawn with probability probs[..., i].

    The exponential race argmax(p / E), E ~ Exp(1), which is how ``torch.multinomial`` draws
    one sample (the same random numbers, the same draws), without its two checks of the
    probabilities, which read them back: on a GPU a host sync at every sampling step."""
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / race).argmax(-1)


def check_temperature(temperature: float) -> None:
    if not temperature >= 0 or math.isinf(temperature):
        raise ValueError(f"temperature {temperature} is invalid: temperatures must be finite and >= 0 "
                         "(0 = always the most likely value)")


class CategoricalHead(nn.Module):
    """One linear map d -> 256 shared by the three channels; one position per sub-pixel."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, LEVELS)

    def forward(self, hidden: Tensor) -> Tensor:
        return full_precision_linear(self.proj, hidden)  # (B, T, 256) logits

    def log_prob(self, logits: Tensor, targets: Tensor) -> Tensor:
        """logits (B, T, 256), targets (B, T) ints -> (B, T) log p in nats."""
        log_p = torch.log_softmax(logits.to(scoring_dtype(logits)), dim=-1)
        return log_p.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)

    def sample(self, logits: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """(B, T, 256) -> (B, T) values; temperature 0 takes the arg-max."""
        check_temperature(temperature)
        logits = logits.to(scoring_dtype(logits))
        if temperature == 0:
            return logits.argmax(-1)
        return draw(torch.softmax(logits / temperature, dim=-1), generator)


class DMOLHead(nn.Module):
    """Discretised mixture of K logistics over one pixel's three channels.

    Parameter layout per position (10·K numbers, as PixelCNN++): K mixture logits,
    then for each channel K means, K log-scales and K coupling coefficients.
    """

    def __init__(self, d_model: int, components: int) -> None:
        super().__init__()
        self.components = components
        self.proj = nn.Linear(d_model, components * (1 + 3 * CHANNELS))

    def forward(self, hidden: Tensor) -> Tensor:
        return full_precision_linear(self.proj, hidden)  # (B, T, 10K)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> logits (..., K), means, log_scales, coeffs each (..., 3, K)."""
        params = params.to(scoring_dtype(params))
        k = self.components
        rest = rearrange(params[..., k:], "... (c p k) -> ... c p k", c=CHANNELS, p=3, k=k)
        log_scales = rest[..., 1, :].clamp(min=MIN_LOG_SCALE)
        return params[..., :k], rest[..., 0, :], log_scales, torch.tanh(rest[..., 2, :])

    @staticmethod
    def coupled_means(means: Tensor, coeffs: Tensor, x: Tensor) -> Tensor:
        """m_R = μ_R, m_G = μ_G + α x_R, m_B = μ_B + β x_R + γ x_G; x is (..., 3, 1) on [-1, 1]."""
        m_r = means[..., 0, :]
        m_g = means[..., 1, :] + coeffs[..., 0, :] * x[..., 0, :]
        m_b = means[..., 2, :] + coeffs[..., 1, :] * x[..., 0, :] + coeffs[..., 2, :] * x[..., 1, :]
        return torch.stack([m_r, m_g, m_b], dim=-2)

    def channel_log_probs(self, params: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Per component and channel log p of the target bin: (..., 3, K), and the mixture log-weights (..., K).

        Channel c's bin [x − 1/255, x + 1/255] (the lowest and highest bins stretched to
        ∓∞) under the logistic with mean m_c and scale e^s, in standardised units
        lower = (x − m − 1/255)/e^s and upper = (x − m + 1/255)/e^s.
        """
        logits, means, log_scales, coeffs = self.split(params)
        values = targets.long().unsqueeze(-1)  # (..., 3, 1)
        x = values.to(means.dtype) / HALF_RANGE - 1.0  # the bin centre, as precise as the parameters
        centered = x - self.coupled_means(means, coeffs, x)
        inv_s = torch.exp(-log_scales)
        upper = inv_s * (centered + HALF_BIN)
        lower = inv_s * (centered - HALF_BIN)
        # Lowest bin (v = 0) takes all mass below its upper edge: log σ(upper).
        log_lowest = F.logsigmoid(upper)
        # Highest bin (v = 255) takes all mass above its lower edge: log(1 − σ(lower)) = log σ(−lower).
        log_highest = F.logsigmoid(-lower)
        # Interior bins: σ(u) − σ(l) = σ(u)·σ(−l)·(1 − e^(l−u)), exactly. In logs no term
        # cancels, so the mass stays accurate in float32 however small it is (the plain
        # difference of two sigmoids loses every digit far in a tail). l − u = −2·inv_s/255.
        log_interior = F.logsigmoid(upper) + F.logsigmoid(-lower) + torch.log(-torch.expm1(-2.0 * HALF_BIN * inv_s))
        log_p = torch.where(values == 0, log_lowest, torch.where(values == LEVELS - 1, log_highest, log_interior))
        return log_p, torch.log_softmax(logits, dim=-1)

    def log_prob(self, params: Tensor, targets: Tensor) -> Tensor:
        """params (B, T, 10K), targets (B, T, 3) ints -> (B, T) joint log p of each pixel, in nats."""
        log_p, log_weights = self.channel_log_probs(params, targets)
        return torch.logsumexp(log_weights + log_p.sum(dim=-2), dim=-1)

    def sample(self, params: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """(B, T, 10K) -> (B, T, 3) values, drawn from exactly the distribution ``log_prob`` scores.

        Pick a component, then draw R, G, B in turn: a logistic draw, rounded to its level
        (the bins of ``channel_log_probs``; values beyond ±1 fall in the edge bins), and
        that *level* (not the continuous draw) enters the coupled means of the later
        channels, as it does in ``log_prob``. Temperature divides the mixture logits and
        scales the logistic noise; 0 takes the most likely component and its means.
        """
        check_temperature(temperature)
        logits, means, log_scales, coeffs = self.split(params)
        if temperature == 0:
            component = logits.argmax(-1)
        else:
            component = draw(torch.softmax(logits / temperature, dim=-1), generator)
        pick = F.one_hot(component, self.components).to(means.dtype).unsqueeze(-2)  # (..., 1, K)
        means, log_scales, coeffs = ((t * pick).sum(-1).double() for t in (means, log_scales, coeffs))  # (..., 3)
        # Logistic noise by inversion, in float64: u = 0 would give −inf, so it starts at the
        # smallest positive float64; the largest u below 1 caps the draw at about 37 scale
        # units, leaving out a mass of about 1e-16.
        u = torch.rand(means.shape, generator=generator, device=means.device, dtype=torch.float64)
        u = u.clamp(min=torch.finfo(torch.float64).tiny)
        draws = means + torch.exp(log_scales) * (torch.log(u) - torch.log1p(-u)) * temperature

        def level(y: Tensor) -> Tensor:  # a point on the [-1, 1] scale -> its bin's level (long)
            return torch.round((y.clamp(-1.0, 1.0) + 1.0) * HALF_RANGE).long()

        def scaled(v: Tensor) -> Tensor:  # a level -> its bin centre on the [-1, 1] scale
            return v.double() / HALF_RANGE - 1.0

        r = level(draws[..., 0])
        g = level(draws[..., 1] + coeffs[..., 0] * scaled(r))
        b = level(draws[..., 2] + coeffs[..., 1] * scaled(r) + coeffs[..., 2] * scaled(g))
        return torch.stack([r, g, b], dim=-1)
