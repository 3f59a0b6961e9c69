"""The optimiser's parameter groups (imagetx/training/module.py): the parts that read the low-resolution
input can learn at their own rate (``low_res_lr_scale``)."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_config
from imagetx.io.older import as_reading
from imagetx.training.module import ImageTransformerModule, make_optimizer, optimizer_settings

LOW_RES_PARTS = ("encoder.", "cross_attn.", "cross_norm.", "cell_adds.", "c_norm.", "cell_remainder.")


@pytest.mark.parametrize("reading,norm", [("cross_attention", "post"), ("cell_add", "post"), ("cell_add", "pre")])
def test_low_res_parts_learn_at_their_own_rate(reading, norm):
    config = tiny_config(image_size=8, head="dmol", encoder_layers=1, low_res_size=4,
                         cell_remainder_input=True, n_layers=2, low_res_reading=reading, norm=norm)
    module = ImageTransformerModule(config, optimizer="adamw_cosine", peak_lr=0.01, low_res_lr_scale=0.25)
    rest, low_res = make_optimizer(module.model, **optimizer_settings(module.hparams)).param_groups
    assert rest["lr"] == 0.01 and low_res["lr"] == 0.0025
    names = {id(p): name for name, p in module.model.named_parameters()}
    low_res_names = {names[id(p)] for p in low_res["params"]}
    rest_names = {names[id(p)] for p in rest["params"]}
    assert low_res_names and all(any(part in name for part in LOW_RES_PARTS) for name in low_res_names)
    assert not any(part in name for name in rest_names for part in LOW_RES_PARTS)
    assert low_res_names | rest_names == set(names.values())  # every parameter, once


def test_a_model_without_a_low_res_input_has_one_group():
    module = ImageTransformerModule(tiny_config(), optimizer="adamw_cosine", peak_lr=0.01, low_res_lr_scale=0.25)
    (only,) = make_optimizer(module.model, **optimizer_settings(module.hparams)).param_groups
    assert only["lr"] == 0.01 and len(only["params"]) == len(list(module.parameters()))


def test_settings_left_out_are_the_modules_defaults():
    # a preset's model section may name only some settings; the module's signature has the rest
    module = ImageTransformerModule(tiny_config(), peak_lr=0.01)
    assert optimizer_settings({"peak_lr": 0.01, "config": {}}) == optimizer_settings(module.hparams)
    assert optimizer_settings({})["optimizer"] == module.hparams.optimizer == "adam_noam"


class Precision:
    """Stands in for the Trainer where configure_gradient_clipping reads only its precision."""

    def __init__(self, precision: str) -> None:
        self.precision = precision


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gradients_are_clipped_by_their_global_norm(precision, monkeypatch):
    module = ImageTransformerModule(tiny_config(), optimizer="adamw_cosine")
    monkeypatch.setattr(ImageTransformerModule, "trainer", Precision(precision))
    for p in module.parameters():
        p.grad = torch.full_like(p, 3.0)
    before = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])
    module.configure_gradient_clipping(None, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    after = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])
    assert before > 10 and after == pytest.approx(0.5, rel=1e-5)


def name_before(name: str) -> str:
    """A super-resolution parameter's name as it was before the model held its decoder
    (imagetx/io/older.py reads those): a reading's under its layer."""
    return as_reading(name).replace(".reading.", ".")


# The order the super-resolution model registered its parts in then: the decoder's inputs, the
# encoder and cell sums, then each layer with its reading between self-attention and feed-forward.
PARTS_BEFORE = ("value_embedding", "positions", "class_embedding", "encoder", "cell_remainder", "layers", "final_norm",
                "head")
LAYER_PARTS_BEFORE = ("self_attn", "self_norm", "cross_attn", "cross_norm", "cell_add", "cell_norm", "ffn", "ffn_norm")


def place_before(name: str) -> tuple[int, ...]:
    old = name_before(name).split(".")
    if old[0] == "layers":
        return PARTS_BEFORE.index("layers"), int(old[1]), LAYER_PARTS_BEFORE.index(old[2])
    return (PARTS_BEFORE.index(old[0]),)


@pytest.mark.parametrize("reading", ["cross_attention", "cell_add"])
def test_each_group_lists_the_parameters_in_the_order_a_continuation_s_optimiser_state_has_them(reading):
    """An optimiser's state is matched to the parameters by their order in each group: a super-
    resolution model's groups list them as before it held its decoder (a continuation's Adam
    moments go on with the parameters they belong to)."""
    config = tiny_config(image_size=8, head="dmol", encoder_layers=1, low_res_size=4, cell_remainder_input=True,
                         n_layers=2, low_res_reading=reading, num_classes=3)
    model = ImageTransformerModule(config).model
    names = {id(p): name for name, p in model.named_parameters()}
    for group in make_optimizer(model, **optimizer_settings({"low_res_lr_scale": 0.5})).param_groups:
        order = [names[id(p)] for p in group["params"]]
        assert order == sorted(order, key=place_before)  # sorted is stable: within a part, the part's own order
