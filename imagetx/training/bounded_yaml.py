"""YAML read with its aliases bounded: a "billion laughs" document is a few hundred bytes and expands
to gigabytes. A document whose aliases would expand past ``MAX_VALUES`` values, nest deeper than
``MAX_DEPTH`` or refer to themselves is refused before it is expanded (``check_expansion``). What the
commands read as configs (cli/config_guard.py, through jsonargparse) and what reads a preset outside
them (presets.py) both go through it.
"""

from __future__ import annotations

import yaml

# The largest preset (configs/cifar10_recipe.yaml) is 111 YAML values and nests 5 deep; jsonargparse
# copies each value several times while it checks it, and recurses once per level.
MAX_VALUES = 100_000
MAX_DEPTH = 100


class ExpansionRefused(yaml.YAMLError):
    """A YAML document refused before it is expanded: what its aliases would make of it, in words.
    A YAMLError, so that jsonargparse treats it as a file it cannot load."""


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
