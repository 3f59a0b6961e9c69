"""Other libraries' private API, in one place: each use a function (or a constant) saying what it
reaches into, why no public way does it, and the version it was checked against.
tests/test_compat.py fails, naming the library's version and the function, when one changes.

Checked against: torch 2.14.1, lightning 2.6.6, jsonargparse 4.53.0, constriction 0.5.0 (Python
3.11's argparse). The libraries are imported inside the functions: importing this module costs
nothing and imports nothing of imagetx, so that the model core (torch only) and the commands
(before torch) may import it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from argparse import ArgumentParser
    from collections.abc import Callable

    import torch

CHECKED = {"torch": "2.14.1", "lightning": "2.6.6", "jsonargparse": "4.53.0", "constriction": "0.5.0"}


# ----- torch ----------------------------------------------------------------------------------

def mark_static_address(tensor: torch.Tensor) -> None:
    """Tell torch.compile that ``tensor`` keeps its address for the whole decoding (written in
    place), so that a CUDA graph may capture a step that writes it rather than being skipped for
    "mutated inputs". ``torch._dynamo.mark_static_address``: ``torch.compiler`` has no public
    name for it (torch 2.14.1). Without CUDA graphs the mark changes nothing."""
    import torch._dynamo

    torch._dynamo.mark_static_address(tensor)


def flex_tiles(forward: tuple[int, int], backward_kv: tuple[int, int], backward_q: tuple[int, int]) -> dict:
    """``flex_attention``'s ``kernel_options`` that pin the tiles of its Triton (CUDA) kernels:
    forward, M queries × N keys; backward, dK/dV over N1 keys by M1 queries, and dQ over M2 queries
    by N2 keys, each (M, N), (M1, N1), (M2, N2) as given. ``kernel_options`` is a public argument,
    but its keys are Inductor's template parameters (torch/_inductor/kernel/flex/), named nowhere
    in the public API (torch 2.14.1)."""
    (m, n), (m1, n1), (m2, n2) = forward, backward_kv, backward_q
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_M2": m2, "BLOCK_N2": n2}


def skip_fused_step_where(optimizer: torch.optim.Optimizer, found: torch.Tensor) -> None:
    """Make the fused optimiser's next ``step`` skip its update where ``found`` (a one-element
    bool tensor, on the device) is true, without a host read. The fused Adam reads the attribute
    ``found_inf`` (``getattr(self, "found_inf", None)`` in torch/optim/adam.py), the protocol of
    torch's GradScaler with fused optimisers; no public call skips an update on the device
    (torch 2.14.1)."""
    optimizer.found_inf = found.float()


# ----- Lightning --------------------------------------------------------------------------------

def redraw_rule(bar_class: type) -> type:
    """Class decorator for a subclass of Lightning's ``TQDMProgressBar``: its method
    ``should_redraw(current, total) -> bool`` decides every redraw of its bars. Lightning decides
    them in the private ``_should_update(current, total)``, called by each ``on_*_batch_end``, and
    offers only a count of batches (``refresh_rate``) in public (lightning 2.6.6)."""
    bar_class._should_update = bar_class.should_redraw
    return bar_class


def restarted_mid_epoch(trainer: Any) -> bool:
    """Whether the trainer's fit resumed a checkpoint written in the middle of an epoch (Lightning
    then calls no ``on_train_epoch_start``). ``trainer.fit_loop`` is public, but it is a private
    ``_FitLoop`` and ``restarted_mid_epoch`` is none of the documented API (lightning 2.6.6)."""
    return trainer.fit_loop.restarted_mid_epoch


def replace_throughput_meters(monitor: Any, make: Callable[[], Any]) -> None:
    """Replace the meters that Lightning's ``ThroughputMonitor.setup`` has just built, one per
    stage, by ``make()``'s. They live in its private ``_throughputs`` {stage: Throughput}; no
    public argument chooses their class (lightning 2.6.6)."""
    monitor._throughputs = {stage: make() for stage in monitor._throughputs}


def resume_wandb_run(logger: Any, run_id: str) -> None:
    """Make Lightning's ``WandbLogger``, built but not yet started, continue the W&B run ``run_id``
    (``resume="allow"``). Its public way (the ``id`` / ``version`` argument) is taken only when it
    is made; what that argument sets is its private ``_wandb_init`` (the arguments of
    ``wandb.init``) and ``_id`` (lightning 2.6.6)."""
    logger._wandb_init.update(id=run_id, resume="allow")
    logger._id = run_id


# ----- jsonargparse and argparse ----------------------------------------------------------------

# jsonargparse states its errors as text only (jsonargparse 4.53.0): a parse error nests one line
# 'Parser key "NAME": ...' per level of the key path; a value none of a Literal's choices says
# 'Expected a typing.Literal[CHOICES]. Got value: VALUE', one of the wrong type "Expected a
# <class 'TYPE'>. Got value: VALUE"; lines that begin with PARSE_ERROR_NOISE's words state no
# problem (the union members tried, their headings). argparse (Python 3.11) says 'the following
# arguments are required: NAMES'.
PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
PARSER_KEY_PREFIX = re.compile(r'^-?\s*Parser key "[^"]+":\s*')
NOT_A_CHOICE = re.compile(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*)")
EXPECTED_CLASS = re.compile(r"Expected a <class '([\w.]+)'>")
PARSE_ERROR_NOISE = ("Does not validate against", "Subtypes:", "Errors:", "Given value", "Expected a <class 'NoneType'>",
                     "Problem with given class_path")
REQUIRED = re.compile(r"the following arguments are required: (.*)")

# jsonargparse 4.52+ refuses an import path its policy denies (set_parsing_settings'
# import_path_denylist) with its private ImportDenied, "Importing 'PATH' is not allowed, ...", and
# nests that text in the errors of each type it then tried: the ArgumentError it raises holds it
# only along its chain of causes (jsonargparse 4.53.0).
IMPORT_DENIED = re.compile(r"Importing '([\w.]+)' is not allowed")


def denied_import_path(error: BaseException) -> str | None:
    """The import path that jsonargparse's policy refused where that caused ``error``, else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = IMPORT_DENIED.search(str(error))
        if found:
            return found.group(1)
        error = error.__cause__ or error.__context__
    return None


