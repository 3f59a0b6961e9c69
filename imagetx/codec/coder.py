"""The coding pass: the model's cached decoder run over a batch of images, each sub-pixel's
quantised distribution handed to constriction's range coder (docs/compress.md, "Exact round
trips").

Encoder and decoder run one loop (``code_pass``), which differs only in what happens to each
distribution: the encoder codes the image's true values with it, the decoder decodes values
with it. Both feed the same values back into the model (the true ones; the decoded ones, the
same), with the same batch of images, on the same number of torch threads, in eval mode on the
CPU: the same floating-point computation, so the same parameters, so the same integers
(``distributions.quantise``). Nothing else is shared: the order of symbols in the stream is
step by step, and inside a step channel by channel (DMOL), image after image.

The range coder codes with exactly those integers (``coder_masses``): a value of frequency f
costs -log2(f / 2**24) bits, which ``encode_values`` adds up; the payload is that, up to the
coder's own rounding and last words (docs/compress.md, "How it codes").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import constriction
import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..compat import CONSTRICTION_LEAK, CONSTRICTION_PRECISION, lazy_categorical
from ..model.config import CHANNELS
from ..model.heads import CategoricalHead
from ..model.modes import eval_mode
from ..model.sampler import first_input
from ..model.transformer import ImageTransformer
from .container import WORD_BYTES, CodecError, payload_bits
from .distributions import (MIN_FREQUENCY, PRECISION, TOTAL, PixelDistributions, TorchPixelDistributions,
                            TorchTanhPixelDistributions, categorical_probs, quantise, torch_categorical_probs)
from .whole_ring import start_decoding

# (frequencies (N, 256) int64, the step, the channel or None) -> the N values coded (long).
CodeSymbols = Callable[[Tensor, int, int | None], Tensor]
# A progress bar whose output is not a terminal redraws at most once every this many seconds
# (each redraw is a line in a log file).
LOG_PROGRESS_SECONDS = 30.0
# constriction 0.5's Python API has no categorical model taking integer frequencies: its lazy
# categorical family, handed each frequency less LEAK, codes with exactly those frequencies
# (compat.py, "constriction", says how; ``coder_masses``). pyproject.toml pins constriction to
# 0.5.x: its bit stream is part of the file format.
LEAK = CONSTRICTION_LEAK
FAMILY = lazy_categorical()
# Format 1 handed the frequencies themselves, which constriction re-quantised (a value of frequency
# 1 cost 23 bits, not 24). Its files are still decoded as they were coded.
REQUANTISED_VERSION = 1
# From format 4 the distributions are computed without libm (distributions.py, float64.py); files
# of formats 1 to 3 are decoded with torch's float64 functions, as they were coded (issue 111).
LIBM_FREE_VERSION = 4
# Formats 4 and 5 still took the DMOL head's coupling coefficients' tanh from torch (glibc's); from
# format 6 it is float64.py's too, and the float64 step calls no libm at all.
OWN_TANH_VERSION = 6


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (the count a file records), then restored:
    a matrix product may sum in another order on another number of threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def progress_bar(total: int, description: str, enabled: bool) -> tqdm:
    interval = {} if sys.stderr.isatty() else {"mininterval": LOG_PROGRESS_SECONDS}
    return tqdm(total=total, desc=description, unit="step", disable=not enabled, leave=False, **interval)


def coder_masses(freq: Tensor, version: int) -> np.ndarray:
    """(N, 256) int64 frequencies (each >= 1, each row summing to TOTAL) -> the float64 masses
    that make ``FAMILY`` code with exactly these frequencies (format ``version`` >= 2; format 1:
    the masses its files were coded with)."""
    if version == REQUANTISED_VERSION:
        return freq.numpy().astype(np.float64)
    return (freq - LEAK).numpy().astype(np.float64)


# What ``coder_masses`` relies on: constriction's 24-bit precision, and no mass below zero.
assert PRECISION == CONSTRICTION_PRECISION and MIN_FREQUENCY >= LEAK


@torch.no_grad()  # not inference_mode: tensors the model caches (attention blocks) stay usable by autograd later
def code_pass(model: ImageTransformer, count: int, code: CodeSymbols, version: int,
              bar: tqdm | None = None) -> Tensor:
    """One decoding pass over ``count`` images: every step's distributions, as format ``version``
    computes them, to ``code``, its values back into the model. -> the values, (count, T)
    sub-pixels or (count, T, 3) pixels."""
    categorical = isinstance(model.head, CategoricalHead)
    if version >= OWN_TANH_VERSION:
        probs_of, Pixels = categorical_probs, PixelDistributions
    elif version >= LIBM_FREE_VERSION:
        probs_of, Pixels = categorical_probs, TorchTanhPixelDistributions
    else:
        probs_of, Pixels = torch_categorical_probs, TorchPixelDistributions
    values, value = [], first_input(model, count)
    with eval_mode(model):
        cache = start_decoding(model, count, version)
        for step in range(model.order.length):
            params = model.decode_step(value, cache)
            if categorical:
                value = code(quantise(probs_of(params)), step, None)
            else:
                pixels = Pixels(model.head, params)
                levels = []
                for channel in range(CHANNELS):
                    level = code(quantise(pixels.channel(channel)), step, channel)
                    pixels.observe(channel, level)
                    levels.append(level)
                value = torch.stack(levels, dim=-1)
            values.append(value)
            if bar is not None:
                bar.update(1)
    return torch.stack(values, dim=1)


def encode_values(model: ImageTransformer, targets: Tensor, encoder: constriction.stream.queue.RangeEncoder,
                  version: int, bar: tqdm | None = None) -> float:
    """Code ``targets`` (the model's ``targets(images)``: (N, T) or (N, T, 3)) into ``encoder``
    as format ``version`` codes them. -> their cost in bits, the sum of -log2(frequency /
    TOTAL): what the range coder spends on them (format >= 2), up to its rounding and last words."""
    cost = [0.0]

    def code(freq: Tensor, step: int, channel: int | None) -> Tensor:
        symbols = targets[:, step] if channel is None else targets[:, step, channel]
        encoder.encode(symbols.numpy().astype(np.int32), FAMILY, coder_masses(freq, version))
        cost[0] -= float(torch.log2(freq.gather(1, symbols[:, None]).double() / TOTAL).sum())
        return symbols

    coded = code_pass(model, targets.shape[0], code, version, bar)
    if not torch.equal(coded, targets):  # the loop fed back what it coded
        raise AssertionError("the encoder's pass did not code the images' values")
    return cost[0]


class PayloadDecoder:
    """constriction's range decoder over a file's payload (its 32-bit words), which refuses a
    decoding that reads past the payload's end: every value decoded spends the information its
    frequency carries, and more than the payload holds (container.payload_bits) cannot have come
    from it. So a header that claims more images than its payload codes is refused as soon as the
    payload runs out, not after decoding every image from the zeros the decoder reads beyond it."""

    def __init__(self, words: np.ndarray):
        self.decoder = constriction.stream.queue.RangeDecoder(words)
        self.payload_bytes = WORD_BYTES * len(words)
        self.bits_left = payload_bits(len(words))

    def decode(self, freq: Tensor, version: int) -> Tensor:
        """The values of one distribution per row of ``freq``, as format ``version`` coded them."""
        try:
            symbols = np.asarray(self.decoder.decode(FAMILY, coder_masses(freq, version)), dtype=np.int64)
        except (ValueError, RuntimeError, AssertionError) as error:  # constriction's refusal of its data
            raise CodecError(f"the range coder refused the payload: {error}") from None
        self.bits_left -= coded_bits(freq, symbols, version)
        if self.bits_left < 0:
            raise CodecError(f"the range decoder read past the end of the {self.payload_bytes:,}-byte payload")
        return torch.from_numpy(symbols)


def coded_bits(freq: Tensor, symbols: np.ndarray, version: int) -> float:
    """The least information the range coder took for ``symbols``, one a row of ``freq``: the sum of
    -log2(f / TOTAL) over the frequencies it coded them with, exactly ``freq``'s from format 2
    (``coder_masses``); format 1's re-quantisation gives a value at most LEAK more (compat.py's
    rule: the floor of its share, below its frequency, plus LEAK)."""
    coded = freq.numpy()[np.arange(len(symbols)), symbols] + (LEAK if version == REQUANTISED_VERSION else 0)
    return float(-np.log2(coded / TOTAL).sum())


def decode_values(model: ImageTransformer, count: int, decoder: PayloadDecoder, version: int,
                  bar: tqdm | None = None) -> Tensor:
    """``count`` images' values, (N, T) or (N, T, 3) long, decoded from ``decoder`` as format
    ``version`` coded them."""
    return code_pass(model, count, lambda freq, step, channel: decoder.decode(freq, version), version, bar)
