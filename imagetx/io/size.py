"""How large a model a configuration asks for, known before any of it is built: a file's
``config.json`` or checkpoint configuration of a few hundred bytes can ask for 10¹² parameters,
and building that model ran the machine out of memory (a 38-line RuntimeError, or the process
killed by the kernel with no message; issue 124). ``check_fits_memory`` refuses it in one line.
A model that fits is built, and its file's tensors are then checked against it one by one
(weights.check_tensors: the refusal names each missing or misshapen tensor).

The count is a lower bound, read from the configuration alone: the model cannot be built on
torch's ``meta`` device to count it (its attention patterns are computed from index tensors as it
is built), and a bound that never exceeds the model's count refuses no model that fits
(tests/io/test_model_size.py holds it against every shipped model and preset).
"""

from __future__ import annotations

import os

from ..model.config import ModelConfig
from .errors import CheckpointError

FLOAT32_BYTES = 4  # models are built in float32, whatever precision a file stores
GIB = 2 ** 30


def least_parameters(config: ModelConfig) -> int:
    """A lower bound of the parameters of the model ``config`` describes: the projection matrices
    of its transformer layers, the decoder's and (super-resolution) the encoder's, each with self-
    attention's query, key, value and output projections (4·d_model·width, width = heads × head
    size) and the feed-forward's two (2·d_model·d_filter); no bias, norm, embedding, head or
    cross-attention counted."""
    width = config.attention.n_heads * config.head_size
    layers = config.n_layers + (config.superres.encoder_layers if config.superres else 0)
    return layers * (4 * config.d_model * width + 2 * config.d_model * config.d_filter)


def machine_memory() -> int | None:
    """This machine's physical memory in bytes; None where the system does not say (Windows)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_memory(config: ModelConfig, source: object) -> None:
    """Refuse, in one line naming ``source`` (the file or setting the configuration came from), a
    configuration whose parameters alone, in float32, would take more than this machine's memory
    (``config`` validated: its sizes positive, its heads dividing d_model)."""
    least, memory = least_parameters(config), machine_memory()
    if memory is not None and least * FLOAT32_BYTES > memory:
        raise CheckpointError(f"{source}: the model configuration asks for at least {least:,} parameters "
                              f"({least * FLOAT32_BYTES / GIB:,.0f} GiB in float32), more than this machine's "
                              f"{memory / GIB:,.0f} GiB of memory: a model for a larger machine, or a damaged or "
                              "edited file")

