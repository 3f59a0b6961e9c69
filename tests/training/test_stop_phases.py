"""A stop signal outside a training step ends the run at once (issue 126, item 3; training/interrupt.py):
during a validation (mid-run, and the final one after the last step), the sanity check and a step
that compiles the network, keeping the step before and saying where in the one ``stopped:`` line;
a signal during a checkpoint write leaves the file whole and is answered after it.

Each signal comes from inside the run (a callback, a checkpoint writer) at a known moment, so what
ran after it is counted, not timed; ``scripts/signal_latency.py`` times each phase from outside.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from helpers import assert_goes_on_as_the_whole_run, tiny_config, write_train_config
from imagetx.io.atomic import atomic_write
from imagetx.train import main
from imagetx.training.checkpoint_io import AtomicCheckpointIO
from imagetx.training.interrupt import compiles
from imagetx.training.module import ImageTransformerModule

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

# The modules of this file's callbacks, which the configs name (cli/config_guard.py admits them so)
CALLBACK_MODULES = "test_stop_phases,stop_callbacks"


@pytest.fixture(autouse=True)
def admit_callback_modules(monkeypatch):
    monkeypatch.setenv("IMAGETX_CONFIG_IMPORTS", CALLBACK_MODULES)


VAL_BATCHES = 3  # batches of one image a validation: a signal at the first leaves two that must not run


class SignalInValidation(L.Callback):
    """Sends this process ``signum`` at the end of the first batch of the validation after step
    ``step`` (``sanity``: of the sanity check), and records every validation batch begun after it."""

    begun_after: list[int] = []

    def __init__(self, step: int, sanity: bool = False, signum: int = int(signal.SIGTERM)) -> None:
        self.step, self.sanity, self.signum, self.sent = step, sanity, signum, False
        SignalInValidation.begun_after = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.sent:
            SignalInValidation.begun_after.append(batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not self.sent and trainer.sanity_checking == self.sanity and trainer.global_step == self.step:
            self.sent = True
            signal.raise_signal(self.signum)


class CountValidation(L.Callback):
    """Records the step of every batch a fit's validations (not the sanity check) ran."""

    steps: list[int] = []

    def __init__(self) -> None:
        CountValidation.steps = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            CountValidation.steps.append(trainer.global_step)


class SignalInStep(L.Callback):
    """Sends this process SIGTERM inside training step ``step`` + 1, after its backward pass."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


class SignalWhileWriting(AtomicCheckpointIO):
    """Lightning's checkpoint writer (imagetx's, atomic) that sends this process SIGTERM in the middle
    of writing ``last.ckpt`` at step ``step``: the file's bytes written, not yet renamed into place."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if Path(path).name != "last.ckpt" or checkpoint["global_step"] != self.step:
            return super().save_checkpoint(checkpoint, path, storage_options)

        def write(handle) -> None:
            torch.save(checkpoint, handle)
            signal.raise_signal(signal.SIGTERM)

        atomic_write(path, write)  # as atomic_torch_save writes


def config_with(tmp_path, run_dir, data_root, callbacks=(), name="c.yaml", trainer=None):
    """8 steps, a validation of ``VAL_BATCHES`` batches every 4 (its sanity check's as many), last.ckpt
    only at validations and at the end."""
    settings = {"max_steps": 8, "val_check_interval": 4, "limit_val_batches": VAL_BATCHES,
                "num_sanity_val_steps": VAL_BATCHES, **(trainer or {})}
    return write_train_config(tmp_path / name, run_dir, data_root, model={"dropout": 0.1},
                              data={"val_size": VAL_BATCHES, "eval_batch_size": 1},
                              top={"checkpoint_every_n_steps": 0},
                              callbacks=[{"class_path": f"test_stop_phases.{cls}", "init_args": args}
                                         for cls, args in callbacks], **settings)


def stopped(capsys, config, *more) -> str:
    """Runs ``config``, which a signal stops: exit 143 and one ``stopped:`` line, which it returns."""
    with pytest.raises(SystemExit) as info:
        main(["--config", str(config), "--wandb", "disabled", "--resume", "auto", *more])
    err = capsys.readouterr().err
    assert info.value.code == 143, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("stopped: training preempted (SIGTERM) "), lines[-5:]
    return lines[-1]


def held_step(run_dir: Path) -> int | None:
    last = run_dir / "checkpoints" / "last.ckpt"
    return torch.load(last, weights_only=False)["global_step"] if last.exists() else None


def test_sigterm_in_a_mid_run_validation_ends_it_at_once_and_keeps_the_step_before(tmp_path, data_root, capsys):
    """Before: the validation ran to its end and one more step, then the stop (a recipe's validation on
    a CPU: an hour). Now: no further validation batch; last.ckpt holds step 4 (written before the
    validation); the same command goes on and ends as the uninterrupted run."""
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("SignalInValidation", {"step": 4})])
    last = run_dir / "checkpoints" / "last.ckpt"
    assert stopped(capsys, config) == (f"stopped: training preempted (SIGTERM) in validation after step 4; {last} "
                                       "holds step 4: rerun the same command to go on; evaluate it with: python -m "
                                       f"imagetx.evaluate --ckpt {last} --data.root {data_root} --val_size 3 --split val")
    assert SignalInValidation.begun_after == []
    assert held_step(run_dir) == 4
    plain = config_with(tmp_path, run_dir, data_root, name="plain.yaml")
    assert_goes_on_as_the_whole_run(tmp_path, run_dir, plain, steps=8)


