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
* YAML whose aliases would expand without bound (``training/bounded_yaml.py``: a "billion laughs"
  document is a few hundred bytes and expands to gigabytes).
"""

from __future__ import annotations

import os

import yaml
from jsonargparse import get_loader, set_loader, set_parsing_settings

from ..errors import UserError
from ..training.bounded_yaml import check_expansion

TRUSTED = ("imagetx", "lightning", "torch")  # what a run needs: presets name imagetx only, the docs lightning
# torch's parts that fetch code (hub), compile it (cpp_extension) or load pickles, TorchScript or packages
LOADS_CODE = ("torch.hub", "torch.utils.cpp_extension", "torch.load", "torch.serialization", "torch.jit",
              "torch.package")
MORE_IMPORTS = "IMAGETX_CONFIG_IMPORTS"
ADMITTED: set[str] = set()  # what guard_configs last admitted from MORE_IMPORTS


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


JSONARGPARSE_YAML_LOAD = get_loader("yaml")  # jsonargparse's own, taken before guard_configs replaces it


def bounded_yaml_load(document: str):
    """jsonargparse's YAML loader, for what ``check_expansion`` passes."""
    check_expansion(document)
    return JSONARGPARSE_YAML_LOAD(document)
