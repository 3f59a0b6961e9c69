"""Shared helpers for the imagetx model-core tests: tiny configurations, models and images.

Everything here is deliberately small (d_model 16, one or two layers, 4×4 images) so
that the whole suite runs in seconds on two shared CPU cores.
"""

from __future__ import annotations

import pytest
import torch

from imagetx import ImageTransformer, ModelConfig

# Tiny tensors on two shared cores: intra-op threads only add synchronisation cost
# (measured: one backward pass of a tiny model 16x slower with 2 threads under load).
torch.set_num_threads(1)

# Defaults for a tiny model. The 2D block (2, 2) tiles both the categorical grid of a
# 4×4 image (4×12 sub-pixels) and the DMOL grid (4×4 pixels).
TINY = dict(
    image_size=4,
    head="categorical",
    n_layers=1,
    d_model=16,
    n_heads=2,
    d_filter=32,
    dropout=0.0,
    attention="local_1d",
    query_block_length=8,
    memory_blocks=1,
    query_block_shape=(2, 2),
    memory_flange=(1, 1),
    position_encoding="sinusoidal",
    num_classes=0,
    norm="post",
    mixture_components=2,
    encoder_layers=0,
    low_res_size=2,
)


def tiny_config(**overrides) -> ModelConfig:
    """A ModelConfig for a tiny model with dropout 0; any field can be overridden."""
    values = dict(TINY)
    values.update(overrides)
    return ModelConfig(**values)


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> ImageTransformer:
    """A seeded tiny ImageTransformer in eval mode."""
    torch.manual_seed(seed)
    model = ImageTransformer(tiny_config(**overrides))
    return model.to(dtype).eval()


def random_images(batch: int, size: int, seed: int = 0, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Seeded random images (batch, size, size, 3) with values 0..255."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, size, size, 3), generator=gen).to(dtype)


def random_labels(batch: int, num_classes: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_classes, (batch,), generator=gen)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield
