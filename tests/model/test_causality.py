"""Causality by gradients (docs/model.md §1, §4): the parameters predicted at generation step t
depend only on the values of steps < t.

The value embeddings of an image's targets, ``emb`` (B, T, d), a leaf, are what the decoder's
value embedding gives (a forward hook), shifted by one step in generation order, so step t's
input is ``emb[:, t-1]``. We differentiate a random projection of ``params[:, t]`` with respect
to ``emb``: the gradient
must be exactly zero at every step >= t, and non-zero somewhere earlier. For a single
layer the set of earlier steps with a non-zero gradient is exactly the query's
memory ``{s - 1 : can_attend[t, s]}``; for n layers it is what n hops of can_attend
reach.
"""

from __future__ import annotations

import pytest
import torch

from helpers import decode_embeddings, random_images, random_labels, tiny_model, value_embeddings
from imagetx.model.patterns import FullCausal, GenerationOrder, PatternIndex

# Block sizes chosen so that local attention is genuinely local: categorical 4×4 images
# are 48 sub-pixel steps on a 4×12 grid, DMOL images 16 pixel steps on a 4×4 grid.
GEOMETRY = {
    ("categorical", "local_1d"): dict(query_block_length=8, memory_blocks=1),
    ("dmol", "local_1d"): dict(query_block_length=4, memory_blocks=1),
    ("categorical", "local_2d"): dict(query_block_shape=(2, 3), memory_flange=(1, 2)),
    ("dmol", "local_2d"): dict(query_block_shape=(2, 2), memory_flange=(1, 1)),
    ("categorical", "full"): {},
    ("dmol", "full"): {},
}


def build(head, attention, num_classes=0, n_layers=1, image_size=4, seed=0, **extra):
    """A float64 tiny model, with the value embeddings of random images as a leaf (and its labels)."""
    overrides = dict(GEOMETRY[(head, attention)], **extra)
    model = tiny_model(seed=seed, dtype=torch.float64, head=head, attention=attention, num_classes=num_classes,
                       n_layers=n_layers, image_size=image_size, **overrides)
    images = random_images(2, image_size, seed=seed + 1)
    emb = value_embeddings(model, model.targets(images)).detach()
    assert emb.dtype == torch.float64
    labels = random_labels(2, num_classes, seed=seed + 2) if num_classes else None
    return model, emb, labels


def step_gradients(model, emb, steps, labels=None, low_res=None, shift=True,
                   transforms=None) -> dict[int, torch.Tensor]:
    """For each t: (T,) total |d (proj · params[:, t]) / d emb[:, s]| at every step s.

    ``shift=False`` is the negative control: step t reads its own value."""
    emb = emb.detach().clone().requires_grad_()
    params = decode_embeddings(model, emb, labels, low_res, shift, transforms)
    assert params.shape[:2] == emb.shape[:2]
    out = {}
    for t in steps:
        gen = torch.Generator().manual_seed(1000 + t)
        proj = torch.randn(params.shape[0], params.shape[-1], generator=gen, dtype=params.dtype)
        (grad,) = torch.autograd.grad((params[:, t] * proj).sum(), emb, retain_graph=True)
        out[t] = grad.abs().sum(dim=(0, 2))
    return out


