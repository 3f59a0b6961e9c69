"""What a config (a ``--config`` YAML file, or a setting's value on the command line) may make the
commands do. A config is trusted like a script, as in Lightning: it names the classes a run builds
and the functions it calls (a ``class_path``, a callback's hooks). Even so, a config from someone
else must not run what a run never needs, nor exhaust the machine before it is read; so the
commands refuse, in one line and before anything is imported or expanded:

* a class or function outside ``TRUSTED`` (imagetx, lightning, torch), or inside ``LOADS_CODE``
  (torch's ways to fetch, compile or unpickle code). The modules of your own callbacks are admitted
  when listed in the environment variable ``IMAGETX_CONFIG_IMPORTS`` (``mymodule,other.module``).
  jsonargparse applies this policy to every import path a value names, before importing it, and
  again to the path where the object it found is defined (``imagetx.train.sys.exit`` is
  ``sys.exit``).
* YAML whose aliases would expand past ``MAX_VALUES`` values, nest deeper than ``MAX_DEPTH`` or refer
  to themselves (a "billion laughs" document is a few hundred bytes and expands to gigabytes).
"""

from __future__ import annotations

import os

import yaml
from jsonargparse import get_loader, set_loader, set_parsing_settings

from ..errors import UserError

TRUSTED = ("imagetx", "lightning", "torch")  # what a run needs: presets name imagetx only, the docs lightning
# torch's parts that fetch code (hub), compile it (cpp_extension) or load pickles, TorchScript or packages
LOADS_CODE = ("torch.hub", "torch.utils.cpp_extension", "torch.load", "torch.serialization", "torch.jit",
              "torch.package")
MORE_IMPORTS = "IMAGETX_CONFIG_IMPORTS"
ADMITTED: set[str] = set()  # what guard_configs last admitted from MORE_IMPORTS
# The largest preset (configs/cifar10_recipe.yaml) is 111 YAML values and nests 5 deep; jsonargparse
# copies each value several times while it checks it, and recurses once per level.
MAX_VALUES = 100_000
MAX_DEPTH = 100


class ExpansionRefused(yaml.YAMLError):
    """A YAML document refused before it is expanded: what its aliases would make of it, in words.
    A YAMLError, so that jsonargparse treats it as a file it cannot load."""


def guard_configs() -> None:
    """Make jsonargparse, for the parsers of this process, import only what ``TRUSTED`` and
    ``IMAGETX_CONFIG_IMPORTS`` (as it is now) admit and load YAML through ``bounded_yaml_load``; a
    UserError naming a malformed ``IMAGETX_CONFIG_IMPORTS`` entry."""
    more = {entry.strip() for entry in os.environ.get(MORE_IMPORTS, "").split(",") if entry.strip()}
    # jsonargparse adds to its one policy per process: what an earlier call admitted is denied again
    dropped = ADMITTED - more
    try:
        set_parsing_settings(import_path_denylist=["*", *LOADS_CODE, *dropped],
                             import_path_allowlist=[*TRUSTED, *sorted(more)])
    except ValueError as error:
        raise UserError(f"{MORE_IMPORTS}={','.join(sorted(more))}: {error}") from None
    ADMITTED.clear()
    ADMITTED.update(more)
    set_loader("yaml", bounded_yaml_load, exceptions=(yaml.YAMLError,))  # what jsonargparse reports as a bad file


def refusal(path: str, key: str = "") -> str:
    """The one line that refuses a config's import ``path`` (at the setting ``key``)."""
    return (f"{key + ': ' if key else ''}{path} is refused: a config names only what a run needs, classes and "
            f"functions of {', '.join(TRUSTED)} (not {', '.join(LOADS_CODE)}), since a run calls what it names; "
            f"for a module of your own, list it in {MORE_IMPORTS}=module[,module]")


def check_expansion(document: str) -> None:
    """An ExpansionRefused where ``document``'s YAML, its aliases expanded, would hold more than
    ``MAX_VALUES`` values, nest deeper than ``MAX_DEPTH`` or hold itself. Counted on the composed
    nodes, which an alias shares rather than copies: as long as the text, however large the expansion."""
    root = yaml.compose(document, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if root is None:
        return
    values: dict[int, int] = {}  # id(node) -> values in its expansion, the node included
    path, stack = {id(root)}, [(root, iter(children(root)))]  # depth first, one child at a time
    while stack:
        node, pending = stack[-1]
        child = next(pending, None)
        if child is None:
            stack.pop()
            path.discard(id(node))
            values[id(node)] = 1 + sum(values[id(each)] for each in children(node))
            if values[id(node)] > MAX_VALUES:
                raise ExpansionRefused(f"its aliases expand to more than {MAX_VALUES:,} values (from line "
                                       f"{node.start_mark.line + 1}): refused before expanding them; write them out")
        elif id(child) in path:
            raise ExpansionRefused(f"an alias at line {child.start_mark.line + 1} refers to a value that holds it: "
                                   "refused before expanding it")
        elif id(child) not in values:
            if len(stack) >= MAX_DEPTH:
                raise ExpansionRefused(f"it nests deeper than {MAX_DEPTH} levels (line {child.start_mark.line + 1}): "
                                       "refused before expanding it")
            path.add(id(child))
            stack.append((child, iter(children(child))))


def children(node: yaml.Node) -> list[yaml.Node]:
    """The nodes directly inside a composed YAML ``node``: a mapping's keys and values, a sequence's items."""
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def safe_load(document: str):
    """``yaml.safe_load`` of ``document`` once ``check_expansion`` has passed it."""
    check_expansion(document)
    return yaml.safe_load(document)


JSONARGPARSE_YAML_LOAD = get_loader("yaml")  # jsonargparse's own, taken before guard_configs replaces it


def bounded_yaml_load(document: str):
    """jsonargparse's YAML loader, for what ``check_expansion`` passes."""
    check_expansion(document)
    return JSONARGPARSE_YAML_LOAD(document)
