"""Each private use of another library (imagetx/compat.py) still does what imagetx relies on: a
failure names the library, its installed version, the version compat.py was checked against, and
the function of compat.py to look at (issue 112, item 9). The flex kernel's tiles need CUDA: on
the CPU the test reads that Inductor's flex template still takes those keys, and the CUDA test
runs them."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
from argparse import ArgumentError
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch

from imagetx import compat

REPO = Path(__file__).resolve().parents[1]


def changed(library: str, function: str, what: str) -> str:
    """The message of a failed check: what changed, in which library version, and where to look."""
    return (f"{library} {version(library)} (compat.py was checked against {compat.CHECKED[library]}): {what}; "
            f"see imagetx.compat.{function}")


def test_importing_compat_imports_nothing_of_imagetx_or_the_libraries():
    # In a fresh interpreter: what importing imagetx.compat adds to what the package itself loads.
    code = ("import sys, imagetx\n"
            "before = set(sys.modules)\n"
            "import imagetx.compat\n"
            "print(sorted(m for m in set(sys.modules) - before if m != 'imagetx.compat'))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)


# ----- torch ----------------------------------------------------------------------------------

def test_mark_static_address_marks_the_tensor_for_dynamo():
    import torch._dynamo

    function = getattr(torch._dynamo, "mark_static_address", None)
    assert callable(function), changed("torch", "mark_static_address", "torch._dynamo.mark_static_address is gone")
    assert list(inspect.signature(function).parameters)[:1] == ["t"], \
        changed("torch", "mark_static_address", f"its signature is now {inspect.signature(function)}")
    tensor = torch.zeros(3)
    compat.mark_static_address(tensor)
    assert getattr(tensor, "_dynamo_static_input_type", None) is not None, \
        changed("torch", "mark_static_address", "a marked tensor carries no _dynamo_static_input_type")


def test_the_flex_kernel_reads_the_tile_keys():
    # CPU: the keys compat.flex_tiles gives are the ones Inductor's flex templates read.
    from torch._inductor.kernel.flex import flex_attention as template

    source = inspect.getsource(template)
    tiles = compat.flex_tiles((16, 32), (16, 32), (32, 16))
    assert tiles == {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16}
    missing = [key for key in tiles if f'"{key}"' not in source]
    assert not missing, changed("torch", "flex_tiles", f"torch/_inductor/kernel/flex reads no {missing}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flex kernel's tiles are the CUDA (Triton) kernel's")
def test_the_flex_kernel_takes_tiles_finer_than_its_own():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block, length = 16, 256  # blocks finer than the kernel's default tiles: refused without the pinned tiles
    mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, length, length, device="cuda", BLOCK_SIZE=block)
    q, k, v = (torch.randn(2, 2, length, 64, device="cuda", requires_grad=True) for _ in range(3))
    kernel = torch.compile(flex_attention, dynamic=False)
    tiles = compat.flex_tiles((block, block), (block, block), (block, block))
    out = kernel(q, k, v, block_mask=mask, kernel_options=tiles)
    out.sum().backward()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, want, atol=2e-3), changed("torch", "flex_tiles", "the pinned tiles compute otherwise")


def test_a_fused_adam_skips_its_step_where_found_inf_is_set():
    assert 'getattr(self, "found_inf", None)' in inspect.getsource(torch.optim.Adam.step), \
        changed("torch", "skip_fused_step_where", "Adam.step no longer reads found_inf")
    for found, moves in ((True, False), (False, True)):
        weight = torch.nn.Parameter(torch.ones(4))
        optimizer = torch.optim.Adam([weight], lr=0.1, fused=True)
        weight.grad = torch.ones(4)
        compat.skip_fused_step_where(optimizer, torch.tensor(found))
        optimizer.step()
        assert bool((weight != 1).all()) == moves, \
            changed("torch", "skip_fused_step_where", f"found_inf={found} {'skipped' if moves else 'applied'} the update")


# ----- Lightning --------------------------------------------------------------------------------

def test_lightnings_bar_decides_each_redraw_in_should_update():
    from lightning.pytorch.callbacks import TQDMProgressBar

    rule = getattr(TQDMProgressBar, "_should_update", None)
    assert rule is not None, changed("lightning", "redraw_rule", "TQDMProgressBar._should_update is gone")
    assert list(inspect.signature(rule).parameters) == ["self", "current", "total"], \
        changed("lightning", "redraw_rule", f"_should_update's signature is now {inspect.signature(rule)}")
    for hook in ("on_train_batch_end", "on_validation_batch_end"):
        assert "self._should_update(" in inspect.getsource(getattr(TQDMProgressBar, hook)), \
            changed("lightning", "redraw_rule", f"TQDMProgressBar.{hook} no longer asks _should_update")

    @compat.redraw_rule
    class Bar(TQDMProgressBar):
        def should_redraw(self, current: int, total: int) -> bool:
            return current == 7

    assert Bar()._should_update(7, 10) and not Bar()._should_update(6, 10)


def test_lightnings_fit_loop_says_whether_it_restarted_mid_epoch():
    from lightning.pytorch import Trainer
    from lightning.pytorch.loops.fit_loop import RestartStage, _FitLoop

    prop = getattr(_FitLoop, "restarted_mid_epoch", None)
    assert isinstance(prop, property), changed("lightning", "restarted_mid_epoch", "_FitLoop.restarted_mid_epoch is gone")
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert compat.restarted_mid_epoch(trainer) is False
    trainer.fit_loop._restart_stage = RestartStage.RESTARTED_MID_EPOCH
    assert compat.restarted_mid_epoch(trainer) is True, \
        changed("lightning", "restarted_mid_epoch", "a fit loop restarted mid-epoch does not say so")


def test_lightnings_throughput_monitor_keeps_its_meters_in_throughputs():
    from lightning.pytorch.callbacks import ThroughputMonitor

    monitor = ThroughputMonitor(batch_size_fn=len)
    assert isinstance(getattr(monitor, "_throughputs", None), dict), \
        changed("lightning", "replace_throughput_meters", "ThroughputMonitor has no dict _throughputs")
    # setup builds them; _update (every batch) and _compute (every logging step) use them
    for method in ("setup", "_update", "_compute"):
        assert "self._throughputs[" in inspect.getsource(getattr(ThroughputMonitor, method)), \
            changed("lightning", "replace_throughput_meters", f"ThroughputMonitor.{method} no longer uses _throughputs")
    monitor._throughputs = {"train": None}
    compat.replace_throughput_meters(monitor, lambda: "meter")
    assert monitor._throughputs == {"train": "meter"}


def test_lightnings_wandb_logger_starts_its_run_from_wandb_init(tmp_path):
    from lightning.pytorch.loggers import WandbLogger

    source = inspect.getsource(WandbLogger)
    assert "wandb.init(**self._wandb_init)" in source, \
        changed("lightning", "resume_wandb_run", "WandbLogger no longer starts its run with wandb.init(**_wandb_init)")
    assert "self._id if" in source or "else self._id" in source, \
        changed("lightning", "resume_wandb_run", "WandbLogger's version no longer falls back to _id")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True)
    compat.resume_wandb_run(logger, "abc123")
    assert logger._wandb_init["id"] == "abc123" and logger._wandb_init["resume"] == "allow" and logger.version == "abc123"


# ----- jsonargparse and argparse ----------------------------------------------------------------

@dataclass
class Inner:
    n: int = 1


def parse_error(args: list[str]) -> str:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=Literal["likelihood", "complete"], default="likelihood")
    parser.add_argument("--inner", type=Inner, default=Inner())
    parser.add_argument("--ckpt", type=str, required=True)
    with pytest.raises(ArgumentError) as info:
        parser.parse_args(args)
    return str(info.value)


def test_jsonargparses_message_for_a_value_none_of_the_choices():
    message = parse_error(["--ckpt", "x", "--task", "liklihood"])
    assert compat.parse_error_key_path(message) == ["task"], \
        changed("jsonargparse", "parse_error_key_path", f"no 'Parser key' line in {message!r}")
    assert compat.parse_error_choice(message) == ("'likelihood', 'complete'", "liklihood"), \
        changed("jsonargparse", "parse_error_choice", f"a bad choice now reads {message!r}")


def test_jsonargparses_message_for_a_nested_value_of_the_wrong_type():
    message = parse_error(["--ckpt", "x", "--inner.n", "zz"])
    assert compat.parse_error_key_path(message) == ["inner.n"], \
        changed("jsonargparse", "parse_error_key_path", f"no 'Parser key' line in {message!r}")
    problem = [compat.parse_error_line(line) for line in message.splitlines()][-1]
    assert compat.EXPECTED_CLASS.fullmatch(problem.split(". Got value")[0]) and "Got value: zz" in problem, \
        changed("jsonargparse", "EXPECTED_CLASS", f"a value of the wrong type now reads {message!r}")


def test_jsonargparses_refusal_of_an_import_path_its_policy_denies():
    from jsonargparse import ArgumentParser

    from imagetx.cli.config_guard import guard_configs

    guard_configs()
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--hook", type=Callable)
    with pytest.raises(ArgumentError) as info:
        parser.parse_args(["--hook", "os.system"])
    assert compat.denied_import_path(info.value) == "os.system", \
        changed("jsonargparse", "denied_import_path", f"a denied import path now reads {info.value!r}")


def test_argparses_message_for_a_missing_required_option():
    message = parse_error([])
    assert compat.parse_error_required(message) == ["ckpt"], \
        changed("jsonargparse", "parse_error_required", f"a missing option now reads {message!r}")


def test_argparse_keeps_its_actions_in_actions():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt")
    parser.add_argument("-o", "--out")
    assert compat.option_names(parser) == {"h", "help", "ckpt", "o", "out"}, \
        f"Python {sys.version.split()[0]}'s argparse keeps no _actions: see imagetx.compat.option_names"


# ----- constriction -------------------------------------------------------------------------------

def coded_bits(frequencies: np.ndarray, symbols: np.ndarray) -> int:
    """The bits of ``symbols`` range-coded, each with ``frequencies`` (summing to 2**24) handed to
    compat's family as imagetx hands them (each less ``CONSTRICTION_LEAK``)."""
    import constriction

    encoder = constriction.stream.queue.RangeEncoder()
    masses = np.tile((frequencies - compat.CONSTRICTION_LEAK).astype(np.float64), (len(symbols), 1))
    encoder.encode(symbols.astype(np.int32), compat.lazy_categorical(), masses)
    decoder = constriction.stream.queue.RangeDecoder(encoder.get_compressed())
    assert np.array_equal(decoder.decode(compat.lazy_categorical(), masses), symbols), \
        changed("constriction", "lazy_categorical", "a range-coded message does not decode")
    return 32 * len(encoder.get_compressed())


def test_constrictions_lazy_categorical_codes_with_exactly_the_frequencies_given():
    # A value of frequency f costs -log2(f / 2**24) bits: 24 for f = 1 (constriction's own
    # quantisation of the frequencies themselves gives it 23), 1 for f = 2**23, up to the range
    # coder's last words.
    total, count, slack = 2**compat.CONSTRICTION_PRECISION, 2000, 64
    frequencies = np.ones(256, np.int64)
    frequencies[0] = total // 2
    frequencies[1] = total - frequencies.sum() + 1
    assert frequencies.sum() == total
    for value, bits in ((255, 24), (0, 1)):
        got = coded_bits(frequencies, np.full(count, value))
        assert count * bits <= got <= count * bits + slack, changed(
            "constriction", "lazy_categorical",
            f"{count} values of frequency {frequencies[value]} cost {got} bits, not {count * bits} (+ {slack})")
