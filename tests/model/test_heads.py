"""Output distributions (docs/model.md §5): the categorical head and the discretised mixture of
logistics (DMOL). Normalisation, agreement with an independent float64 computation,
8.0 bits/dim for uniform outputs, and samples that follow the probabilities.

The DMOL head scores float32 (and bf16) parameters in float32, so most tolerances here are
float32 ones: 1e-4 on sums of probabilities; float64 parameters are scored in float64.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import random_images, tiny_model
from imagetx.model.config import HALF_RANGE
from imagetx.model.heads import HALF_BIN, CategoricalHead, DMOLHead, coupled_mean

LEVELS = 256

# ----- DMOL helpers --------------------------------------------------------------------


def pack(logits, means, log_scales, coeffs, dtype=torch.float32) -> torch.Tensor:
    """The documented layout: K mixture logits, then per channel K means, K log-scales, K coefficients."""
    parts = [torch.as_tensor(logits, dtype=torch.float64)]
    for c in range(3):
        parts += [torch.as_tensor(t[c], dtype=torch.float64) for t in (means, log_scales, coeffs)]
    return torch.cat(parts).to(dtype)


def random_dmol_params(k: int, seed: int, mean_range=1.0, log_scale_range=(-3.0, 0.5), coeff_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(k, generator=gen, dtype=torch.float64)
    means = (torch.rand(3, k, generator=gen, dtype=torch.float64) * 2 - 1) * mean_range
    lo, hi = log_scale_range
    log_scales = lo + (hi - lo) * torch.rand(3, k, generator=gen, dtype=torch.float64)
    coeffs = torch.randn(3, k, generator=gen, dtype=torch.float64) * coeff_scale
    return logits, means, log_scales, coeffs


def extreme_dmol_params(kind: str, k: int = 3, seed: int = 0):
    logits, means, log_scales, coeffs = random_dmol_params(k, seed)
    if kind == "sharp":  # log-scales at and below the -7 clamp, means inside
        log_scales = torch.full((3, k), -7.0, dtype=torch.float64) - torch.rand(3, k, dtype=torch.float64)
    elif kind == "sharp_on_edges":  # clamp scale, means exactly on bin edges
        log_scales = torch.full((3, k), -6.99, dtype=torch.float64)
        means = (torch.randint(0, 255, (3, k)).double() * 2 + 1) / 255.0 - 1.0
    elif kind == "far_means":  # means far outside [-1, 1]
        means = torch.tensor([[-5.0, 3.0, 40.0][:k]] * 3, dtype=torch.float64) * torch.tensor([[1.0], [-1.0], [0.5]])
        log_scales = torch.tensor([[-7.0, -3.0, 1.0][:k]] * 3, dtype=torch.float64)
    elif kind == "big_coeffs":  # tanh saturated at ±1
        coeffs = torch.tensor([[30.0, -30.0, 8.0][:k]] * 3, dtype=torch.float64)
        log_scales = torch.full((3, k), -5.0, dtype=torch.float64)
    elif kind == "wide":
        log_scales = torch.full((3, k), 4.0, dtype=torch.float64)
    elif kind == "random":
        pass
    else:
        raise AssertionError(kind)
    return logits, means, log_scales, coeffs


EXTREMES = ["random", "sharp", "sharp_on_edges", "far_means", "big_coeffs", "wide"]


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def reference_channel_probs(means, log_scales, coeffs, rgb):
    """Per component k and channel c, the probability of the bin (plain float64 CDF differences)."""
    k_count = means.shape[1]
    x = [v / 127.5 - 1.0 for v in rgb]
    out = [[0.0] * k_count for _ in range(3)]
    for k in range(k_count):
        a, b, g = (math.tanh(float(coeffs[i, k])) for i in range(3))
        m = [float(means[0, k]), float(means[1, k]) + a * x[0], float(means[2, k]) + b * x[0] + g * x[1]]
        for c in range(3):
            inv_s = math.exp(-max(float(log_scales[c, k]), -7.0))
            upper = sigmoid(inv_s * (x[c] - m[c] + 1 / 255))
            lower = sigmoid(inv_s * (x[c] - m[c] - 1 / 255))
            if rgb[c] == 0:
                p = upper
            elif rgb[c] == 255:
                p = 1.0 - lower
            else:
                p = upper - lower
            out[c][k] = p
    return out


def dmol_log_probs(head: DMOLHead, params: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """head.log_prob for one parameter vector and (N, 3) targets."""
    return head.log_prob(params.expand(targets.shape[0], -1), targets)


# ----- DMOL: agreement with an independent computation ----------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dmol_matches_reference_on_non_tail_cases(seed):
    k = 3
    head = DMOLHead(8, k)
    logits, means, log_scales, coeffs = random_dmol_params(k, seed)
    params = pack(logits, means, log_scales, coeffs)
    gen = torch.Generator().manual_seed(100 + seed)
    # Half the targets near the component means, half anywhere (including edges 0 and 255).
    near = ((means.T[torch.randint(0, k, (150,), generator=gen)] + 1) * 127.5).round().clamp(0, 255).long()
    near = (near + torch.randint(-6, 7, near.shape, generator=gen)).clamp(0, 255)
    anywhere = torch.randint(0, 256, (150, 3), generator=gen)
    edges = torch.tensor([[0, 0, 0], [255, 255, 255], [0, 255, 128], [255, 0, 3]])
    targets = torch.cat([near, anywhere, edges])

    log_p, log_w = head.channel_log_probs(params.expand(len(targets), -1), targets)
    joint = dmol_log_probs(head, params, targets)
    ref_w = torch.log_softmax(logits, 0)
    torch.testing.assert_close(log_w.double(), ref_w.expand_as(log_w), atol=1e-6, rtol=0)
    compared_channels = compared_joint = 0
    for i, rgb in enumerate(targets.tolist()):
        probs = reference_channel_probs(means, log_scales, coeffs, rgb)
        for c in range(3):
            for kk in range(k):
                if probs[c][kk] > 1e-4:  # not a tail: the CDF difference is meaningful in float32
                    assert abs(float(log_p[i, c, kk]) - math.log(probs[c][kk])) < 2e-3, (rgb, c, kk)
                    compared_channels += 1
        terms = [math.exp(float(ref_w[kk])) * probs[0][kk] * probs[1][kk] * probs[2][kk] for kk in range(k)]
        total = sum(terms)
        # Compare the mixture where every component is either a non-tail case or negligible.
        if total > 0 and all(min(probs[c][kk] for c in range(3)) > 1e-4 or terms[kk] < 1e-4 * total
                             for kk in range(k)):
            assert abs(float(joint[i]) - math.log(total)) < 2e-3, rgb
            compared_joint += 1
    assert compared_channels > 1000 and compared_joint > 50, (compared_channels, compared_joint)  # not vacuous


def test_dmol_edge_bins_use_stable_log_sigmoid_forms():
    # Far in the tails the edge bins must stay finite and follow log σ(x) ≈ x, log(1 − σ(x)) ≈ −x.
    head = DMOLHead(8, 1)
    means = torch.tensor([[5.0], [-5.0], [0.0]], dtype=torch.float64)
    log_scales = torch.full((3, 1), -7.0, dtype=torch.float64)
    coeffs = torch.zeros(3, 1, dtype=torch.float64)
    params = pack([0.0], means, log_scales, coeffs)
    log_p, _ = head.channel_log_probs(params[None], torch.tensor([[0, 255, 0]]))
    inv_s = math.exp(7.0)
    expected_r = inv_s * (-1.0 - 5.0 + 1 / 255)   # log σ(very negative) ≈ argument
    expected_g = -inv_s * (1.0 + 5.0 - 1 / 255)   # log(1 − σ(very positive)) ≈ −argument
    assert torch.isfinite(log_p).all()
    assert abs(float(log_p[0, 0, 0]) / expected_r - 1) < 1e-4
    assert abs(float(log_p[0, 1, 0]) / expected_g - 1) < 1e-4
    # B: mean 0, value 0 is the lowest bin far below the mean: log σ(inv_s·(−1 + 1/255))
    assert abs(float(log_p[0, 2, 0]) / (inv_s * (-1 + 1 / 255)) - 1) < 1e-4


def test_dmol_interior_tail_is_finite_and_tiny():
    # An interior bin far from a sharp component: a finite, very negative log-probability, and gradients.
    head = DMOLHead(8, 1)
    params = pack([0.0], torch.full((3, 1), -0.9, dtype=torch.float64), torch.full((3, 1), -7.0, dtype=torch.float64),
                  torch.zeros(3, 1, dtype=torch.float64)).requires_grad_()
    log_p, _ = head.channel_log_probs(params[None], torch.tensor([[200, 128, 60]]))
    assert torch.isfinite(log_p).all()
    assert (log_p < math.log(1e-5)).all()
    log_p.sum().backward()
    assert torch.isfinite(params.grad).all()


def exact_interior_log_mass(x: float, mean: float, log_scale: float) -> float:
    """log(σ(u) − σ(l)) of one interior bin, with 60 significant digits (mpmath): the CDF
    difference itself, so a mass of 1e-30 next to σ ≈ 1 keeps 30 digits."""
    with mpmath.workdps(60):
        inv_s = mpmath.exp(-mpmath.mpf(log_scale))
        centered = mpmath.mpf(x) - mpmath.mpf(mean)
        half_bin = mpmath.mpf(1) / 255

        def cdf(z):
            return 1 / (1 + mpmath.exp(-z))

        return float(mpmath.log(cdf(inv_s * (centered + half_bin)) - cdf(inv_s * (centered - half_bin))))


def test_dmol_interior_bins_are_accurate_at_any_mass():
    """Interior bins in float32 equal the exact log CDF difference within 1e-3 nats, for bin
    masses from 1e-1 down to 1e-30 (every decade covered)."""
    head = DMOLHead(8, 1)
    log_scales = torch.linspace(-7.0, -1.0, 13).tolist()
    means = [-0.3, 0.1037]
    values = torch.arange(1, LEVELS - 1)  # the interior bins
    errors, decades = [], set()
    naive_worst = 0.0
    for log_scale in log_scales:
        for mean in means:
            # R only (no coupling): the R mean is `mean`, the scale e^log_scale, in float32.
            params = pack([0.0], torch.tensor([[mean], [0.0], [0.0]]), torch.full((3, 1), log_scale), torch.zeros(3, 1))
            targets = torch.stack([values, torch.zeros_like(values), torch.zeros_like(values)], dim=1)
            log_p = head.channel_log_probs(params.expand(len(values), -1), targets)[0][:, 0, 0]
            # the reference sees exactly the float32 parameters the head sees
            mean32, log_scale32 = float(params[1]), float(params[2])
            for v, got in zip(values.tolist(), log_p.tolist()):
                want = exact_interior_log_mass(v / 127.5 - 1.0, mean32, log_scale32)
                if not math.log(1e-30) <= want <= math.log(1e-1):
                    continue
                errors.append(abs(got - want))
                decades.add(math.floor(-want / math.log(10)))
                # what the plain float32 difference of two sigmoids gives (the negative control)
                u = torch.tensor((v / 127.5 - 1.0 - mean32 + 1 / 255) * math.exp(-log_scale32), dtype=torch.float32)
                l = torch.tensor((v / 127.5 - 1.0 - mean32 - 1 / 255) * math.exp(-log_scale32), dtype=torch.float32)
                naive = float(torch.log(torch.sigmoid(u) - torch.sigmoid(l)))
                naive_worst = max(naive_worst, abs(naive - want) if math.isfinite(naive) else math.inf)
    assert decades >= set(range(1, 30)), sorted(set(range(1, 30)) - decades)  # masses 1e-1 .. 1e-30 all seen
    assert max(errors) < 1e-3, max(errors)
    assert naive_worst > 1.0  # the check has teeth: the plain difference cannot pass it


def direct_interior_log_p(head: DMOLHead, params: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The interior bins' log p as log σ(u) + log σ(−l) + log(1 − e^(−gap)), with no care for wide
    scales: what ``log_mass`` computed before ``TINY_GAP`` (the negative control below)."""
    _, means, log_scales, coeffs = head.split(params)
    x = targets.long().unsqueeze(-1).to(means.dtype) / HALF_RANGE - 1.0
    centered = x - head.coupled_means(means, coeffs, x)
    inv_s = torch.exp(-log_scales)
    upper, lower = inv_s * (centered + HALF_BIN), inv_s * (centered - HALF_BIN)
    return F.logsigmoid(upper) + F.logsigmoid(-lower) + torch.log(-torch.expm1(-(2.0 * HALF_BIN * inv_s)))