def parse_error_key_path(message: str) -> list[str]:
    """The key path of jsonargparse's error ``message``, outermost first ('model', 'config',
    'n_heads'), read from its 'Parser key "..."' lines: jsonargparse's ``ArgumentError`` carries
    no key, only its text (jsonargparse 4.53.0)."""
    return PARSER_KEY.findall(message)


def parse_error_line(line: str) -> str:
    """A line of jsonargparse's error text without its 'Parser key "NAME":' prefix (and the list
    marker jsonargparse puts before a union member's), stripped."""
    return PARSER_KEY_PREFIX.sub("", line.strip()).lstrip("- ")


def parse_error_choice(message: str) -> tuple[str, str] | None:
    """(the choices as jsonargparse lists them, e.g. "'a', 'b'"; the value given) where its error
    ``message`` says a value is none of a Literal's choices, else None (jsonargparse 4.53.0)."""
    match = NOT_A_CHOICE.search(message)
    return None if match is None else (match.group(1), match.group(2).strip())


def parse_error_required(message: str) -> list[str] | None:
    """The names argparse's ``message`` says are required and were not given (options without
    their dashes, as if positional: 'ckpt', 'out'), else None (Python 3.11's argparse, which
    jsonargparse 4.53.0 leaves its wording)."""
    match = REQUIRED.search(message)
    return None if match is None else [name.strip() for name in match.group(1).split(",")]


def option_names(parser: ArgumentParser) -> set[str]:
    """Every option string of ``parser`` without its dashes ('ckpt', 'data.source'). argparse keeps
    its actions in the private ``_actions``; no public call lists them (Python 3.11; jsonargparse
    4.53.0's ArgumentParser is an argparse one)."""
    return {option.lstrip("-") for action in parser._actions for option in action.option_strings}


# ----- constriction -------------------------------------------------------------------------------

# constriction 0.5's Python API has no categorical model taking integer frequencies. Its lazy
# categorical model, Categorical(perfect=False), makes fixed point of float masses p_0..p_255 as
#     left cumulative of value v = floor(sum(p_j for j < v) * (2**24 - 256) / sum(p)) + v
# (LazyContiguousCategoricalEntropyModel::from_floating_point_probabilities_fast, 24-bit
# precision): every value gets LEAK = 1 more than its share. Handed each frequency less LEAK, the
# masses sum to 2**24 - 256, the scale is exactly 1.0, and every partial sum (an integer below
# 2**24) is exact in float64, so the model's frequency of v is exactly f_v. This rule is
# constriction's implementation, not its documented API (constriction 0.5.0); pyproject.toml pins
# constriction to 0.5.x: its bit stream is part of the file format.
CONSTRICTION_LEAK = 1
CONSTRICTION_PRECISION = 24


def lazy_categorical() -> Any:
    """constriction's lazy categorical family, ``Categorical(perfect=False)``, its masses given at
    each call: handed integer frequencies less ``CONSTRICTION_LEAK`` (as float64), it codes with
    exactly those frequencies (the rule above; constriction 0.5.0)."""
    import constriction

    return constriction.stream.model.Categorical(perfect=False)
