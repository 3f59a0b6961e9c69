"""The shipped models and presets for the commands: ``io/shipped.py`` finds them (``resolve``,
``shipped_folder``, re-exported here for the commands); ``resolve_config_args`` finds a preset
named by ``--config`` as the README names it."""

from __future__ import annotations

from ..io.shipped import resolve, shipped_folder  # noqa: F401 (the commands import them from here)


def resolve_config_args(args: list[str]) -> list[str]:
    """Command-line words with each ``--config`` file resolved (``resolve``): a preset named as the
    README names it, ``configs/quick.yaml``, is found from any folder."""
    words = list(args)
    for i, word in enumerate(words):
        if word in ("--config", "-c") and i + 1 < len(words):
            words[i + 1] = resolve(words[i + 1])
        elif word.startswith("--config="):
            words[i] = "--config=" + resolve(word.partition("=")[2])
    return words
