"""Cached incremental sampling (docs/model.md §7): one generation step at a time through all layers.

The model decodes a step with the same layers as the full pass, given a cache
(``model.start_decoding`` / ``decode_step``): each self-attention layer keeps a
kv-cache just long enough for the oldest key any later query can still see (``PatternIndex.
cache_length``: for 1D local attention with one memory block 2·lq steps, not the whole image), and
each step reads its query block's keys from it; cross-attention's keys and values over the
encoder output are computed once.
``sample_progressively`` is the loop around it and ``sample`` returns its finished images; tests
check that teacher-forced decoding equals the full pass. A completion's given rows are not
stepped through: one teacher-forced pass (``model.prefill``, the full pass over
them) fills every cache with them, and the loop starts at
the first step to draw. Every image of a call is one batch, whatever its temperature
(``temperature`` may give one per image). ``sample_progressively`` can yield the images as they
grow, for a page that shows them. On a CPU the steps run on ``DECODING_THREADS`` (one) of
torch's threads: measured best on a busy machine and close to best on an idle one.

The step can run compiled (``compile_decoding``; ``sample(..., compiled=True)``): the same
``decode_step``, traced whole into one graph with static shapes. That works because every
cache is allocated when decoding starts and written in place, the step index is one 0-d tensor
(the decoding cache's, handed to each layer), and no branch of the step depends on which step
it is. On CUDA ``compiled="reduce-overhead"`` also captures the step as a CUDA graph: one launch
per step instead of one per kernel. The loop reads nothing back from the device per step (the given
rows are known on the host, the heads draw without ``torch.multinomial``'s checks): it
queues the steps, and the device runs them as fast as it can.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..compat import mark_static_address
from ..errors import UserError
from .heads import check_temperature, params_and_bounds
from .modes import eval_mode
from .superres import SuperResolutionCache
from .transformer import AutoregressiveModel, DecodingCache

# (value generated at the step before, cache) -> the head's parameters (with ``exact_box_means``, and
# the step's value bounds: heads.params_and_bounds): the model's ``decode_step``, or its compiled form
# (a super-resolution model's or any other: superres.py).
Cache = DecodingCache | SuperResolutionCache  # what a model's ``start_decoding`` returns
DecodeStep = Callable[[Tensor, Cache], Tensor | tuple[Tensor, Tensor]]


def model_device(model: AutoregressiveModel) -> torch.device:
    return next(model.parameters()).device


def check_count(count: int) -> None:
    if count < 1:
        raise UserError(f"number of images {count} is invalid: ask for at least 1")


def first_input(model: AutoregressiveModel, count: int) -> Tensor:
    """``previous`` for step 0, which ``decode_step`` reads and ignores: zeros of the shape of
    one step's values, (count,) sub-pixels or (count, 3) pixels."""
    return torch.zeros((count, *model.head.value_shape), dtype=torch.long, device=model_device(model))


def cache_tensors(state: object) -> Iterator[Tensor]:
    """Every tensor a decoding cache holds (its dataclasses, lists and tensors, walked)."""
    if isinstance(state, Tensor):
        yield state
    elif dataclasses.is_dataclass(state):
        for field in dataclasses.fields(state):
            yield from cache_tensors(getattr(state, field.name))
    elif isinstance(state, (list, tuple)):
        for item in state:
            yield from cache_tensors(item)


class CompiledDecoding:
    """``model.decode_step`` compiled (``compile_decoding``), called as the step itself."""

    def __init__(self, model: AutoregressiveModel, compiled: Callable) -> None:
        self.model, self.compiled = model, compiled
        self.marked: weakref.ref | None = None  # the cache whose tensors were last marked static

    def __call__(self, previous: Tensor, cache: Cache) -> Tensor | tuple[Tensor, Tensor]:
        if self.marked is None or self.marked() is not cache:
            # The caches stay at one address for the whole decoding (written in place): marked so,
            # a CUDA graph may capture a step that writes them, rather than being skipped for
            # "mutated inputs"; without CUDA graphs the mark changes nothing.
            for tensor in cache_tensors(cache):
                mark_static_address(tensor)
            self.marked = weakref.ref(cache)
        # contiguous: strides are part of a static graph; a teacher-forced value (a column of
        # the prefix) would otherwise compile a second graph. clone: the parameters are the
        # caller's to keep (and the value bounds beside them), and a CUDA graph overwrites its
        # outputs at its next replay.
        outputs = self.compiled(self.model, previous.contiguous(), cache)
        return tuple(o.clone() for o in outputs) if isinstance(outputs, tuple) else outputs.clone()


