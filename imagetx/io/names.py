"""Weights written under older parameter names, read under today's.

A super-resolution model's weights were once named as if it were the decoder itself, its readings
of the encoder inside the decoder's layers (``layers.3.cross_attn.to_q.weight``); today the model
holds the decoder (``decoder.layers.3.self_attn...``) and its readings beside it
(``readings.3.cross_attn.to_q.weight``). Shipped folders, checkpoints and continuations written
then are read through ``current_names``. The order of the parameters is what it was, so an
optimiser's state (matched by order) goes on as before.
"""

from __future__ import annotations

import re

from torch import Tensor

# The parts of a super-resolution model's decoder layers that read the encoder, then named under
# ``layers.<i>.``, and the decoder's own top-level parts.
READING_PARTS = ("cross_attn", "cross_norm", "cell_add", "cell_norm")
DECODER_PARTS = ("value_embedding", "positions", "class_embedding", "layers", "final_norm", "head")
READING = re.compile(rf"layers\.(\d+)\.({'|'.join(READING_PARTS)})\.")


def current_names(state: dict[str, Tensor], prefix: str = "") -> dict[str, Tensor]:
    """``state`` (names under ``prefix``: "model." in a training checkpoint) with a
    super-resolution model's older names made today's; any other state as it is. An older
    super-resolution state is one with an encoder and no ``decoder.`` part."""
    names = [name.removeprefix(prefix) for name in state if name.startswith(prefix)]
    if not any(name.startswith("encoder.") for name in names) or any(name.startswith("decoder.") for name in names):
        return state
    return {rename(name, prefix): value for name, value in state.items()}


def rename(name: str, prefix: str) -> str:
    if not name.startswith(prefix):
        return name
    own = name.removeprefix(prefix)
    reading = READING.match(own)
    if reading:
        return f"{prefix}readings.{reading.group(1)}.{own[len('layers.'):].split('.', 1)[1]}"
    if own.split(".", 1)[0] in DECODER_PARTS:
        return f"{prefix}decoder.{own}"
    return name
