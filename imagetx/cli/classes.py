"""Class names for ``--label``: a class-conditional model knows its classes by number only, so the
names come from the data the command is pointed at: CIFAR-10's ten (``--data.source cifar10``, the
default, for a model of ten classes) or a folder's sub-folders, in the order the folder conversion
numbers them (``--data.source folder --data.root DIR``: the manifest's ``classes``). ImageNet's
batch files carry no names: there ``--label`` takes numbers only."""

from __future__ import annotations

import difflib
from pathlib import Path

from ..errors import UserError, shown

# CIFAR-10's label_names (batches.meta), in the order of its labels 0..9.
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def class_names(source: str, root: str | None, num_classes: int) -> list[str] | None:
    """The names of a ``num_classes``-class model's classes on ``source`` at ``root``, or None where
    that data names none, or names another number of classes (then it is not the model's data)."""
    if source == "cifar10":
        names = list(CIFAR10_CLASSES)
    elif source == "folder":
        from ..data.sources import default_root  # here: the data sources import torch and more
        from ..data.sources.folder import scan  # a walk of the folder: only for a conditional model

        folder = Path(root).expanduser() if root else default_root()
        names = scan(folder)[1] if folder.is_dir() else []
    else:
        return None
    return names if num_classes and len(names) == num_classes else None


def class_number(label: str, names: list[str] | None, num_classes: int) -> int:
    """``--label`` as a class number: a number as given (its range is the model's to check), or a
    class's name; a ValueError naming the choices for a name that is none of them."""
    try:
        return int(label)
    except ValueError:
        pass
    if not num_classes:
        raise UserError(f"--label {label} given, but this model is unconditional (num_classes=0): drop --label")
    if names is None:
        raise UserError(f"--label {label}: this data names no classes (CIFAR-10 and a folder's sub-folders do): "
                        f"give a class number 0..{num_classes - 1}")
    if label in names:
        return names.index(label)
    close = difflib.get_close_matches(label, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"--label {label!r} is not a class of this data{hint}: give a number 0..{num_classes - 1} "
                    f"or a name: {', '.join(names)}")


def described(labels: list[int], names: list[str] | None) -> str:
    """'3 cat, 5 dog' (numbers and, where known, names) for the distinct ``labels`` in order; a
    folder's names (its sub-folders') with their escapes shown."""
    distinct = list(dict.fromkeys(labels))
    return ", ".join(f"{label} {shown(names[label])}" if names else str(label) for label in distinct)
