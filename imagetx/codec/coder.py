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

from ..model.config import CHANNELS
from ..model.modes import eval_mode
from ..model.sampler import first_input
from ..model.transformer import ImageTransformer
from .container import CodecError
from .distributions import TOTAL, PixelDistributions, categorical_probs, quantise

# (frequencies (N, 256) int64, the step, the channel or None) -> the N values coded (long).
CodeSymbols = Callable[[Tensor, int, int | None], Tensor]
# A progress bar whose output is not a terminal redraws at most once every this many seconds
# (each redraw is a line in a log file).
LOG_PROGRESS_SECONDS = 30.0


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


@torch.no_grad()  # not inference_mode: tensors the model caches (attention blocks) stay usable by autograd later
def code_pass(model: ImageTransformer, count: int, code: CodeSymbols, bar: tqdm | None = None) -> Tensor:
    """One decoding pass over ``count`` images: every step's distributions to ``code``, its
    values back into the model. -> the values, (count, T) sub-pixels or (count, T, 3) pixels."""
    categorical = model.config.head == "categorical"
    values, value = [], first_input(model, count)
    with eval_mode(model):
        cache = model.start_decoding(count)
        for step in range(model.order.length):
            params = model.decode_step(value, cache)
            if categorical:
                value = code(quantise(categorical_probs(params)), step, None)
            else:
                pixels = PixelDistributions(model.head, params)
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
                  bar: tqdm | None = None) -> float:
    """Code ``targets`` (the model's ``targets(images)``: (N, T) or (N, T, 3)) into ``encoder``.
    -> the ideal cost of the quantised distributions, in bits (what a perfect coder would
    spend: the sum of -log2(frequency / TOTAL))."""
    family = constriction.stream.model.Categorical(perfect=False)
    cost = [0.0]

    def code(freq: Tensor, step: int, channel: int | None) -> Tensor:
        symbols = targets[:, step] if channel is None else targets[:, step, channel]
        encoder.encode(symbols.numpy().astype(np.int32), family, freq.numpy().astype(np.float64))
        cost[0] -= float(torch.log2(freq.gather(1, symbols[:, None]).double() / TOTAL).sum())
        return symbols

    coded = code_pass(model, targets.shape[0], code, bar)
    if not torch.equal(coded, targets):  # the loop fed back what it coded
        raise AssertionError("the encoder's pass did not code the images' values")
    return cost[0]


def decode_values(model: ImageTransformer, count: int, decoder: constriction.stream.queue.RangeDecoder,
                  bar: tqdm | None = None) -> Tensor:
    """``count`` images' values, (N, T) or (N, T, 3) long, decoded from ``decoder``."""
    family = constriction.stream.model.Categorical(perfect=False)

    def code(freq: Tensor, step: int, channel: int | None) -> Tensor:
        try:
            symbols = decoder.decode(family, freq.numpy().astype(np.float64))
        except (ValueError, RuntimeError, AssertionError) as error:  # constriction's refusal of its data
            raise CodecError(f"the payload cannot be decoded ({error})") from None
        return torch.from_numpy(np.asarray(symbols, dtype=np.int64))

    return code_pass(model, count, code, bar)
