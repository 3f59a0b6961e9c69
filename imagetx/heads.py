"""Output distributions (SPEC §5): categorical over 256 values, and the
discretised mixture of logistics (DMOL) of PixelCNN++.

Each head maps the decoder output (B, T, d) to distribution parameters and can
score targets (log-likelihood in nats, per position) and sample with a
temperature. Parameters are always scored in float32, even under bf16 autocast.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .config import CHANNELS, LEVELS

HALF_BIN = 1.0 / (LEVELS - 1)  # half-width of one value's bin on the [-1, 1] scale
MIN_LOG_SCALE = -7.0  # PixelCNN++ clamp: keeps inv_s = exp(-s) below ~1100
BIN_MASS_FLOOR = 1e-5  # below this, the CDF difference has lost its precision


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
        return self.proj(hidden)  # (B, T, 256) logits

    def log_prob(self, logits: Tensor, targets: Tensor) -> Tensor:
        """logits (B, T, 256), targets (B, T) ints -> (B, T) log p in nats."""
        log_p = torch.log_softmax(logits.float(), dim=-1)
        return log_p.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)

    def all_log_probs(self, logits: Tensor) -> Tensor:
        """(..., 256) log-probabilities of every value."""
        return torch.log_softmax(logits.float(), dim=-1)

    def sample(self, logits: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """(B, T, 256) -> (B, T) values; temperature 0 takes the arg-max."""
        check_temperature(temperature)
        logits = logits.float()
        if temperature == 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        flat = torch.multinomial(probs.reshape(-1, LEVELS), 1, generator=generator)
        return flat.view(probs.shape[:-1])


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
        return self.proj(hidden)  # (B, T, 10K)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> logits (..., K), means, log_scales, coeffs each (..., 3, K)."""
        params = params.float()
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
        """Per component and channel log p of the target bin: (..., 3, K), and the mixture log-weights (..., K)."""
        logits, means, log_scales, coeffs = self.split(params)
        values = targets.long().unsqueeze(-1)  # (..., 3, 1)
        x = values.float() / 127.5 - 1.0
        centered = x - self.coupled_means(means, coeffs, x)
        inv_s = torch.exp(-log_scales)
        plus_in = inv_s * (centered + HALF_BIN)
        min_in = inv_s * (centered - HALF_BIN)
        # Lowest bin (v = 0) takes all mass below its upper edge: log σ(plus_in).
        log_cdf_plus = F.logsigmoid(plus_in)
        # Highest bin (v = 255) takes all mass above its lower edge: log(1 − σ(min_in)) = −softplus(min_in).
        log_one_minus_cdf_min = -F.softplus(min_in)
        # Interior bins: the CDF difference; clamped only so log() sees no zero in the branch not taken.
        cdf_delta = torch.sigmoid(plus_in) - torch.sigmoid(min_in)
        log_cdf_delta = torch.log(cdf_delta.clamp(min=1e-12))
        # Far in a tail the difference underflows: use the density at the bin centre times
        # the bin width 2/255 (log-density − log 127.5), written in log-sigmoid form.
        mid_in = inv_s * centered
        log_pdf_mid = mid_in - log_scales - 2.0 * F.softplus(mid_in)
        log_interior = torch.where(cdf_delta > BIN_MASS_FLOOR, log_cdf_delta, log_pdf_mid - math.log(127.5))
        log_p = torch.where(values == 0, log_cdf_plus, torch.where(values == LEVELS - 1, log_one_minus_cdf_min, log_interior))
        return log_p, torch.log_softmax(logits, dim=-1)

    def log_prob(self, params: Tensor, targets: Tensor) -> Tensor:
        """params (B, T, 10K), targets (B, T, 3) ints -> (B, T) joint log p of each pixel, in nats."""
        log_p, log_weights = self.channel_log_probs(params, targets)
        return torch.logsumexp(log_weights + log_p.sum(dim=-2), dim=-1)

    def sample(self, params: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
        """(B, T, 10K) -> (B, T, 3) values. Temperature sharpens the component choice and scales the noise."""
        check_temperature(temperature)
        logits, means, log_scales, coeffs = self.split(params)
        if temperature == 0:
            component = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            component = torch.multinomial(probs.reshape(-1, self.components), 1, generator=generator)
            component = component.view(probs.shape[:-1])
        pick = F.one_hot(component, self.components).to(means.dtype).unsqueeze(-2)  # (..., 1, K)
        means, log_scales, coeffs = ((t * pick).sum(-1) for t in (means, log_scales, coeffs))  # (..., 3)
        u = torch.rand(means.shape, generator=generator, device=means.device).clamp(1e-5, 1.0 - 1e-5)
        noise = (torch.log(u) - torch.log1p(-u)) * temperature  # logistic, scaled by τ
        x = means + torch.exp(log_scales) * noise
        x_r = x[..., 0].clamp(-1, 1)
        x_g = (x[..., 1] + coeffs[..., 0] * x_r).clamp(-1, 1)
        x_b = (x[..., 2] + coeffs[..., 1] * x_r + coeffs[..., 2] * x_g).clamp(-1, 1)
        x = torch.stack([x_r, x_g, x_b], dim=-1)
        return torch.round((x + 1.0) * 127.5).long().clamp(0, LEVELS - 1)