# model -> {mode: its compiled decode_step}. Weak: a model's compilations go with it. What is
# kept is the class's decode_step, compiled, which refers to no model.
COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Each compilation with graphs of its own: torch keeps the graphs of one function together, so
# that one model's (or mode's) would count against every other's recompile limit. A torch
# without isolate_recompiles (before 2.13) cannot separate them: there the limit counts every
# model's graphs in the process.
ISOLATED = {"isolate_recompiles": True} if "isolate_recompiles" in inspect.signature(torch.compile).parameters else {}


def compile_decoding(model: AutoregressiveModel, mode: str = "default") -> DecodeStep:
    """``model.decode_step`` under ``torch.compile(fullgraph=True, dynamic=False)``, in ``mode``
    ("default"; "reduce-overhead" on CUDA: captured as a CUDA graph, replayed at every step).

    One graph per batch size, dtype and device, compiled at its first step (seconds) and kept
    while the model lives: each ``compile_decoding(model, mode)`` returns the same compilation.
    fullgraph: a graph break is an error, not a silent slow path; past torch's recompile limit
    (8 graphs per model) it raises too. Equal to the eager step (tests)."""
    modes = COMPILED.setdefault(model, {})
    if mode not in modes:
        modes[mode] = torch.compile(type(model).decode_step, fullgraph=True, dynamic=False, mode=mode, **ISOLATED)
    return CompiledDecoding(model, modes[mode])


# Threads for decoding on a CPU. One step is small (a batch of a few images at one position):
# spread over more threads, its work is shorter than the time the threads take to meet, and on a
# machine that is running anything else a thread that waits for a core makes every step wait.
# So one thread, unless the user said otherwise (OMP_NUM_THREADS): what is lost on an idle
# machine is small, what is won on a busy one is large (docs/results.md, "Threads for decoding").
DECODING_THREADS = 1
THREADS_ASKED_BY = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class DecodingThreads:
    """torch's intra-op threads set to ``DECODING_THREADS`` for decoding on a CPU, and given back
    (``restore``) before control returns to the caller, e.g. between the yields of
    ``sample_progressively``: a caller's own work keeps its own threads. Left alone on other
    devices and where the environment says how many threads to use."""

    def __init__(self, device: torch.device) -> None:
        asked = any(os.environ.get(name) for name in THREADS_ASKED_BY)
        self.active = device.type == "cpu" and not asked
        self.previous: int | None = None

    def limit(self) -> None:
        if self.active and self.previous is None:
            self.previous = torch.get_num_threads()
            if self.previous > DECODING_THREADS:
                torch.set_num_threads(DECODING_THREADS)

    def restore(self) -> None:
        if self.previous is not None:
            if self.previous != torch.get_num_threads():
                torch.set_num_threads(self.previous)
            self.previous = None


# A progress bar whose output is not a terminal (a log file, a CI job) cannot redraw in place:
# each update is a line. There it updates at most once every this many seconds.
LOG_PROGRESS_SECONDS = 30.0


def progress_bar(steps: range, enabled: bool) -> Iterator[int]:
    """``steps`` under a tqdm bar over the steps to draw (a completion's given ones are not
    among them: its bar starts at 0), redrawn freely on a terminal and sparingly anywhere else."""
    interval = {} if sys.stderr.isatty() else {"mininterval": LOG_PROGRESS_SECONDS}
    return tqdm(steps, desc="sampling", unit="step", disable=not enabled, leave=False, **interval)