def test_sigterm_in_the_final_validation_ends_it_at_once(tmp_path, data_root, capsys):
    """Before: the validation after the last step (after ``Time limit reached`` or max_steps) ran to
    its end, and the signal was lost: exit 0. Now: at once, 143, last.ckpt holding the last step."""
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("SignalInValidation", {"step": 8})])
    line = stopped(capsys, config)
    assert line.startswith("stopped: training preempted (SIGTERM) in the final validation after step 8; "), line
    assert SignalInValidation.begun_after == []
    assert held_step(run_dir) == 8


def test_sigterm_in_the_sanity_check_ends_it_before_any_step(tmp_path, data_root, capsys):
    """Before: the sanity check ran to its end (the recipe's: 5 minutes on a CPU) and the first step
    after it. Now: no step, no checkpoint, no further batch of the check."""
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("SignalInValidation", {"step": 0, "sanity": True})])
    line = stopped(capsys, config)
    assert line == ("stopped: training preempted (SIGTERM) in the sanity check after step 0, before any checkpoint "
                    "was written: start it again"), line
    assert SignalInValidation.begun_after == []
    assert held_step(run_dir) is None


def test_sigterm_while_last_ckpt_is_written_leaves_it_whole_and_is_answered_after_it(tmp_path, data_root, capsys):
    """The write of the last step's last.ckpt (max_steps) is signalled between its bytes and its
    rename: the write ends (the file whole, at step 8), the final validation after it does not run,
    exit 143. Before: the signal was lost, the validation ran and the run ended with exit 0."""
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("CountValidation", {})],
                         trainer={"plugins": [{"class_path": "test_stop_phases.SignalWhileWriting",
                                               "init_args": {"step": 8}}]})
    line = stopped(capsys, config)
    assert line.startswith("stopped: training preempted (SIGTERM) in the final validation after step 8; "), line
    assert held_step(run_dir) == 8
    assert CountValidation.steps == [4] * VAL_BATCHES  # the validation at step 4, none after the write at 8
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # nothing of the write left beside it


def test_sigterm_in_the_first_step_of_a_run_not_compiled_ends_the_step_and_keeps_it(tmp_path, data_root, capsys):
    """Only a step that compiles ends at once: the first step of an eager run is a step like any other."""
    run_dir = tmp_path / "run"
    config = config_with(tmp_path, run_dir, data_root, [("SignalInStep", {"step": 0})])
    line = stopped(capsys, config)
    assert line.startswith("stopped: training preempted (SIGTERM) after step 1; "), line
    assert held_step(run_dir) == 1


@pytest.mark.parametrize("compile", [True, "layers"])
def test_a_step_compiles_first_in_a_process_and_after_a_growth_and_only_under_compile(compile):
    """Where a signal ends a step at once (``interrupt.compiles``): the network's first step in the
    process, and its first after a growth added layers (traced anew); no step of an eager network."""
    model = ImageTransformerModule(tiny_config(n_layers=1), compile=compile)
    eager = ImageTransformerModule(tiny_config(n_layers=1))
    assert compiles(model, None) and not compiles(model, 1)
    assert not compiles(eager, None) and not compiles(eager, 1)
    model.model.layers.append(copy.deepcopy(model.model.layers[0]))  # what GrowDepth does, in shape
    assert compiles(model, 1) and not compiles(model, 2)


CALLBACKS = '''
from pathlib import Path
import lightning as L

class MarkSteps(L.Callback):
    """Touches FOLDER/step-N when training step N+1 begins: the moment a test signals the run."""
    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        (self.folder / f"step-{trainer.global_step}").touch()
'''


@pytest.mark.slow
def test_sigterm_while_the_first_step_compiles_ends_the_run_without_finishing_it(tmp_path, data_root):
    """A compiled run (torch.compile, Inductor, cold cache) signalled as its first step begins, in its
    compilation: it ends there (before: the compilation and the step ran on, the recipe's 141 s on a
    CPU, then last.ckpt at step 1), saying where."""
    (tmp_path / "stop_callbacks.py").write_text(CALLBACKS)
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "c.yaml", run_dir, data_root, max_steps=4, val_check_interval=100,
                                num_sanity_val_steps=0, top={"checkpoint_every_n_steps": 1},
                                callbacks=[{"class_path": "stop_callbacks.MarkSteps",
                                            "init_args": {"folder": str(tmp_path)}}])
    settings = yaml.safe_load(config.read_text())
    settings["model"]["compile"] = True
    config.write_text(yaml.safe_dump(settings))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": path,
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # cold: a cache would skip the compilation
    process = subprocess.Popen([sys.executable, "-m", "imagetx.train", "--config", str(config), "--wandb",
                                "disabled"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    while not (tmp_path / "step-0").exists() and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 143, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == ("stopped: training preempted (SIGTERM) in a step that compiles the network after step 0, "
                         "before any checkpoint was written: start it again"), lines[-5:]
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
    assert not (tmp_path / "step-1").exists()