@pytest.mark.parametrize("log_scale", [70.0, 88.0, 90.0, 104.0, 1000.0])
def test_dmol_very_wide_components_keep_a_finite_exact_log_p_and_gradient(log_scale):
    """A component so wide that e^(−s) underflows float32 (log-scales from about 88, where an unused
    component can drift in a network's first steps): the interior bin's log p is that of the
    logistic's density at its centre times the bin, log(2/255) − s − log 4, and every gradient is
    finite (d log p / d s = −1 there); the direct form's gradient is not (the negative control)."""
    head = DMOLHead(8, 1)
    # R interior (value 128, mean 0), G and B in the open end bins (mass 1/2 each for so wide a component)
    params = pack([0.0], torch.zeros(3, 1), torch.full((3, 1), log_scale), torch.zeros(3, 1)).requires_grad_()
    targets = torch.tensor([[128, 0, 255]])
    log_p, _ = head.channel_log_probs(params[None], targets)
    want = math.log(2 / 255) - log_scale - math.log(4)
    assert float(log_p[0, 0, 0]) == pytest.approx(want, rel=1e-6)
    assert torch.allclose(log_p[0, 1:, 0], torch.full((2,), math.log(0.5)))
    log_p.sum().backward()
    assert torch.isfinite(params.grad).all()
    assert float(params.grad[2]) == pytest.approx(-1.0, abs=1e-6)  # R's log-scale (after the logit and R's mean)
    if log_scale >= 90:  # negative control: the direct form loses the gradient (or the value) here
        direct = params.detach().clone().requires_grad_()
        direct_interior_log_p(head, direct[None], targets)[0, 0, 0].backward()
        assert not torch.isfinite(direct.grad).all()


