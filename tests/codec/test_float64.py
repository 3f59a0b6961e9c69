"""codec/float64.py's tanh (format 6: the DMOL head's coupling coefficients; issue 124, "also found
by measurement": the float64 step called torch's tanh, glibc's, though docs/compress.md said it
used no libm). Its bits are compared between glibc's variants in test_codec_glibc.py; here its
accuracy against numpy's tanh, its edge values, and that format 6 calls no torch tanh while
formats 4 and 5 still do, as their files were coded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import imagetx.codec.api as codec_api
from helpers import random_images, tiny_model
from imagetx.codec import compress, decompress, float64
from imagetx.codec.container import FORMAT_VERSION

# What its expm1 and the division may add up to (expm1 is within a few ulps: test_codec_glibc.py).
TANH_ULPS = 4


def test_tanh_is_within_a_few_ulps_of_numpys():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-20, 20, 100_000), rng.uniform(-1e-3, 1e-3, 50_000),
                        10.0 ** rng.uniform(-300, -5, 50_000)])
    ours, reference = float64.tanh(x), np.tanh(x)
    assert np.abs(ours.view(np.int64) - reference.view(np.int64)).max() <= TANH_ULPS


def test_tanh_at_its_edges():
    x = np.array([0.0, -0.0, 1e-320, 40.0, -40.0, 1e300, np.inf, -np.inf])
    expected = np.array([0.0, -0.0, 1e-320, 1.0, -1.0, 1.0, 1.0, -1.0])
    ours = float64.tanh(x)
    assert np.array_equal(ours, expected) and np.array_equal(np.signbit(ours), np.signbit(expected))
    assert np.isnan(float64.tanh(np.array([np.nan]))).all()


@pytest.fixture
def tanh_calls(monkeypatch) -> list:
    """torch.tanh, counted."""
    calls, original = [], torch.tanh
    monkeypatch.setattr(torch, "tanh", lambda x: calls.append(x.shape) or original(x))
    return calls


def test_formats_from_6_call_no_torch_tanh_and_format_5_still_does(tanh_calls, monkeypatch):
    model = tiny_model(seed=1, head="dmol")
    images = random_images(2, 4, seed=2).numpy()
    data = compress(model, images, portable=False)
    assert data[4] == FORMAT_VERSION >= 6 and np.array_equal(decompress(model, data), images)
    assert tanh_calls == []
    monkeypatch.setattr(codec_api, "FORMAT_VERSION", 5)
    old = compress(model, images, portable=False)
    assert old[4] == 5 and len(tanh_calls) == model.order.length  # one a step, as format 5 was coded
    assert np.array_equal(decompress(model, old), images) and len(tanh_calls) == 2 * model.order.length
