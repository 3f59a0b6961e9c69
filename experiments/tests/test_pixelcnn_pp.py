"""experiments/pixelcnn_pp.py and pixelcnn_pp_model.py: the network sees only the pixels before
each position (and the check catches a leak), the distribution the loss scores is normalised,
and a run with a tiny budget scores about 8 bits/dim on random images and hands back its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from experiments import pixelcnn_pp_model
from experiments.pixelcnn_pp import sample_images
from experiments.pixelcnn_pp_model import PixelCNNpp, to_model_input
from experiments.tests.conftest import REPO_ROOT, write_cifar_npz

SIDE = 32  # the three stages run at 32, 16 and 8
WIDTH = SIDE  # positions per row: t − WIDTH is the pixel above t
LEVELS = 256
# Positions checked: the first pixel, the rest of the first row, the first and second of a
# row (t − 1 the end of the row above), the middle, and the last pixel.
POSITIONS = [0, 1, 31, 32, 33, 16 * WIDTH + 16, SIDE * WIDTH - 1]


def small_net(seed: int = 0, **sizes) -> PixelCNNpp:
    """A seeded network of 8 filters: every layer of the real one, at a fraction of its cost."""
    torch.manual_seed(seed)
    return PixelCNNpp(**{"nr_resnet": 1, "nr_filters": 8, "nr_logistic_mix": 3, **sizes})


def input_gradients(net: PixelCNNpp, positions: list[int]) -> torch.Tensor:
    """(len(positions), H·W): for each position t, max over channels of |∂ params at t / ∂ input|
    at every input position, from one random image per t (images in a batch do not interact)."""
    x = torch.randn(len(positions), 3, SIDE, SIDE, requires_grad=True)
    params = net(x)
    params[torch.arange(len(positions)), positions].sum().backward()
    return x.grad.abs().amax(dim=1).flatten(1)


@pytest.mark.parametrize("nr_resnet", [1, 2])
def test_output_at_t_reads_no_input_at_or_after_t(nr_resnet):
    grads = input_gradients(small_net(nr_resnet=nr_resnet), POSITIONS)
    for row, t in zip(grads, POSITIONS):
        assert torch.all(row[t:] == 0), f"t={t} reads positions {(row[t:] != 0).nonzero().flatten()[:5] + t}"
        # ...while it does read what it should (so the gradients are really measured):
        if t % WIDTH:
            assert row[t - 1] > 0, f"t={t} does not read its left neighbour"
        if t >= WIDTH:
            assert row[t - WIDTH] > 0, f"t={t} does not read the pixel above"


def test_the_causality_check_catches_a_leak(monkeypatch):
    """Negative control: without the first layer's down shift, the u stream sees its own row."""
    monkeypatch.setattr(pixelcnn_pp_model, "down_shift", lambda x: x)
    grads = input_gradients(small_net(), POSITIONS)
    leaks = [t for row, t in zip(grads, POSITIONS) if torch.any(row[t:] != 0)]
    assert leaks == POSITIONS


def test_the_scored_distribution_sums_to_one_over_each_channel_in_the_coupled_order():
    """At a pixel of a real forward pass, for every mixture component: R's 256 probabilities sum
    to 1; G's given every R; B's given 64 random (R, G). So the mixture's 256³ values sum to 1,
    the weights summing to 1. (The head's joint over all 256³ values is summed in tests/model/test_heads.py.)"""
    k = 3
    net = small_net(nr_logistic_mix=k)
    t = 16 * WIDTH + 5
    with torch.no_grad():
        params = net(torch.rand(1, 3, SIDE, SIDE) * 2 - 1)[0, t]  # (10·K,)
    values = torch.arange(LEVELS)
    grid = torch.cartesian_prod(values, values)  # every (R, G)
    gen = torch.Generator().manual_seed(3)
    given_rg = torch.randint(0, LEVELS, (64, 2), generator=gen)
    targets = {  # channel -> (contexts, 256, 3) targets running through that channel's values
        0: torch.stack([values, values * 0, values * 0], -1)[None],
        1: torch.stack([grid[:, 0], grid[:, 1], grid[:, 0] * 0], -1).view(LEVELS, LEVELS, 3),
        2: torch.cat([given_rg[:, None].expand(-1, LEVELS, -1), values[None, :, None].expand(64, -1, 1)], -1),
    }
    for channel, target in targets.items():
        log_p, log_weights = net.head.channel_log_probs(params.expand(*target.shape[:2], -1), target)
        totals = log_p[..., channel, :].double().exp().sum(1)  # (contexts, K)
        torch.testing.assert_close(totals, torch.ones_like(totals), atol=1e-4, rtol=0,
                                   msg=lambda m: f"channel {channel}: {m}")
    weights = log_weights.double().exp().sum(-1)
    torch.testing.assert_close(weights, torch.ones_like(weights))


@pytest.mark.slow
def test_a_tiny_run_scores_about_8_bits_per_dim_and_hands_back_its_json(tmp_path):
    root = tmp_path / "data"
    # Uniform random images (no model beats 8 bits/dim): 48 to train on (3 whole batches), 40 val.
    write_cifar_npz(root, train_sizes=(48, 40))
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "experiments.pixelcnn_pp", "--data.root", str(root),
                           "--val-size", "40", "--val-limit", "32", "--max-minutes", "0.02",
                           "--progress-seconds", "1", "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result == json.loads(out.read_text())
    assert any(line.startswith("step ") for line in lines[:-1])  # progress lines
    assert result["steps"] >= 1 and result["images_seen"] == 16 * result["steps"]
    assert result["minutes"] >= 0.02
    assert result["val_images"] == 32
    # Random uniform pixels cost 8 bits each at best; a few steps from random weights, a little more.
    for key in ("val_bpd", "val_bpd_raw"):
        assert 7.9 < result[key] < 10.0, result
    assert result["settings"]["batch_size"] == 16 and result["settings"]["lr"] == 1e-3
    assert result["threads"] == 1 and result["torch"] == torch.__version__


@pytest.mark.slow
def test_samples_are_drawn_from_the_distribution_of_the_finished_image_at_each_pixel(monkeypatch):
    """``sample_images`` draws pixel t from the parameters the network gives at t while only the pixels
    before t are drawn; the network being causal, those are the parameters it gives at t for the finished
    image, which is what the likelihood scores (recorded at every 97th pixel and compared)."""
    net = small_net(seed=1).eval()
    seen = {}
    draw = net.head.sample
    calls = iter(range(SIDE * WIDTH))

    def recording_sample(params, **kwargs):
        t = next(calls)
        if t % 97 == 0:
            seen[t] = params[:, 0].clone()
        return draw(params, **kwargs)

    monkeypatch.setattr(net.head, "sample", recording_sample)
    images = sample_images(net, 2, torch.Generator().manual_seed(0))
    assert images.shape == (2, SIDE, SIDE, 3) and images.dtype == torch.uint8
    assert images.float().std() > 0  # drawn, not left at zero
    with torch.no_grad():
        finished = net(to_model_input(images))
    for t, params in seen.items():
        torch.testing.assert_close(params, finished[:, t], msg=lambda m: f"pixel {t}: {m}")
