"""The opt-in torch.compile switch (performance issue): same numbers, same checkpoint keys."""

import torch

from imagetx import ModelConfig
from imagetx.training.module import ImageTransformerModule


def test_compiled_module_matches_eager_and_keeps_parameter_names():
    torch.manual_seed(0)
    config = ModelConfig(image_size=8, head="dmol", n_layers=1, d_model=16, n_heads=2, d_filter=32,
                         dropout=0.0, query_block_length=16)
    eager = ImageTransformerModule(config)
    compiled = ImageTransformerModule(config, compile=True)
    compiled.load_state_dict(eager.state_dict())
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = {"images": torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8), "labels": torch.zeros(2, dtype=torch.long)}
    expected = eager.bits_per_dim(batch)
    got = compiled.bits_per_dim(batch)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    got.mean().backward()
    assert all(p.grad is not None for p in compiled.parameters())