def image_temperatures(temperature: float | Sequence[float], count: int) -> list[float]:
    """One temperature for every image, checked: ``temperature`` for all, or one each."""
    temperatures = [temperature] * count if isinstance(temperature, (int, float)) else list(temperature)
    if len(temperatures) != count:
        raise UserError(f"{len(temperatures)} temperatures for {count} images: give one, or one per image")
    for value in temperatures:
        check_temperature(value)
    return temperatures


class Drawer:
    """Draws each step's values from the head's parameters at each image's temperature: one
    draw for the batch where they share one, else one per temperature (its images gathered)."""

    def __init__(self, model: AutoregressiveModel, temperatures: list[float], generator: torch.Generator | None,
                 device: torch.device) -> None:
        self.head, self.generator = model.head, generator
        distinct = sorted(set(temperatures))
        self.groups = [(value, torch.tensor([i for i, t in enumerate(temperatures) if t == value], device=device))
                       for value in distinct]
        order = torch.cat([rows for _, rows in self.groups])
        self.inverse = torch.argsort(order)  # concatenated groups -> image order

    def __call__(self, params: Tensor, bounds: Tensor | None = None) -> Tensor:
        """(B, P) one step's parameters[, (B, 2c) its value bounds] -> (B,) or (B, 3) values."""
        if len(self.groups) == 1:
            return self.head.sample(params[:, None], self.groups[0][0], self.generator,
                                    None if bounds is None else bounds[:, None])[:, 0]
        drawn = [self.head.sample(params[rows, None], value, self.generator,
                                  None if bounds is None else bounds[rows, None])[:, 0] for value, rows in self.groups]
        return torch.cat(drawn).index_select(0, self.inverse)


@dataclasses.dataclass(frozen=True)
class Progress:
    """What ``sample_progressively`` yields: ``steps`` decoded so far (given ones included) of
    ``total``, and ``images`` (count, H, W, 3) uint8, the cells not yet decoded 0."""

    steps: int
    total: int
    images: Tensor

    @property
    def done(self) -> bool:
        return self.steps == self.total


def partial_images(model: AutoregressiveModel, values: list[Tensor]) -> Tensor:
    """The values of the steps decoded so far -> (count, H, W, 3) uint8, later cells 0."""
    sequence = torch.stack(values, dim=1)
    missing = model.order.length - sequence.shape[1]
    if missing:
        sequence = torch.cat([sequence, sequence.new_zeros(sequence.shape[0], missing, *sequence.shape[2:])], dim=1)
    return model.images(sequence).to(torch.uint8)


def given_values(model: AutoregressiveModel, count: int, prefix: Tensor | None, given_rows: int) -> Tensor | None:
    """The values a completion is given, read from ``prefix`` (count, H, W, 3): those of the steps
    in the first ``given_rows`` image rows (``model.given_steps``), (count, k) sub-pixels or
    (count, k, 3) pixels; None without given rows."""
    given = model.given_steps(given_rows).tolist()  # on the host, once: no device sync per step
    if not given_rows:
        return None
    if prefix is None or prefix.shape[0] != count:
        raise UserError(f"completion needs prefix images of shape ({count}, H, W, 3) for given_rows={given_rows}")
    given_count = sum(given)
    if not all(given[:given_count]):  # model.given_steps puts them first (whole rows of 2D blocks)
        raise ValueError(f"given_rows={given_rows}: the given steps do not come first in generation order")
    return model.targets(prefix.to(model_device(model)))[:, :given_count]


def check_given_fit(model: AutoregressiveModel, forced: Tensor, bounds: Tensor | None) -> None:
    """With ``exact_box_means``, given values that no image with the low-res input's box means
    could have (a completion's rows from another image) are refused in one line, before any step
    is drawn: each given value must lie within the ``bounds`` of its step (the prefill's), which
    then leave every later step a value to take. One read of the device; none without bounds."""
    if bounds is not None and not model.head.fits(forced, bounds).all():
        raise UserError("the given rows do not fit low_res: no image with its box means has them "
                        "(exact_box_means); give the rows of the image low_res was made from")


