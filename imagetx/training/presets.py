"""A training preset (``configs/*.yaml``, the ``--config`` of ``imagetx.train``) read outside the training
command: its model (``preset_model_config``), with settings named as on the command line, a section's field
by a dotted name (``attention.n_heads`` for ``--model.config.attention.n_heads``).

``set_dotted`` writes a value at such a name and ``dotted_fields`` lists a config's values by them. Used
where a preset's network is wanted without training it: benchmarks, the speed check, the settings a grown
checkpoint resumes with (resume.py).
"""

from __future__ import annotations

from pathlib import Path

from ..model.config import GEOMETRY, ModelConfig
from .bounded_yaml import safe_load


def read_preset(path: str | Path) -> dict:
    """The preset YAML at ``path``, as a tree of sections, its aliases bounded as the commands bound
    them (bounded_yaml.py: a few hundred bytes can expand to gigabytes)."""
    with open(path, encoding="utf-8") as handle:
        return safe_load(handle.read())


def preset_model_config(path: str | Path, overrides: dict | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the preset at ``path`` (its ``model.config``), with ``overrides``: a field by
    its name, a section's by a dotted one (``{"n_layers": 28, "attention.n_heads": 16}``). An override of
    ``attention.kind`` leaves out the preset's geometry of its own kind (a config refuses another kind's)."""
    fields = read_preset(path)["model"]["config"]
    overrides = overrides or {}
    if "attention.kind" in overrides:  # another kind: the preset's geometry was its own kind's, not this one's
        attention = fields.get("attention") or {}
        for name in (name for kind, names in GEOMETRY.items() if kind != overrides["attention.kind"] for name in names):
            attention.pop(name, None)
    for key, value in overrides.items():
        set_dotted(fields, key, value)
    return ModelConfig.from_dict(fields)


def set_dotted(tree: dict, key: str, value) -> None:
    """Set ``tree``'s entry at the dotted ``key`` (``model.config.attention.n_heads``) to ``value``, in
    place, making the sections on the way that ``tree`` leaves out (or holds as null)."""
    *sections, name = key.split(".")
    for section in sections:
        if tree.get(section) is None:
            tree[section] = {}
        tree = tree[section]
    tree[name] = value


def dotted_fields(values: dict, prefix: str = "") -> dict:
    """A config's values (``ModelConfig.to_dict``) by field name, a section's dotted (``attention.n_heads``):
    ``set_dotted`` of each into an empty tree gives ``values`` back."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(dotted_fields(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out