def test_dmol_log_p_at_ordinary_scales_is_the_direct_forms():
    """Where the gap is above TINY_GAP (every log-scale below about 64) the interior bins' log p is
    the direct form's bit for bit (a model's scores do not change), and its gradients within float32's
    rounding (autograd sums the log-scales' gradients in another order)."""
    torch.manual_seed(0)
    head = DMOLHead(8, 3)
    rest = torch.randn(64, 3, 3, 3) * 3  # (channel, means | log-scales | coefficients, component)
    rest[:, :, 1] = torch.empty(64, 3, 3).uniform_(-7.0, 60.0)  # log-scales
    params = torch.cat([torch.randn(64, 3), rest.flatten(1)], dim=1)
    targets = torch.randint(1, 255, (64, 3))  # interior bins only: the direct form has no open ends
    ours, reference = params.clone().requires_grad_(), params.clone().requires_grad_()
    got = head.channel_log_probs(ours, targets)[0]
    want = direct_interior_log_p(head, reference, targets)
    assert torch.equal(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-6, atol=1e-6)


def test_dmol_log_scale_is_clamped_at_minus_seven():
    head = DMOLHead(8, 1)
    means = torch.full((3, 1), 0.1, dtype=torch.float64)
    coeffs = torch.zeros(3, 1, dtype=torch.float64)
    targets = torch.tensor([[140, 141, 142]])
    at_clamp = head.log_prob(pack([0.0], means, torch.full((3, 1), -7.0), coeffs)[None], targets)
    below = head.log_prob(pack([0.0], means, torch.full((3, 1), -20.0), coeffs)[None], targets)
    above = head.log_prob(pack([0.0], means, torch.full((3, 1), -6.0), coeffs)[None], targets)
    assert torch.equal(at_clamp, below)
    assert not torch.equal(at_clamp, above)


