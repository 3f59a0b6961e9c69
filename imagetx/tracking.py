"""Weights & Biases mode selection: online with a key, offline without, never a hang.

``--wandb auto`` (the default) logs online when an API key is configured
(``WANDB_API_KEY`` or a ``wandb login`` entry in ~/.netrc) and offline otherwise,
saying so once; ``offline`` and ``disabled`` force those modes; a ``WANDB_MODE``
already set in the environment is respected.
"""

from __future__ import annotations

import netrc
import os
import sys

WANDB_MODES = ("auto", "online", "offline", "disabled")
WANDB_HOST = "api.wandb.ai"


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(WANDB_HOST) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def choose_wandb_mode(requested: str = "auto") -> str:
    """Set ``WANDB_MODE`` for this process and return it."""
    if requested not in WANDB_MODES:
        raise ValueError(f"--wandb {requested!r} is invalid: choose one of {', '.join(WANDB_MODES)}")
    # Never let wandb wait for a key on standard input.
    os.environ.setdefault("WANDB_SILENT", "true")
    if requested == "auto":
        mode = os.environ.get("WANDB_MODE")
        if mode:
            return mode
        if has_wandb_key():
            mode = "online"
        else:
            mode = "offline"
            print("W&B: no API key found, logging offline (sync later with `wandb sync DIR`; "
                  "`--wandb disabled` turns it off).", file=sys.stderr)
    else:
        mode = requested
    os.environ["WANDB_MODE"] = mode
    return mode