def decoded(model: AutoregressiveModel, count: int, step: DecodeStep, draw: Drawer, cache: Cache,
            forced: Tensor | None, progress: bool) -> Iterator[tuple[list[Tensor], Tensor]]:
    """The decoding loop over ``cache``: yields (the values of the steps so far, whether every
    output so far was finite: a 0-d bool on the device, for the caller to read once) after the
    given steps (``forced``), if any, and after each step drawn."""
    finite = torch.ones((), dtype=torch.bool, device=model_device(model))
    values, value = [], first_input(model, count)
    if forced is not None:  # one teacher-forced pass over the given rows fills every cache
        params, bounds = params_and_bounds(model.prefill(forced, cache))
        finite &= params.isfinite().all()
        check_given_fit(model, forced, bounds)
        values, value = list(forced.unbind(1)), forced[:, -1]
        yield values, finite
    total = model.order.length
    for _ in progress_bar(range(len(values), total), progress):
        params, bounds = params_and_bounds(step(value, cache))
        finite &= params.isfinite().all()
        value = draw(params, bounds)
        values.append(value)
        yield values, finite


@torch.no_grad()
def sample_progressively(
    model: AutoregressiveModel,
    count: int,
    labels: Tensor | None = None,
    low_res: Tensor | None = None,
    temperature: float | Sequence[float] = 1.0,
    prefix: Tensor | None = None,
    given_rows: int = 0,
    generator: torch.Generator | None = None,
    progress: bool = False,
    compiled: bool | str = False,
    every: int | None = None,
    transforms: Tensor | None = None,
) -> Iterator[Progress]:
    """Generate ``count`` images with the cache, in eval mode (the model's own mode is restored
    after), showing the work: with ``every`` = n, yields the images so far after the given rows
    and after every n steps (a page that draws the samples as they grow), and always, last, the
    finished images (what ``sample`` returns). Reads the device only for what it yields (and,
    with ``exact_box_means`` and given rows, once, to check that they fit ``low_res``: ``check_given_fit``).

    ``temperature``: one for every image, or a sequence of one per image (images that share one
    are drawn together). With ``prefix`` images and ``given_rows`` = k, every step in the first k
    image rows (``model.given_steps``) is teacher-forced to the prefix's value (image completion,
    docs/model.md §6), in one pass (``model.prefill``); the rest is sampled. ``compiled``: each
    step through ``compile_decoding`` (True: torch.compile's default mode; a string: that mode,
    e.g. "reduce-overhead"), the same images as the eager step gives, up to rounding. ``transforms``: the
    transform id of each image, for a model with distribution augmentation (None: the identity)."""
    check_count(count)
    temperatures = image_temperatures(temperature, count)
    forced = given_values(model, count, prefix, given_rows)
    if every is not None and every < 1:
        raise UserError(f"every={every} is invalid: yield every 1 or more steps")
    device, total = model_device(model), model.order.length
    step = compile_decoding(model, "default" if compiled is True else compiled) if compiled else model.decode_step
    draw = Drawer(model, temperatures, generator, device)
    given_count = 0 if forced is None else forced.shape[1]
    threads = DecodingThreads(device)
    with eval_mode(model):
        threads.limit()
        try:
            cache = model.start_decoding(count, labels, low_res=low_res, transforms=transforms)
            for values, finite in decoded(model, count, step, draw, cache, forced, progress):
                steps = len(values)
                if every is not None and (steps == given_count or (steps % every == 0 and steps < total)):
                    threads.restore()
                    yield Progress(steps, total, partial_images(model, values))
                    threads.limit()
        finally:
            threads.restore()
    if not finite:  # read once, after the loop
        raise FloatingPointError("the model's outputs are not finite (NaN or infinite weights?): no images sampled")
    yield Progress(total, total, partial_images(model, values))


def sample(model: AutoregressiveModel, count: int, *args, **kwargs) -> Tensor:
    """Generate ``count`` images (count, H, W, 3) uint8: the finished images of
    ``sample_progressively``, which takes the same arguments (and ``every``, which this has no use for)."""
    (finished,) = sample_progressively(model, count, *args, every=None, **kwargs)  # without every: one yield
    return finished.images