# ----- DMOL: normalisation -----------------------------------------------------------------


@pytest.mark.parametrize("kind", EXTREMES)
def test_dmol_each_channel_sums_to_one(kind):
    """For every component and channel, the 256 bin probabilities (given earlier channels) sum to 1."""
    k = 3
    head = DMOLHead(8, k)
    logits, means, log_scales, coeffs = extreme_dmol_params(kind, k)
    params = pack(logits, means, log_scales, coeffs)
    gen = torch.Generator().manual_seed(7)
    values = torch.arange(LEVELS)
    for _ in range(3):  # a few settings of the other channels
        fixed = torch.randint(0, 256, (3,), generator=gen)
        for c in range(3):
            targets = fixed.repeat(LEVELS, 1)
            targets[:, c] = values
            log_p, _ = head.channel_log_probs(params.expand(LEVELS, -1), targets)
            assert torch.isfinite(log_p[:, c]).all()
            totals = log_p[:, c].double().exp().sum(0)  # (K,)
            torch.testing.assert_close(totals, torch.ones(k, dtype=torch.float64), atol=1e-4, rtol=0,
                                       msg=lambda m: f"{kind}, channel {c}, other channels {fixed.tolist()}: {m}")


def joint_sum(head: DMOLHead, params: torch.Tensor, r_values) -> float:
    """Σ over r in r_values and all 256² (g, b) of the pixel probability exp(head.log_prob)."""
    gb = torch.cartesian_prod(torch.arange(LEVELS), torch.arange(LEVELS))  # (65536, 2)
    total = 0.0
    r_values = list(r_values)
    chunk = 4
    with torch.inference_mode():
        for i in range(0, len(r_values), chunk):
            rs = torch.tensor(r_values[i:i + chunk])
            r = rs.repeat_interleave(len(gb))
            targets = torch.cat([r[:, None], gb.repeat(len(rs), 1)], dim=1)
            total += dmol_log_probs(head, params, targets).double().exp().sum().item()
    return total


