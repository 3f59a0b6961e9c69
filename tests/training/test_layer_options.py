"""The build options that act on each decoder layer: activation checkpointing (each layer's
activations recomputed in the backward pass) and regional compilation (the layer compiled once,
for every layer). Both compute what the plain network computes; what they cost is measured by
scripts/bench_layers.py, not here."""

from __future__ import annotations

import pytest
import torch

from helpers import decoder_of, random_images, tiny_config
from imagetx.model.superres import downsample_area
from imagetx.model.superres import build_model
from imagetx.training.module import compile_network


def trained_pass(model, images, low_res):
    """(loss, every parameter's gradient) of one training pass, dropout on."""
    model.train().zero_grad(set_to_none=True)
    torch.manual_seed(3)  # the dropout masks: the same in both models' passes
    loss = model.bits_per_dim(images, low_res=low_res).mean()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("superres", [False, True], ids=["decoder", "superres"])
def test_activation_checkpointing_recomputes_each_layer_and_changes_no_number(superres):
    """The same loss and the same gradients, to the bit (the recomputation runs the same operations,
    with the same dropout masks: the random state is kept), and every decoder layer run twice a
    training pass (the second time in the backward pass): a negative control that it is on. Scoring
    without gradients runs each layer once."""
    fields = dict(dropout=0.2, n_layers=2)
    if superres:
        fields |= dict(image_size=8, encoder_layers=1, low_res_size=4, cell_remainder_input=True)
    config = tiny_config(**fields)
    images = random_images(2, config.image_size, seed=1)
    low_res = downsample_area(images, 4) if superres else None
    models = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        models.append(build_model(config, activation_checkpointing=checkpointed))
    calls = {False: [], True: []}
    for model, checkpointed in zip(models, (False, True)):
        for layer in decoder_of(model).layers:
            # a pre-hook: the recomputation stops as soon as it has what the backward pass needs, before
            # the layer's own end (torch.utils.checkpoint's early stop), where a forward hook would run
            layer.register_forward_pre_hook(lambda module, args, seen=calls[checkpointed]: seen.append(module))
    (plain_loss, plain_grads), (loss, grads) = (trained_pass(model, images, low_res) for model in models)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys() and all(torch.equal(grads[n], plain_grads[n]) for n in grads)
    assert len(calls[False]) == config.n_layers and len(calls[True]) == 2 * config.n_layers
    calls[True].clear()
    with torch.no_grad():
        models[1].eval().bits_per_dim(images, low_res=low_res)
    assert len(calls[True]) == config.n_layers


def test_regional_compilation_compiles_the_layer_once_for_every_layer_and_equals_eager():
    """``compile: layers``: each decoder layer compiled in place (its parameter names unchanged), one
    graph for all of them (torch reuses the first layer's: the layers differ in their tensors only),
    the same numbers as the eager network up to rounding."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    config = tiny_config(n_layers=3)
    model = build_model(config).eval()
    images = random_images(2, config.image_size, seed=2)
    with torch.no_grad():
        eager = model.bits_per_dim(images)
    names = [name for name, _ in model.named_parameters()]
    torch._dynamo.reset()
    counters.clear()
    compile_network(model, "layers")
    with torch.no_grad():
        compiled = model.bits_per_dim(images)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert [name for name, _ in model.named_parameters()] == names
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_compile_layers_compiles_every_transformer_layer_and_a_growth_s_new_ones(monkeypatch):
    """``compile: layers`` compiles each transformer layer (a super-resolution model's encoder layers
    too) and nothing else; layers a growth adds are compiled the same way (``compile_added``, which
    GrowDepth and a grown checkpoint's loading call), and not under ``compile: false``. Recorded,
    not compiled: what each compilation computes is the test above's."""
    from imagetx.model.transformer import TransformerLayer
    from imagetx.training.grow import deepen
    from imagetx.training.module import ImageTransformerModule

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **options: compiled.append(self))
    config = tiny_config(image_size=8, encoder_layers=1, low_res_size=4, n_layers=2, norm="pre")
    module = ImageTransformerModule(config, compile="layers")
    layers = [m for m in module.model.modules() if isinstance(m, TransformerLayer)]
    assert len(layers) == 3 and compiled == layers  # 2 decoder layers and the encoder's, each once
    compiled.clear()
    plain = ImageTransformerModule(tiny_config(n_layers=2, norm="pre"), compile="layers")
    assert compiled == list(plain.model.layers)
    deepen(plain.model, 3, seed=0)
    plain.compile_added(plain.model.layers[2:])
    assert compiled[2:] == [plain.model.layers[2]]
    compiled.clear()
    eager = ImageTransformerModule(tiny_config(n_layers=2, norm="pre"))
    deepen(eager.model, 3, seed=0)
    eager.compile_added(eager.model.layers[2:])
    assert compiled == []