def receptive_field(can_attend: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Which layer inputs each output can depend on after n_layers of attention."""
    reach = can_attend.double()
    for _ in range(n_layers - 1):
        reach = (reach @ can_attend.double()).clamp(max=1)
    return reach.bool()


def causality_violations(model, emb, steps, labels=None, low_res=None, shift=True, n_layers=None,
                         transforms=None) -> list[str]:
    """Check every step in ``steps``; return a description of every problem found.

    * a non-zero gradient at a step >= t is a leak of the future;
    * with exact support checking (``n_layers`` given), the steps with non-zero
      gradient must be exactly those that n hops of can_attend reach (shifted by one);
    * for t > 0, the earliest step in the query's memory must have a non-zero gradient.
    """
    problems = []
    can_attend = getattr(model, "decoder", model).pattern.can_attend()
    n = can_attend.shape[0]
    grads = step_gradients(model, emb, steps, labels, low_res, shift, transforms)
    for t in steps:
        grad = grads[t]
        leaks = (grad[t:] != 0).nonzero().flatten() + t
        if len(leaks):
            problems.append(f"leak: step {t} depends on later or own steps {leaks.tolist()}")
        if t > 0:
            memory = can_attend[t, 1:].nonzero().flatten() + 1  # keys s >= 1 (input = emb[s-1])
            earliest = int(memory.min()) - 1
            if grad[earliest] == 0:
                problems.append(f"dead: step {t} does not depend on step {earliest} in its memory")
        if n_layers is not None:
            reach = receptive_field(can_attend, n_layers)[t]
            expected = torch.zeros(n, dtype=torch.bool)
            expected[:-1] = reach[1:]  # input at step s is emb[s - 1]
            got = grad != 0
            if not torch.equal(got, expected):
                extra = (got & ~expected).nonzero().flatten().tolist()
                missing = (expected & ~got).nonzero().flatten().tolist()
                problems.append(f"support: step {t} depends on {extra} outside its memory, not on {missing}")
    return problems


def steps_to_check(model) -> list[int]:
    """0, 1, both sides of the first block boundaries, a middle step, the last step."""
    n = getattr(model, "decoder", model).pattern.length
    cfg = model.config
    if cfg.attention.kind == "local_1d":
        block = cfg.attention.query_block_length
    elif cfg.attention.kind == "local_2d":
        block = cfg.attention.query_block_shape[0] * cfg.attention.query_block_shape[1]
    else:
        block = 4
    steps = {0, 1, block - 1, block, block + 1, 2 * block - 1, 2 * block, n // 2, n - 2, n - 1}
    return sorted(s for s in steps if 0 <= s < n)


# Conditioning: none, a class, a class and a transform (distribution augmentation, 48 ids), each image its own.
CONDITIONING = {"unconditional": (0, 0), "classes": (10, 0), "classes+transforms": (10, 48)}


def transform_ids(num_transforms, seed=5):
    """Random transform ids for the 2 images of ``build`` (None without transforms: the identity)."""
    return random_labels(2, num_transforms, seed=seed) if num_transforms else None


@pytest.mark.parametrize("conditioning", CONDITIONING)
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_single_layer_sees_exactly_its_memory(attention, head, conditioning):
    num_classes, num_transforms = CONDITIONING[conditioning]
    model, emb, labels = build(head, attention, num_classes, n_layers=1, num_transforms=num_transforms)
    assert causality_violations(model, emb, steps_to_check(model), labels, n_layers=1,
                                transforms=transform_ids(num_transforms)) == []


@pytest.mark.parametrize("conditioning", CONDITIONING)
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_two_layers_are_causal(attention, head, conditioning):
    num_classes, num_transforms = CONDITIONING[conditioning]
    model, emb, labels = build(head, attention, num_classes, n_layers=2, seed=1, norm="pre",
                               num_transforms=num_transforms)
    assert causality_violations(model, emb, steps_to_check(model), labels, n_layers=2,
                                transforms=transform_ids(num_transforms)) == []


def test_local_patterns_are_genuinely_local():
    # The geometries above leave earlier steps outside some queries' memory, so the
    # support check is not vacuous.
    for (head, attention) in GEOMETRY:
        if attention == "full":
            continue
        model, _, _ = build(head, attention)
        mask = model.pattern.can_attend()
        last = mask.shape[0] - 1
        assert not mask[last, :last].all(), (head, attention)


@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_causal_with_encoder_context(attention):
    model, emb, _ = build("categorical", attention, n_layers=1, image_size=8, seed=2,
                          encoder_layers=1, low_res_size=2, query_block_length=16,
                          query_block_shape=(2, 6), memory_flange=(2, 3))
    low_res = random_images(2, 2, seed=9)
    steps = steps_to_check(model)
    assert causality_violations(model, emb, steps, low_res=low_res, n_layers=1) == []
    # The low-resolution input does matter to the decoder (cross-attention is wired in).
    other = random_images(2, 2, seed=10)
    assert not torch.allclose(decode_embeddings(model, emb, low_res=low_res),
                              decode_embeddings(model, emb, low_res=other))


# A 2D flange taller than the query block reaches into earlier rows of blocks only.
TALL_FLANGE = {"categorical": dict(query_block_shape=(1, 3), memory_flange=(3, 2)),
               "dmol": dict(query_block_shape=(1, 2), memory_flange=(2, 1))}


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("head", ["categorical", "dmol"])
def test_flange_taller_than_the_block_is_causal(head, n_layers):
    model, emb, _ = build(head, "local_2d", n_layers=n_layers, seed=3, **TALL_FLANGE[head])
    fh, qh = model.config.attention.memory_flange[0], model.config.attention.query_block_shape[0]
    assert fh > qh
    steps = sorted(set(steps_to_check(model)) | set(range(model.pattern.length - 6, model.pattern.length)))
    assert causality_violations(model, emb, steps, n_layers=n_layers) == []
    # The check has teeth here too: without the shift the same model leaks.
    assert any(p.startswith("leak") for p in causality_violations(model, emb, steps, shift=False))


# ----- negative controls: the check must catch a leak ------------------------------------


@pytest.mark.parametrize("num_transforms", [0, 48])
@pytest.mark.parametrize("head", ["categorical", "dmol"])
@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_unshifted_inputs_are_caught(attention, head, num_transforms):
    model, emb, _ = build(head, attention, num_transforms=num_transforms)
    problems = causality_violations(model, emb, steps_to_check(model), shift=False,
                                    transforms=transform_ids(num_transforms))
    assert any(p.startswith("leak") for p in problems)


@pytest.mark.parametrize("attention", ["local_1d", "local_2d", "full"])
def test_unmasked_attention_is_caught(attention):
    model, emb, _ = build("categorical", attention, n_layers=2)
    model.layers[1].self_attn.index = None  # plain unmasked attention
    problems = causality_violations(model, emb, [0, 5, 20])
    assert any(p.startswith("leak") for p in problems)


@pytest.mark.parametrize("attention", ["local_1d", "local_2d"])
def test_non_local_attention_is_caught(attention):
    # Causal, but seeing more than the declared pattern: the support check notices.
    model, emb, _ = build("categorical", attention)
    model.layers[0].self_attn.index = PatternIndex(FullCausal(GenerationOrder(1, model.pattern.length)))
    problems = causality_violations(model, emb, [model.pattern.length - 1], n_layers=1)
    assert any(p.startswith("support") for p in problems)
    assert not any(p.startswith("leak") for p in problems)