@pytest.mark.slow
def test_dmol_joint_over_all_pixel_values_sums_to_one():
    """Σ over all 256³ values of one pixel = 1, for one component with strong coupling.

    16.7M evaluations take several seconds on two shared cores, so this is done for a
    single K = 1 parameter vector; the mixture is covered by the next test. The head
    scores in float32 by design, hence the 1e-4 tolerance.
    """
    head = DMOLHead(8, 1)
    params = pack([0.0], torch.tensor([[0.3], [-0.8], [0.95]]), torch.tensor([[-3.0], [-4.5], [-6.0]]),
                  torch.tensor([[1.5], [-2.0], [0.7]]))
    total = joint_sum(head, params, range(LEVELS))
    assert abs(total - 1.0) < 1e-4, total


@pytest.mark.parametrize("kind", ["random", "sharp_on_edges", "big_coeffs"])
def test_dmol_mixture_joint_over_g_and_b_gives_r_marginal(kind):
    """K = 3: for fixed R = r, Σ over all 256² (g, b) of the mixture joint = Σ_k w_k p_Rk(r).

    The weights and p_Rk come from the independent float64 reference, so this checks
    that each component's G and B conditionals are normalised inside the mixture.
    """
    k = 3
    head = DMOLHead(8, k)
    logits, means, log_scales, coeffs = extreme_dmol_params(kind, k, seed=5)
    params = pack(logits, means, log_scales, coeffs)
    weights = torch.softmax(logits, 0).tolist()
    # R values carrying real mass: the bins nearest to each component's R mean.
    r_values = sorted({int(min(max(round((float(means[0, kk]) + 1) * 127.5), 0), 255)) for kk in range(k)})
    for r in r_values:
        probs = reference_channel_probs(means, log_scales, coeffs, [r, 0, 0])
        expected = sum(w * probs[0][kk] for kk, w in enumerate(weights))
        assert expected > 1e-3
        got = joint_sum(head, params, [r])
        assert abs(got / expected - 1) < 1e-4, (r, got, expected)


def test_dmol_scores_float64_parameters_in_float64():
    # Sharp components near the targets: in float32 the bin centre and edges carry ~1e-7
    # relative error, amplified by inv_s ~ 400; a float64 model must not be limited by that.
    k = 2
    head = DMOLHead(8, k).double()
    logits, means, log_scales, coeffs = random_dmol_params(k, seed=7, log_scale_range=(-6.0, -4.0))
    params64 = pack(logits, means, log_scales, coeffs, torch.float64)
    targets = ((means.T + 1) * 127.5).round().clamp(1, 254).long()  # each component's own bin (interior)
    log_p64, _ = head.channel_log_probs(params64.expand(k, -1), targets)
    log_p32, _ = head.channel_log_probs(params64.float().expand(k, -1), targets)
    assert log_p64.dtype == torch.float64
    worst32 = worst64 = 0.0
    for i, rgb in enumerate(targets.tolist()):
        probs = reference_channel_probs(means, log_scales, coeffs, rgb)
        for c in range(3):
            for kk in range(k):
                if probs[c][kk] > 1e-4:
                    worst64 = max(worst64, abs(float(log_p64[i, c, kk]) - math.log(probs[c][kk])))
                    worst32 = max(worst32, abs(float(log_p32[i, c, kk]) - math.log(probs[c][kk])))
    assert worst64 < 1e-9, worst64
    assert worst32 > 1e-7, worst32  # the same parameters in float32: visibly less exact


# ----- categorical head -------------------------------------------------------------------


