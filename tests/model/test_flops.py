"""imagetx.model.flops: FLOPs per image counted from the model's structure, checked against
torch.utils.flop_counter.FlopCounterMode, which counts the matrix products that really run.

The reference runs with SDPA's math backend (``sdpa_kernel(SDPBackend.MATH)``): attention as
plain matrix products, which every torch's counter counts. The fused CPU kernels are not
counted by every torch (torch 2.14's counter has no formula for the CPU flash kernel: it counts
0), so a reference through them would hold the projections only.

Tolerance: none. The two agree exactly, to the FLOP, once one convention is allowed for: the
math backend computes an ``is_causal`` call densely (T² pairs, the upper triangle masked after),
where the fused kernels that train compute T(T+1)/2 and the model count counts those (full attention). Its
backward is twice its forward (the gradients of both operands), as model FLOPs count it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from helpers import bits_per_dim, random_images, random_labels, tiny_config
from imagetx import ImageTransformer, build_model, ModelConfig
from imagetx.model.superres import downsample_area
from imagetx.model.flops import FLOPS_PER_MAC, count_flops
from imagetx.training.presets import preset_model_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# 8×8 images (categorical grid 8×24, 192 steps), two layers; each case one path of the model.
CASES = {
    "1d": dict(),
    "1d, 2 memory blocks, end padding": dict(memory_blocks=2, query_block_length=20),
    "1d, rotary": dict(relative_positions="rotary"),  # elementwise: no matrix product more
    "2d": dict(attention="local_2d", memory_flange=(2, 4)),
    "2d, rotary": dict(attention="local_2d", memory_flange=(2, 4), relative_positions="rotary"),
    "full": dict(attention="full"),
    "full, rotary": dict(attention="full", relative_positions="rotary"),
    "dmol, class-conditional": dict(head="dmol", num_classes=3),
    "encoder, cross-attention to all": dict(head="dmol", encoder_layers=2),
    "encoder, cross-attention, cell remainder": dict(encoder_layers=1, cell_remainder_input=True),
    "encoder, cell add, cell remainder": dict(head="dmol", encoder_layers=1, low_res_reading="cell_add",
                                              cell_remainder_input=True),
}


def causal_extra_pairs(config: ModelConfig) -> int:
    """Pairs per layer that the math backend computes beyond those the fused kernels compute: the
    upper triangle of the is_causal call (full attention; local patterns run masked blocks)."""
    if config.attention.kind != "full":
        return 0
    length = config.grid_shape[0] * config.grid_shape[1]
    return length * (length - 1) // 2


def counted(model: ImageTransformer, batch: int = 2) -> tuple[int, int]:
    """FlopCounterMode's (forward, backward) FLOPs per image of one training step, attention
    through SDPA's math backend."""
    cfg = model.config
    images = random_images(batch, cfg.image_size)
    labels = random_labels(batch, cfg.num_classes) if cfg.num_classes else None
    low_res = downsample_area(images, cfg.superres.low_res_size) if cfg.superres else None
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH):
        with counter:
            loss = bits_per_dim(model, images, labels, low_res).mean()
        forward = counter.get_total_flops()
        with counter:  # entering again starts the count afresh
            loss.backward()
    return forward // batch, counter.get_total_flops() // batch


@pytest.mark.parametrize("case", CASES)
def test_counted_flops_equal_flop_counter_mode(case):
    cfg = tiny_config(image_size=8, n_layers=2, **CASES[case])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    flops = count_flops(model)
    forward, backward = counted(model)
    assert forward > flops.projections + flops.inputs  # the reference counted attention too
    # the math backend's dense causal calls: 2 products of e per pair and head, every layer
    extra = cfg.n_layers * 2 * FLOPS_PER_MAC * cfg.d_model * causal_extra_pairs(cfg)
    assert forward == flops.forward + extra
    assert backward == 2 * flops.projections + flops.inputs + 2 * (flops.attention + extra)
    assert flops.training == flops.forward + 2 * flops.projections + flops.inputs + 2 * flops.attention


@pytest.mark.parametrize("superres", [False, True], ids=["decoder", "encoder, cross-attention"])
def test_an_attention_width_of_its_own_is_counted_as_flop_counter_mode_counts_it(superres):
    """3 heads of 12 channels over d_model 16: projections to that width and back, scores and values
    over 36 channels a pair, as FlopCounterMode counts them."""
    import dataclasses

    cfg = tiny_config(image_size=8, n_layers=2, n_heads=3, **(dict(encoder_layers=1) if superres else {}))
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, head_size=12)).validate()
    torch.manual_seed(0)
    model = build_model(cfg).train()
    flops = count_flops(model)
    forward, backward = counted(model)
    assert forward == flops.forward
    assert backward == 2 * flops.projections + flops.inputs + 2 * flops.attention


def test_local_attention_counts_its_blocks_not_the_dense_square():
    """A 1D local pattern at 32×32 computes a fixed window per query: a fraction of full
    attention's pairs, and growing with T, not T²."""
    local, full = (count_flops(build_model(tiny_config(image_size=32, attention=kind, query_block_length=64)))
                   for kind in ("local_1d", "full"))
    assert local.projections == full.projections
    steps = 32 * 96
    # 1D, lq 64, one memory block: every block 64 × 128 pairs (the first's memory, before the image, masked)
    pairs = steps // 64 * 64 * 128
    assert local.attention == 2 * FLOPS_PER_MAC * 16 * pairs
    assert full.attention == 2 * FLOPS_PER_MAC * 16 * steps * (steps + 1) // 2
    assert local.attention < full.attention / 10  # windows of 128 keys against 1,536 keys on average


def test_flex_attention_counts_the_tiles_of_its_block_mask():
    """With FlexAttention the attention is every 128×128 tile the block mask does not skip:
    full causal attention over 192 steps is tiles (0,0), (1,0) and (1,1), each computed whole."""
    flex, sdpa = (count_flops(build_model(tiny_config(image_size=8, attention="full"), kernel))
                  for kernel in ("flex", "sdpa"))
    assert flex.projections == sdpa.projections
    assert flex.attention == 2 * FLOPS_PER_MAC * 16 * 3 * 128 * 128
    assert sdpa.attention == 2 * FLOPS_PER_MAC * 16 * 192 * 193 // 2


@pytest.mark.parametrize("preset", sorted(path.stem for path in CONFIGS.glob("*.yaml")))
def test_every_preset_counted_as_flop_counter_mode_counts_it(preset):
    """Full-size presets, their forward pass counted on the meta device (shapes only, instant)."""
    cfg = preset_model_config(CONFIGS / f"{preset}.yaml")
    model = build_model(cfg)
    flops = count_flops(model)
    model = model.to("meta")
    images = torch.zeros(1, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8, device="meta")
    labels = torch.zeros(1, dtype=torch.long, device="meta") if cfg.num_classes else None
    low_res = torch.zeros(1, cfg.superres.low_res_size, cfg.superres.low_res_size, 3, dtype=torch.uint8,
                          device="meta") if cfg.superres else None
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        bits_per_dim(model, images, labels, low_res, check=False)  # meta tensors have no values to check
    extra = cfg.n_layers * 2 * FLOPS_PER_MAC * cfg.d_model * causal_extra_pairs(cfg)
    assert counter.get_total_flops() == flops.forward + extra
    assert 2.9 < flops.training / flops.forward <= 3  # ≈ 3×: only the input layers' backward is less
