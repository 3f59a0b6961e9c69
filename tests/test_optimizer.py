"""The optimiser's parameter groups (imagetx/lit.py): the parts that read the low-resolution
input can learn at their own rate (``low_res_lr_scale``)."""

from __future__ import annotations

from helpers import tiny_config
from imagetx.lit import ImageTransformerModule

LOW_RES_PARTS = ("encoder.", "cross_attn.", "cross_norm.", "cell_remainder.")


def test_low_res_parts_learn_at_their_own_rate():
    config = tiny_config(image_size=8, head="dmol", encoder_layers=1, low_res_size=4, cross_attention_radius=0,
                         cell_remainder_input=True, n_layers=2)
    module = ImageTransformerModule(config, optimizer="adamw_cosine", peak_lr=0.01, low_res_lr_scale=0.25)
    rest, low_res = module.parameter_groups()
    assert rest["lr"] == 0.01 and low_res["lr"] == 0.0025
    names = {id(p): name for name, p in module.model.named_parameters()}
    low_res_names = {names[id(p)] for p in low_res["params"]}
    rest_names = {names[id(p)] for p in rest["params"]}
    assert low_res_names and all(any(part in name for part in LOW_RES_PARTS) for name in low_res_names)
    assert not any(part in name for name in rest_names for part in LOW_RES_PARTS)
    assert low_res_names | rest_names == set(names.values())  # every parameter, once


def test_a_model_without_a_low_res_input_has_one_group():
    module = ImageTransformerModule(tiny_config(), optimizer="adamw_cosine", peak_lr=0.01, low_res_lr_scale=0.25)
    (only,) = module.parameter_groups()
    assert only["lr"] == 0.01 and len(only["params"]) == len(list(module.parameters()))
