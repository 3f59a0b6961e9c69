"""A preset's model read outside the training command (imagetx/training/presets.py): settings by dotted
names, as the command line and ``python -m imagetx.training.resume settings`` name them."""

from __future__ import annotations

from pathlib import Path

import pytest

from imagetx.training.presets import dotted_fields, preset_model_config, read_preset, set_dotted

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml"))
RECIPE = CONFIGS / "cifar10_dmol_25min.yaml"


def test_set_dotted_makes_the_sections_a_tree_leaves_out_or_holds_as_null():
    tree = {"model": {"config": None}}
    set_dotted(tree, "model.config.attention.n_heads", 16)
    set_dotted(tree, "model.config.n_layers", 28)
    assert tree == {"model": {"config": {"attention": {"n_heads": 16}, "n_layers": 28}}}


@pytest.mark.parametrize("target", PRESETS, ids=lambda path: path.stem)
def test_every_field_of_another_preset_by_its_dotted_name_gives_that_presets_model(target):
    """dotted_fields and set_dotted are each other's inverse: the recipe with every field of ``target``
    set by name is ``target``'s model (superres and the 2D attention included: sections of their own)."""
    wanted = preset_model_config(target)
    assert preset_model_config(RECIPE, dotted_fields(wanted.to_dict())) == wanted


def test_an_override_changes_its_field_and_no_other():
    plain = dotted_fields(preset_model_config(RECIPE).to_dict())
    grown = dotted_fields(preset_model_config(RECIPE, {"n_layers": 28, "attention.n_heads": 16}).to_dict())
    assert {key for key in plain if plain[key] != grown[key]} == {"n_layers", "attention.n_heads"}
    assert (grown["n_layers"], grown["attention.n_heads"]) == (28, 16)
    assert read_preset(RECIPE)["model"]["config"]["n_layers"] == plain["n_layers"]  # the file itself is not changed


def test_a_field_the_model_lacks_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown .*attention.* field\(s\) \['n_head'\]; valid fields: .*n_heads"):
        preset_model_config(RECIPE, {"attention.n_head": 16})