def test_categorical_probabilities_sum_to_one_and_match_softmax():
    head = CategoricalHead(8)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, LEVELS, generator=gen) * 4
    every_value = torch.arange(LEVELS).view(LEVELS, 1, 1).expand(LEVELS, 2, 5)
    all_lp = torch.stack([head.log_prob(logits, values) for values in every_value], dim=-1)  # (2, 5, 256)
    torch.testing.assert_close(all_lp.double().exp().sum(-1), torch.ones(2, 5, dtype=torch.float64), atol=1e-5, rtol=0)
    targets = torch.randint(0, 256, (2, 5), generator=gen)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(head.log_prob(logits, targets).double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("image_size,attention", [(4, "local_1d"), (4, "local_2d"), (32, "local_1d")])
def test_uniform_categorical_model_scores_exactly_8_bits(image_size, attention):
    model = tiny_model(image_size=image_size, attention=attention)
    with torch.no_grad():
        model.head.proj.weight.zero_()
        model.head.proj.bias.zero_()
    images = random_images(3, image_size, seed=4)
    with torch.no_grad():
        bpd = model.bits_per_dim(images)
    assert bpd.shape == (3,)
    assert (bpd - 8.0).abs().max().item() < 1e-5, bpd


# ----- sampling ---------------------------------------------------------------------------


def chi_square(samples: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Chi-square statistic over coarse bins of 16 values (sparse bins merged); returns (stat, dof)."""
    n = samples.numel()
    counts = torch.bincount(samples.flatten(), minlength=LEVELS).double().view(16, 16).sum(1)
    expected = probs.double().view(16, 16).sum(1) * n
    keep = expected >= 5
    obs = counts[keep].tolist()
    exp = expected[keep].tolist()
    rest_obs, rest_exp = counts[~keep].sum().item(), expected[~keep].sum().item()
    if rest_exp >= 5:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:  # too little mass to test on its own: observed counts there must be rare too
        assert rest_obs <= 10 + 5 * rest_exp
        obs[exp.index(max(exp))] += rest_obs
        exp[exp.index(max(exp))] += rest_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, len(obs) - 1


def passes(stat: float, dof: int) -> bool:
    return stat < dof + 6 * math.sqrt(2 * dof) + 10  # far out in the tail for a correct sampler


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_categorical_samples_follow_probabilities(temperature):
    head = CategoricalHead(8)
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(LEVELS, generator=gen) * 2
    n = 20000
    samples = head.sample(logits.expand(1, n, LEVELS), temperature, generator=torch.Generator().manual_seed(12))
    assert samples.shape == (1, n)
    probs = torch.softmax(logits.double() / temperature, -1)
    assert passes(*chi_square(samples, probs))
    # Power check: the same samples do not pass against the distribution at another temperature.
    other = torch.softmax(logits.double() / (2.0 * temperature), -1)
    assert not passes(*chi_square(samples, other))


def test_categorical_temperature_zero_is_argmax():
    head = CategoricalHead(8)
    logits = torch.randn(3, 7, LEVELS, generator=torch.Generator().manual_seed(2))
    assert torch.equal(head.sample(logits, 0.0), logits.argmax(-1))


@pytest.mark.parametrize("head", [CategoricalHead(8), DMOLHead(8, 2)], ids=["categorical", "dmol"])
@pytest.mark.parametrize("temperature", [-0.5, -1e-9, float("nan"), float("inf")])
def test_bad_temperature_raises(head, temperature):
    params = torch.zeros(1, 2, LEVELS if isinstance(head, CategoricalHead) else 20)
    with pytest.raises(ValueError, match="temperature"):
        head.sample(params, temperature)


def dmol_marginals(head: DMOLHead, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Model marginals of R and of G (summing the joint over R), each (256,), in float64."""
    rg = torch.cartesian_prod(torch.arange(LEVELS), torch.arange(LEVELS))
    targets = torch.cat([rg, torch.zeros(len(rg), 1, dtype=torch.long)], dim=1)
    log_p, log_w = head.channel_log_probs(params.expand(len(targets), -1), targets)
    joint_rg = (log_w + log_p[:, 0] + log_p[:, 1]).double().exp().sum(-1).view(LEVELS, LEVELS)
    return joint_rg.sum(1), joint_rg.sum(0)


def test_dmol_samples_follow_probabilities():
    head = DMOLHead(8, 2)
    logits = torch.tensor([0.3, -0.2], dtype=torch.float64)
    means = torch.tensor([[-0.4, 0.35], [0.1, -0.3], [0.5, 0.0]], dtype=torch.float64)
    log_scales = torch.full((3, 2), -2.5, dtype=torch.float64)
    coeffs = torch.tensor([[0.8, -0.5], [0.3, 0.2], [-0.6, 0.4]], dtype=torch.float64)
    params = pack(logits, means, log_scales, coeffs)
    n = 20000
    samples = head.sample(params.expand(1, n, -1), 1.0, generator=torch.Generator().manual_seed(3))
    assert samples.shape == (1, n, 3) and samples.dtype == torch.long
    assert samples.min() >= 0 and samples.max() <= 255
    p_r, p_g = dmol_marginals(head, params)
    assert abs(p_r.sum().item() - 1) < 1e-4 and abs(p_g.sum().item() - 1) < 1e-4
    assert passes(*chi_square(samples[0, :, 0], p_r))
    assert passes(*chi_square(samples[0, :, 1], p_g))  # G depends on R through α
    # Power check: shift the means by 0.1 (about 13 levels) and the same samples fail.
    p_r_shifted, _ = dmol_marginals(head, pack(logits, means + 0.1, log_scales, coeffs))
    assert not passes(*chi_square(samples[0, :, 0], p_r_shifted))
    # ... and dropping the coupling changes G's marginal enough to fail too.
    _, p_g_uncoupled = dmol_marginals(head, pack(logits, means, log_scales, torch.zeros_like(coeffs)))
    assert not passes(*chi_square(samples[0, :, 1], p_g_uncoupled))


def test_dmol_temperature_scales_the_noise():
    head = DMOLHead(8, 1)
    params = pack([0.0], torch.zeros(3, 1), torch.full((3, 1), -2.5), torch.zeros(3, 1))
    n = 20000
    hot = head.sample(params.expand(1, n, -1), 1.0, generator=torch.Generator().manual_seed(5))[0, :, 0].double()
    cold = head.sample(params.expand(1, n, -1), 0.5, generator=torch.Generator().manual_seed(6))[0, :, 0].double()
    # logistic std = s·π/√3 with s = e^-2.5, in units of levels (×127.5)
    expected_std = math.exp(-2.5) * math.pi / math.sqrt(3) * 127.5
    assert abs(hot.std().item() / expected_std - 1) < 0.05
    assert abs(cold.std().item() / hot.std().item() - 0.5) < 0.04


def test_dmol_temperature_zero_is_deterministic():
    head = DMOLHead(8, 3)
    logits = torch.tensor([0.1, 2.0, -1.0], dtype=torch.float64)  # component 1 wins
    means = torch.tensor([[0.9, 1.3, 0.2], [0.0, -0.52, -0.7], [0.3, -0.37, 0.6]], dtype=torch.float64)  # R mean > 1
    log_scales = torch.full((3, 3), -1.0, dtype=torch.float64)
    coeffs = torch.tensor([[0.0, 0.7, 0.0], [0.0, -0.4, 0.0], [0.0, 0.9, 0.0]], dtype=torch.float64)
    params = pack(logits, means, log_scales, coeffs).expand(1, 4, -1)
    a = head.sample(params, 0.0, generator=torch.Generator().manual_seed(1))
    b = head.sample(params, 0.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b)
    # The chosen component's coupled means, each earlier channel entering as its level's
    # bin centre (what log_prob conditions on).
    alpha, beta, gamma = (math.tanh(float(coeffs[i, 1])) for i in range(3))

    def level(y):
        return round((min(max(y, -1.0), 1.0) + 1) * 127.5)

    r = level(float(means[0, 1]))
    g = level(float(means[1, 1]) + alpha * (r / 127.5 - 1))
    b_ = level(float(means[2, 1]) + beta * (r / 127.5 - 1) + gamma * (g / 127.5 - 1))
    assert a[0, 0].tolist() == [r, g, b_]
    assert (a == a[:, :1]).all()


# ----- DMOL: samples follow exp(log_prob) exactly -----------------------------------------


def dmol_table(head: DMOLHead, params: torch.Tensor, floor: float = 1e-9) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixel values (N, 3) that hold the mass of a K = 1 DMOL (every channel's conditional
    probability above ``floor``), sorted, and exp(head.log_prob) of each (N,)."""

    def conditional(fixed: list[int], channel: int) -> torch.Tensor:
        targets = torch.tensor(fixed).repeat(LEVELS, 1)
        targets[:, channel] = torch.arange(LEVELS)
        return head.channel_log_probs(params.expand(LEVELS, -1), targets)[0][:, channel, 0].double().exp()

    cells = []
    for r in (conditional([0, 0, 0], 0) > floor).nonzero().flatten().tolist():
        for g in (conditional([r, 0, 0], 1) > floor).nonzero().flatten().tolist():
            cells += [(r, g, b) for b in (conditional([r, g, 0], 2) > floor).nonzero().flatten().tolist()]
    cells = torch.tensor(cells)
    return cells, head.log_prob(params.expand(len(cells), -1), cells).double().exp()


def total_variation(samples: torch.Tensor, cells: torch.Tensor, probs: torch.Tensor) -> float:
    """TV between the empirical distribution of ``samples`` (n, 3) and ``probs`` on ``cells``;
    samples outside the cells and mass outside them both count in full."""
    key = lambda t: (t[:, 0] * LEVELS + t[:, 1]) * LEVELS + t[:, 2]  # noqa: E731
    cell_keys = key(cells)
    values, counts = torch.unique(key(samples), return_counts=True)
    where = torch.searchsorted(cell_keys, values).clamp(max=len(cells) - 1)
    inside = cell_keys[where] == values
    empirical = torch.zeros(len(cells), dtype=torch.float64)
    empirical[where[inside]] = counts[inside].double() / len(samples)
    outside = counts[~inside].sum().item() / len(samples)
    return 0.5 * ((empirical - probs).abs().sum().item() + outside + (1.0 - probs.sum().item()))


def exact_table_sample(cells: torch.Tensor, probs: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Exact by construction: inverse-CDF draws from the table of exp(log_prob) itself."""
    cdf = torch.cumsum(probs, 0)
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * cdf[-1]
    return cells[torch.searchsorted(cdf, u).clamp(max=len(cells) - 1)]


def coupled_on_continuous_draws(head: DMOLHead, params: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """The negative control: PixelCNN++'s sampler (K = 1), which couples G and B on the clipped
    *continuous* draws of R and G, not on the levels that log_prob conditions on."""
    _, means, log_scales, coeffs = (t[..., 0] for t in head.split(params.expand(n, -1)))
    u = torch.rand(means.shape, generator=torch.Generator().manual_seed(seed)).clamp(1e-5, 1 - 1e-5)
    x = means + torch.exp(log_scales) * (torch.log(u) - torch.log1p(-u))
    x_r = x[:, 0].clamp(-1, 1)
    x_g = (x[:, 1] + coeffs[:, 0] * x_r).clamp(-1, 1)
    x_b = (x[:, 2] + coeffs[:, 1] * x_r + coeffs[:, 2] * x_g).clamp(-1, 1)
    return torch.round((torch.stack([x_r, x_g, x_b], dim=1) + 1) * 127.5).long()


@pytest.mark.parametrize("log_scale", [-6.0, -7.0])
def test_dmol_samples_follow_exp_log_prob_for_sharp_coupled_components(log_scale):
    """K = 1, sharp channels, coupling tanh(2): the joint of 10^5 samples is as close to
    exp(log_prob) as an exact sampler's (within 3x its total variation), and the sampler
    that couples on continuous draws is not."""
    head = DMOLHead(8, 1)
    params = pack([0.0], torch.tensor([[0.101], [-0.2], [0.3]]), torch.full((3, 1), log_scale),
                  torch.full((3, 1), 2.0))
    cells, probs = dmol_table(head, params)
    assert abs(probs.sum().item() - 1) < 1e-4  # the table holds the mass
    n = 100_000
    noise_floor = sum(total_variation(exact_table_sample(cells, probs, n, seed), cells, probs)
                      for seed in range(5)) / 5
    samples = head.sample(params.expand(1, n, -1), 1.0, generator=torch.Generator().manual_seed(11))[0]
    assert total_variation(samples, cells, probs) < 3 * noise_floor
    assert total_variation(coupled_on_continuous_draws(head, params, n, seed=11), cells, probs) > 3 * noise_floor


def test_coupled_mean_is_one_function_for_torch_and_the_codecs_numpy_arrays():
    """The coupling is written once (``heads.coupled_mean``): the head's scores and draws read it on
    tensors, the codec on numpy float64 arrays; the same bits either way, and each channel's mean as
    docs/model.md §5 writes it (a negative control: G without α's term differs)."""
    gen = torch.Generator().manual_seed(0)
    means, coeffs = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64), torch.randn(5, 3, 4, generator=gen,
                                                                                          dtype=torch.float64)
    x = torch.rand(5, 3, 1, generator=gen, dtype=torch.float64) * 2 - 1
    earlier = list(x.unbind(-2))
    for channel in range(3):
        on_torch = coupled_mean(means, coeffs, earlier[:channel], channel)
        on_numpy = coupled_mean(means.numpy(), coeffs.numpy(), [e.numpy() for e in earlier[:channel]], channel)
        assert np.array_equal(on_torch.numpy(), on_numpy)
    written = [means[:, 0], means[:, 1] + coeffs[:, 0] * x[:, 0], means[:, 2] + coeffs[:, 1] * x[:, 0] + coeffs[:, 2] * x[:, 1]]
    for channel, want in enumerate(written):
        assert torch.equal(coupled_mean(means, coeffs, earlier[:channel], channel), want)
    assert not torch.allclose(coupled_mean(means, coeffs, [], 1), written[1])
    assert torch.equal(DMOLHead.coupled_means(means, coeffs, x), torch.stack(written, dim=-2))
