"""Configuration validation (one test per rule), (de)serialisation, a 64×64 model, and the
shipped presets in configs/.

Every bad configuration must raise ValueError naming the offending field, whether the
check happens when the ModelConfig is made or when the model is built from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from helpers import random_images, tiny_config, tiny_model
from imagetx import AttentionConfig, build_model, ModelConfig, SuperResolutionConfig
from imagetx.training.module import ImageTransformerModule
from imagetx.io.older import LAST_COMMIT_WITH_RADIUS, model_config, one_level
from imagetx.model.attention import SelfAttention
from imagetx.model.flex import block_mask
from imagetx.model.patterns import PatternIndex, pattern_for


REPO = Path(__file__).resolve().parents[2]


def assert_rejected(field: str, **overrides) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        build_model(tiny_config(**overrides))


def test_tiny_config_itself_is_valid():
    # The base of every rejection below builds fine: each failure is due to its override.
    for attention in ("local_1d", "local_2d", "full"):
        for head in ("categorical", "dmol"):
            build_model(tiny_config(attention=attention, head=head))


def test_heads_must_divide_d_model():
    assert_rejected("n_heads", d_model=16, n_heads=3)


@pytest.mark.parametrize("field,value", [
    ("head", "gaussian"),
    ("attention", "local_3d"),
    ("position_encoding", "rotary"),
    ("norm", "sandwich"),
])
def test_unknown_choice(field, value):
    assert_rejected(field, **{field: value})


def test_2d_block_must_divide_grid_rows():
    # categorical 4×4 image -> 4×12 grid: 3 rows do not divide 4
    assert_rejected("query_block_shape", attention="local_2d", query_block_shape=(3, 3), memory_flange=(1, 1))


def test_2d_block_must_divide_grid_columns():
    assert_rejected("query_block_shape", attention="local_2d", query_block_shape=(2, 5), memory_flange=(1, 1))


def test_2d_block_is_checked_against_the_head_grid():
    # image 32: categorical grid 32×96, DMOL grid 32×32. A 16×48 block tiles only the first.
    blocks = AttentionConfig(kind="local_2d", query_block_shape=(16, 48))
    ModelConfig(image_size=32, attention=blocks).validate()
    with pytest.raises(ValueError, match=r"\bquery_block_shape\b"):
        ModelConfig(image_size=32, head="dmol", attention=blocks).validate()
    with pytest.raises(ValueError, match=r"\bquery_block_shape\b"):
        ModelConfig(image_size=32, attention=AttentionConfig(kind="local_2d", query_block_shape=(16, 64))).validate()


@pytest.mark.parametrize("kind,other", [("local_1d", dict(query_block_shape=(8, 8))),
                                        ("local_1d", dict(memory_flange=[4, 4])),
                                        ("local_2d", dict(query_block_length=32)),
                                        ("full", dict(memory_blocks=2))])
def test_another_kinds_geometry_is_refused_not_rewritten(kind, other):
    """A field the kind does not read would be lost (``to_dict`` stores the kind's own): refused in
    one line naming it and the way out, where it once came back silently at its default."""
    (name, value), = other.items()
    with pytest.raises(ValueError, match=rf"attention\.{name}=.* is local_\dd geometry, which kind '{kind}' does "
                                         r"not read: leave it out .* or set attention\.kind to") as refused:
        AttentionConfig(kind=kind, **other)
    assert "\n" not in str(refused.value)
    # at its default it is no setting: accepted, as every config built field by field (the CLI's) holds it
    default = AttentionConfig(kind=kind, **{name: getattr(AttentionConfig(), name)})
    assert ModelConfig.from_dict(ModelConfig(attention=default).to_dict()) == ModelConfig(attention=default)


def test_an_attention_width_of_its_own_is_stored_only_where_given_and_checked():
    """``attention.head_size``: None (d_model / n_heads) is every stored model's and is not written
    (the stored form, and the codec's fingerprint of a model, as before the field); a width of its
    own is written, read back, lets n_heads not divide d_model, and is refused in one line where it is
    not a positive integer."""
    plain = tiny_config()
    assert "head_size" not in plain.to_dict()["attention"] and "head_size" not in one_level(plain)
    assert plain.head_size == plain.d_model // plain.attention.n_heads
    wide = dataclasses.replace(plain, attention=dataclasses.replace(plain.attention, n_heads=3, head_size=12))
    assert wide.validate().head_size == 12 and wide.to_dict()["attention"]["head_size"] == 12
    assert ModelConfig.from_dict(json.loads(json.dumps(wide.to_dict()))) == wide
    assert one_level(wide)["head_size"] == 12
    with pytest.raises(ValueError, match=r"ModelConfig.attention.n_heads=3 is invalid: must divide d_model=16 .*"
                                         r"or give attention.head_size"):
        dataclasses.replace(wide, attention=dataclasses.replace(wide.attention, head_size=None)).validate()
    for bad in (0, -4, 2.5):
        with pytest.raises(ValueError, match=rf"ModelConfig.attention.head_size={bad!r} is invalid: must be a positive"):
            dataclasses.replace(plain, attention=dataclasses.replace(plain.attention, head_size=bad)).validate()


def test_2d_block_must_be_positive():
    assert_rejected("query_block_shape", attention="local_2d", query_block_shape=(0, 3), memory_flange=(0, 1))


def test_flange_taller_than_the_block_is_accepted():
    # Causal in block-raster order (tests/model/test_causality.py checks it by gradients).
    model = build_model(tiny_config(attention="local_2d", query_block_shape=(1, 3), memory_flange=(3, 1)))
    assert model.config.attention.memory_flange == (3, 1)


def test_flange_height_equal_to_block_height_is_fine():
    build_model(tiny_config(attention="local_2d", query_block_shape=(2, 3), memory_flange=(2, 7)))


@pytest.mark.parametrize("flange", [(-1, 1), (1, -1)])
def test_negative_flange(flange):
    assert_rejected("memory_flange", attention="local_2d", query_block_shape=(2, 3), memory_flange=flange)


@pytest.mark.parametrize("dropout", [1.0, 1.5, -0.1])
def test_dropout_range(dropout):
    assert_rejected("dropout", dropout=dropout)


@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_decoder_layers(value):
    assert_rejected("n_layers", n_layers=value)


def test_negative_encoder_layers():
    assert_rejected("encoder_layers", encoder_layers=-1)


@pytest.mark.parametrize("field", ["d_model", "d_filter", "image_size"])
def test_non_positive_sizes(field):
    assert_rejected(field, **{field: 0})


def test_odd_d_model():
    assert_rejected("d_model", d_model=15, n_heads=1)


def test_negative_num_classes():
    assert_rejected("num_classes", num_classes=-1)


def test_dmol_needs_a_component():
    assert_rejected("mixture_components", head="dmol", mixture_components=0)


def test_1d_block_length_must_be_positive():
    assert_rejected("query_block_length", query_block_length=0)


def test_negative_memory_blocks():
    assert_rejected("memory_blocks", memory_blocks=-1)


@pytest.mark.parametrize("radius", [0, 1])
def test_a_saved_cross_attention_radius_is_refused_naming_the_last_commit_that_reads_it(radius):
    # the one-level form, the only one that had the field
    values = {"image_size": 8, "encoder_layers": 1, "low_res_size": 4, "cross_attention_radius": radius}
    with pytest.raises(ValueError, match=rf"cross_attention_radius was removed.*commit {LAST_COMMIT_WITH_RADIUS}"):
        model_config(values)
    # a null radius (every low-res cell: today's cross-attention) still reads
    assert model_config({**values, "cross_attention_radius": None}) == model_config(
        {k: v for k, v in values.items() if k != "cross_attention_radius"})


def test_encoder_low_res_must_divide_image_size():
    assert_rejected("low_res_size", image_size=8, encoder_layers=1, low_res_size=3)


def test_low_res_size_is_ignored_without_encoder():
    build_model(tiny_config(image_size=8, encoder_layers=0, low_res_size=3))


def test_unknown_field_in_from_dict():
    values = tiny_config().to_dict()
    values["qurey_block_length"] = 4
    with pytest.raises(ValueError, match="qurey_block_length"):
        ModelConfig.from_dict(values)


# ----- (de)serialisation -----------------------------------------------------------------


def test_the_core_config_is_twelve_fields_and_every_field_says_what_it_is():
    # The paper's hyper-parameters in one reading: at most 12 fields, the rest in two sections; beside them
    # num_transforms, distribution augmentation's one (issue 127: a conditioning input, as num_classes).
    assert len([f for f in dataclasses.fields(ModelConfig) if f.name != "num_transforms"]) <= 12
    assert [f.name for f in dataclasses.fields(ModelConfig)][-2:] == ["attention", "superres"]
    for section in (ModelConfig, AttentionConfig, SuperResolutionConfig):
        lines = inspect.getsource(section).splitlines()
        names = {f.name for f in dataclasses.fields(section)}
        for field in names:
            at = next(k for k, line in enumerate(lines) if line.strip().startswith(f"{field}:"))
            above = at - 1  # fields in a row share the comment above the first of them
            while lines[above].strip().split(":")[0] in names and "#" not in lines[above]:
                above -= 1
            assert "#" in lines[at] or lines[above].strip().startswith("#"), f"{section.__name__}.{field}"


def test_the_one_level_form_of_earlier_files_reads_as_the_sections():
    """The lineage's continuations store their config in the one-level form of the files written
    before the sections (io/older.py reads it), with the run options at the values every stored
    model had (attention_kernel auto, flex_block_size 128) and the other attention kind's geometry."""
    flat = {"image_size": 8, "head": "dmol", "n_heads": 2, "attention": "local_2d", "query_block_length": 256,
            "memory_blocks": 1, "query_block_shape": [2, 2], "memory_flange": [1, 1], "relative_positions": "rotary",
            "attention_kernel": "auto", "flex_block_size": 128, "encoder_layers": 1, "low_res_size": 4,
            "low_res_reading": "cell_add", "cell_remainder_input": True, "exact_box_means": True,
            "low_res_zero_start": True}
    attention = AttentionConfig(n_heads=2, kind="local_2d", query_block_shape=(2, 2), memory_flange=(1, 1),
                                relative_positions="rotary")
    superres = SuperResolutionConfig(encoder_layers=1, low_res_size=4, low_res_reading="cell_add",
                                     cell_remainder_input=True, exact_box_means=True, low_res_zero_start=True)
    config = ModelConfig(image_size=8, head="dmol", attention=attention, superres=superres)
    assert model_config(flat) == config
    assert one_level(config) == {**one_level(ModelConfig()), **flat}  # written back: the fingerprint's form
    # how it ran, where it was another than every stored model's, is refused naming today's option
    with pytest.raises(ValueError, match="attention.kernel is how a model runs.*--model.attention_kernel"):
        model_config({**flat, "attention_kernel": "sdpa"})
    # a plain decoder's: encoder_layers 0 beside the low-res fields' defaults
    plain = {"attention": "full", "encoder_layers": 0, "low_res_size": 8, "low_res_reading": "cross_attention",
             "cell_remainder_input": False, "exact_box_means": False, "low_res_zero_start": False}
    assert model_config(plain) == ModelConfig(attention=AttentionConfig(kind="full"))
    assert plain.items() <= one_level(ModelConfig(attention=AttentionConfig(kind="full"))).items()
    # a low-res setting without an encoder is refused, not dropped
    with pytest.raises(ValueError, match=r"cell_remainder_input=True is invalid: needs a low-resolution input"):
        model_config({**plain, "cell_remainder_input": True})
    # a section given beside one-level fields is kept as given (its encoder_layers: the section's default)
    assert model_config({"attention": "full", "superres": {"low_res_size": 4}}).superres == \
        SuperResolutionConfig(low_res_size=4)
    # a field given both in its section and beside it: refused, not one of the two kept
    with pytest.raises(ValueError, match="attention is given both as a section and field by field"):
        model_config({"attention": {"n_heads": 2}, "n_heads": 4})
    # today's form itself takes none of it
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['n_heads'\]"):
        ModelConfig.from_dict({"n_heads": 2})


def test_a_stored_config_holds_what_the_model_computes():
    """No run option, and only the geometry of the attention kind in use; a shipped 1D model's
    config.json holds 16 fields (20 before: the kernel, its tiles and the 2D geometry)."""
    for kind, own, other in (("local_1d", "query_block_length", "query_block_shape"),
                             ("local_2d", "memory_flange", "memory_blocks")):
        stored = tiny_config(attention=kind).to_dict()["attention"]
        assert own in stored and other not in stored and "kernel" not in stored and "flex_block_size" not in stored
    assert not {"query_block_length", "query_block_shape"} & set(tiny_config(attention="full").to_dict()["attention"])
    for name in ("completion", "cifar10_gpu"):
        values = json.loads((REPO / "pretrained" / name / "config.json").read_text())
        values.pop("format_version")
        count = sum(len(value) if isinstance(value, dict) else 1 for value in values.values())
        assert count <= 16, (name, count)


def test_a_sections_unknown_field_is_named():
    with pytest.raises(ValueError, match=r"unknown ModelConfig.attention field\(s\) \['qurey_block_length'\]"):
        ModelConfig.from_dict({"attention": {"qurey_block_length": 4}})
    with pytest.raises(ValueError, match=r"unknown ModelConfig.superres field\(s\) \['encoder_layer'\]"):
        ModelConfig.from_dict({"superres": {"encoder_layer": 1}})
    with pytest.raises(ValueError, match=r"superres.encoder_layers=0 is invalid: must be a positive count"):
        build_model(ModelConfig(superres=SuperResolutionConfig(encoder_layers=0)))


def test_to_dict_from_dict_round_trip():
    cfg = tiny_config(head="dmol", attention="local_2d", query_block_shape=(2, 2), memory_flange=(1, 3),
                      num_classes=7, norm="pre", position_encoding="learned", mixture_components=4,
                      encoder_layers=2, image_size=8, low_res_size=4, dropout=0.25)
    values = cfg.to_dict()
    assert json.loads(json.dumps(values)) == values  # plain JSON-able values
    back = ModelConfig.from_dict(json.loads(json.dumps(values)))
    assert back == cfg
    assert back.attention.query_block_shape == (2, 2) and isinstance(back.attention.query_block_shape, tuple)
    assert back.attention.memory_flange == (1, 3) and isinstance(back.attention.memory_flange, tuple)
    assert back.to_dict() == values


def test_from_dict_accepts_a_partial_dict():
    cfg = ModelConfig.from_dict({"d_model": 32, "attention": {"kind": "local_2d", "query_block_shape": [8, 8]}})
    assert cfg.d_model == 32 and cfg.attention.query_block_shape == (8, 8) and cfg.n_layers == ModelConfig().n_layers


def test_grid_geometry():
    assert tiny_config(image_size=32).grid_shape == (32, 96)
    assert tiny_config(image_size=32, head="dmol").grid_shape == (32, 32)
    assert pattern_for(tiny_config(image_size=32)).length == 3072
    assert pattern_for(tiny_config(image_size=32, head="dmol")).length == 1024
    assert tiny_config(image_size=32, head="dmol").dims_per_image == 3072


# ----- 64×64 images ------------------------------------------------------------------------


@pytest.mark.parametrize("head,attention", [("categorical", "local_1d"), ("categorical", "local_2d"), ("dmol", "local_1d")])
def test_image_size_64_builds_and_scores(head, attention):
    model = tiny_model(image_size=64, head=head, attention=attention, query_block_length=64,
                       query_block_shape=(8, 16), memory_flange=(4, 8))
    assert model.config.grid_shape == ((64, 192) if head == "categorical" else (64, 64))
    if head == "categorical":  # uniform logits: exactly 8 bits/dim over 64·64·3 sub-pixels
        with torch.no_grad():
            model.head.proj.weight.zero_()
            model.head.proj.bias.zero_()
    images = random_images(1, 64, seed=2)
    with torch.no_grad():
        nll = model.nll(images)
    assert nll.shape == (1,) and torch.isfinite(nll).all()
    if head == "categorical":
        assert abs(nll.item() - 64 * 64 * 3 * math.log(256)) < 1e-2 * 64


PRESETS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_presets_are_found():
    assert {p.name for p in PRESETS} >= {"quick.yaml", "quick_superres.yaml", "superres.yaml"}


PAPER_PRESETS = ["cifar10_categorical.yaml", "cifar10_dmol.yaml", "cifar10_2d.yaml", "superres.yaml",
                 "imagenet32.yaml", "imagenet64.yaml", "faces_superres.yaml"]


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_paper_presets_use_no_option_the_paper_lacks(name):
    config = yaml.safe_load((PRESETS[0].parent / name).read_text())["model"]["config"]
    assert config.get("relative_positions", "none") == "none" and not config.get("cell_remainder_input", False)
    assert config.get("low_res_reading", "cross_attention") == "cross_attention"
    assert not config.get("low_res_zero_start", False)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_holds_a_valid_model_and_schedule(preset):
    values = yaml.safe_load(preset.read_text())
    ModelConfig.from_dict(values["model"]["config"]).validate()
    model_args = inspect.signature(ImageTransformerModule).parameters
    assert set(values["model"]) <= set(model_args), f"{preset.name}: unknown model keys"
    if values["model"].get("optimizer") == "adamw_cosine":
        # the cosine ends at the time budget (budget.py) or at max_steps: without either the
        # learning rate would never decay
        budget = values["trainer"].get("max_time") and values["model"].get("lr_horizon", "budget") == "budget"
        assert budget or values["trainer"]["max_steps"] > values["model"]["warmup_steps"]


def test_quick_superres_is_quick_plus_the_low_res_fields():
    # quick_superres was chosen as quick's decoder and schedule plus the 8x8 input
    # (docs/experiments.md, entry 8); its comparison with quick holds only while they differ
    # in nothing else.
    quick, superres = (yaml.safe_load((PRESETS[0].parent / name).read_text())
                       for name in ("quick.yaml", "quick_superres.yaml"))
    assert {"encoder_layers", "low_res_size"} <= set(superres["model"]["config"]["superres"])
    decoder = {k: v for k, v in superres["model"]["config"].items() if k != "superres"}
    assert decoder == quick["model"]["config"]
    assert {k: v for k, v in superres["model"].items() if k not in ("config", "low_res_lr_scale")} == \
        {k: v for k, v in quick["model"].items() if k != "config"}
    assert superres["model"]["low_res_lr_scale"] < 1
    assert {k: v for k, v in superres["trainer"].items() if k != "default_root_dir"} == \
        {k: v for k, v in quick["trainer"].items() if k != "default_root_dir"}
    assert quick["data"] == superres["data"]


def test_low_res_reading_is_a_known_one():
    assert_rejected("low_res_reading", image_size=8, encoder_layers=1, low_res_size=4, low_res_reading="cell_mean")


def test_the_cell_add_needs_an_encoder():
    assert_rejected("low_res_reading", image_size=8, low_res_reading="cell_add")


@pytest.mark.parametrize("size", [8, 48, 256, 32.0])
def test_flex_block_size_must_be_a_kernel_tile(size):
    with pytest.raises(ValueError, match=rf"flex_block_size {size!r} is invalid: choose one of 16, 32, 64, 128"):
        build_model(tiny_config(), flex_block_size=size)


def test_flex_block_size_reaches_every_self_attention_layer():
    for size in (16, 128):
        model = build_model(tiny_config(n_layers=2, d_model=32), "flex", flex_block_size=size)
        assert [block_mask(layer.self_attn.index).BLOCK_SIZE for layer in model.layers] == [(size, size)] * 2
        assert model.layers[0].self_attn.index is model.layers[1].self_attn.index  # built once, for every layer
    # the block mask is kept where FlexAttention may run: kernel flex, or auto where CUDA is
    kept = {kernel: build_model(tiny_config(d_model=32), kernel).layers[0].self_attn.index.flex_block_size
            for kernel in ("auto", "sdpa")}
    assert kept == {"auto": 128 if torch.cuda.is_available() else None, "sdpa": None}
    with pytest.raises(RuntimeError, match="keeps no FlexAttention block mask"):
        block_mask(build_model(tiny_config(), "sdpa").layers[0].self_attn.index)
    with pytest.raises(ValueError, match=r"kernel 'flex' reads the pattern's block mask: give PatternIndex\(pattern"):
        SelfAttention(16, 2, PatternIndex(pattern_for(tiny_config())), kernel="flex")


@pytest.mark.parametrize("kernel, attention", [("sdpa", "local_2d"), ("flex", "local_1d")])
def test_a_pickled_model_computes_what_it_did_its_layers_sharing_one_index(kernel, attention):
    # A model holds no closure (the pattern's rule and FlexAttention's mask_mod are made where they
    # run), so that pickle writes it whole: torch.save of the module, a spawned process's copy.
    model = build_model(tiny_config(attention=attention, n_layers=2, d_model=32), kernel).eval()
    copy = pickle.loads(pickle.dumps(model))
    images = torch.randint(0, 256, (2, 4, 4, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(copy.bits_per_dim(images), model.bits_per_dim(images))
    assert copy.layers[0].self_attn.index is copy.layers[1].self_attn.index
