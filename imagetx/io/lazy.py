"""A package's public names imported on first use (PEP 562), so that a command, which imports its
package first, can refuse a bad argument before torch is imported (most of a cold start:
``python -X importtime -m imagetx.sample``); ``from imagetx import load_model`` imports what it needs."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` whose ``public`` names ({name: the
    submodule that defines it, relative: ".io.hub"}) are imported when first looked up."""

    def __getattr__(name: str) -> Any:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name], package), name)
        setattr(sys.modules[package], name, value)  # looked up once
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return __getattr__, __dir__
