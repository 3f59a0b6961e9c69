"""The opt-in torch.compile switch (performance issue): same numbers, same checkpoint keys, one graph."""

from pathlib import Path

import pytest
import torch
import yaml

from helpers import with_changes
from imagetx import AttentionConfig, build_model, ModelConfig
from imagetx.model import attention
from imagetx.model.superres import downsample_area
from imagetx.model.transformer import previous_values
from imagetx.training.module import COMPILE_OPTIONS, ImageTransformerModule

REPO = Path(__file__).resolve().parents[2]


def test_compiled_module_matches_eager_and_keeps_parameter_names():
    torch.manual_seed(0)
    config = ModelConfig(image_size=8, head="dmol", n_layers=1, d_model=16, d_filter=32, dropout=0.0,
                         attention=AttentionConfig(n_heads=2, query_block_length=16))
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


@pytest.mark.parametrize("preset, kernel, broken", [("cifar10_dmol_25min.yaml", "sdpa", False),
                                                    ("superres.yaml", "sdpa", False),
                                                    ("cifar10_dmol_25min.yaml", "flex", False),
                                                    ("cifar10_dmol_25min.yaml", "sdpa", True)],
                         ids=["1D", "2D, encoder, cross-attention", "1D, FlexAttention",
                              "control: attention outside the graph"])
def test_a_model_compiles_as_one_graph(preset, kernel, broken, monkeypatch):
    """Every form of a pattern is built with the model (patterns.PatternIndex), so that its first
    compiled pass traces the graphs any later run traces, and finds those an earlier run left in
    Inductor's cache (docs/experiments.md entry 29). fullgraph=True fails on any graph break (the
    control: attention run outside the graph); the eager backend traces as
    torch.compile does, without generating code. Shrunk presets: self-attention 1D and 2D, the
    encoder, cross-attention; FlexAttention's block mask rebuilt from the model's buffers."""
    settings = yaml.safe_load((REPO / "configs" / preset).read_text())["model"]["config"]
    settings = with_changes(settings, {"n_layers": 1, "d_model": 16, "d_filter": 32, "attention": {"n_heads": 2}})
    if settings.get("superres"):
        settings["superres"] = {**settings["superres"], "encoder_layers": 1}
    model = build_model(ModelConfig.from_dict(settings), kernel).eval()  # no dropout: two passes compared
    images = torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)
    low_res = downsample_area(images, 8) if model.config.superres else None
    previous, given = previous_values(model.targets(images)), {"low_res": low_res} if low_res is not None else {}
    if broken:
        gathered = attention.attend_in_blocks
        monkeypatch.setattr(attention, "attend_in_blocks", torch.compiler.disable(gathered))
    torch.compiler.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        if broken:
            with pytest.raises(Exception, match="disable"):
                compiled(previous, **given)
        else:
            torch.testing.assert_close(compiled(previous, **given), model(previous, **given))


def traced_batch_sizes(order: str, **options) -> list[tuple]:
    """The graphs torch.compile traces for the GPU recipe shrunk to 8×8 images run in ``order`` (``e``:
    an eval pass of 6 images, ``t``: a training pass of 4), compiled with ``options``: per graph, the training
    flag and the size of each input that is not a plain number (a symbolic one where dynamic)."""
    settings = yaml.safe_load((REPO / "configs" / "cifar10_dmol_25min.yaml").read_text())["model"]["config"]
    settings = with_changes(settings, {"image_size": 8, "n_layers": 1, "d_model": 16, "d_filter": 32,
                                       "attention": {"query_block_length": 8, "n_heads": 2}})
    model = build_model(ModelConfig.from_dict(settings))
    traced = []

    def recording_backend(graph, example_inputs):
        traced.append((model.training, tuple(type(x).__name__ for x in example_inputs if not isinstance(x, torch.Tensor))))
        return graph.forward

    torch.compiler.reset()  # graphs of an earlier test would be reused, not traced
    model.compile(backend=recording_backend, **options)
    for mode in order:
        model.train(mode == "t")
        with torch.set_grad_enabled(mode == "t"):
            model(previous_values(model.targets(torch.randint(0, 256, (6 if mode == "e" else 4, 8, 8, 3)))))
    return sorted(traced)


@pytest.mark.slow
def test_a_resumed_run_traces_the_graphs_of_a_fresh_one():
    """A fresh run validates first (its sanity check), a resumed run trains first; the module's
    compile options must trace the same graphs either way, or the resumed run misses the Inductor
    cache a lease's `warm` filled (docs/experiments.md entry 30). Control: automatic dynamic shapes
    make the second graph's batch size symbolic, so the two orders differ."""
    fresh, resumed = traced_batch_sizes("ett", **COMPILE_OPTIONS), traced_batch_sizes("tte", **COMPILE_OPTIONS)
    assert fresh == resumed == [(False, ()), (True, ())]  # one static graph per mode
    resumed = traced_batch_sizes("tte", dynamic=None)
    assert resumed[0] == (False, ("SymInt",)) and resumed[1] == (True, ())  # the fresh run's were the other way
