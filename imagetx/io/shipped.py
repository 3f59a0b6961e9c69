"""Where the shipped models (``pretrained/``) and presets (``configs/``) are: at the top of the
repository, where the README's commands name them, or, in an installed wheel, inside the package
(``imagetx/pretrained/``, ``imagetx/configs/``: setup.py puts them there). ``resolve`` lets the
README's paths work from anywhere once imagetx is installed, for the commands and for
``from_pretrained`` and ``load_model`` alike (this layer: the files; ``cli/shipped.py`` adds the
commands' ``--config``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # imagetx/
SHIPPED = ("pretrained", "configs")


def shipped_folder(name: str) -> Path:
    """``name`` ("pretrained" or "configs") in the installed package, else at the repository's top."""
    installed = PACKAGE / name
    return installed if installed.is_dir() else PACKAGE.parent / name


def resolve(path: str) -> str:
    """``path`` as given where it exists (or is absolute); a relative ``pretrained/...`` or
    ``configs/...`` that does not exist here is the shipped one, where that exists. Anything else is
    returned as given, for the command to refuse with its own message."""
    given = Path(path)
    if given.is_absolute() or given.exists() or len(given.parts) < 2 or given.parts[0] not in SHIPPED:
        return path
    shipped = shipped_folder(given.parts[0]).joinpath(*given.parts[1:])
    return str(shipped) if shipped.exists() else path
