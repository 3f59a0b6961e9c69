"""A training step reads nothing back from the device except on logging steps (docs/model.md
§8): no label range check, no loss or gradient finiteness check, no optimiser step count, no
progress-bar value. Every host read a tiny ``imagetx.train`` run makes is counted, per
optimiser step, by patching the Tensor methods that read values (on a GPU each waits for the
device): ``item``, ``tolist``, ``cpu``, ``numpy``, ``bool()``, ``int()``, ``float()``,
``index()`` and ``.to("cpu")`` (``to_cpu``).

A step is counted from the end of its batch's transfer to the device to the start of the next
batch's (module hooks ``on_after_batch_transfer`` / ``on_before_batch_transfer``): its forward,
backward and optimiser step, the callbacks after it and Lightning's logging. The transfer itself
(host to device) is not a read. An epoch here is longer than the run, so no new epoch's data
loader starts inside a step (its sampler reads the host tensors of its permutation).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from helpers import write_cifar_npz, write_train_config
from imagetx.training.module import ImageTransformerModule
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
LOG_EVERY = 5
STEPS = 10


def to_cpu(args, kwargs) -> bool:
    """Whether a ``Tensor.to`` call asks for the CPU by name ("cpu"). On this CPU run the
    training device is the CPU too: the moves torch and Lightning make to a tensor's own device
    (a ``torch.device``: gradient norms, the batch) would be counted, and on a GPU they are moves
    within it, not reads."""
    target = kwargs.get("device", args[0] if args else None)
    return isinstance(target, str) and torch.device(target).type == "cpu"


class HostReads:
    """Counts, per optimiser step, the host reads made while a step is open."""

    def __init__(self, monkeypatch) -> None:
        self.step: int | None = None
        self.reads: dict[int, Counter] = defaultdict(Counter)
        for name in READS:
            self.patch(monkeypatch, name, lambda args, kwargs: True)
        self.patch(monkeypatch, "to", to_cpu)
        reads = self

        def after_transfer(module, batch, dataloader_idx):
            if module.trainer.training:
                reads.step = module.global_step + 1
            return batch

        def before_transfer(module, batch, dataloader_idx):
            reads.step = None
            return batch

        monkeypatch.setattr(ImageTransformerModule, "on_after_batch_transfer", after_transfer, raising=False)
        monkeypatch.setattr(ImageTransformerModule, "on_before_batch_transfer", before_transfer, raising=False)
        original_end = ImageTransformerModule.on_train_end

        def on_train_end(module):
            original_end(module)
            reads.step = None

        monkeypatch.setattr(ImageTransformerModule, "on_train_end", on_train_end)

    def patch(self, monkeypatch, name: str, counts) -> None:
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, **kwargs):
            if self.step is not None and counts(args, kwargs):
                self.reads[self.step][name] += 1
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)


def train(tmp_path, model=None, args=(), **trainer) -> None:
    data = tmp_path / "data"
    write_cifar_npz(data, train_sizes=(12, 12))  # 22 training images: 11 batches of 2, more than the run takes
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data, max_steps=STEPS,
                                model=model or {"num_classes": 10}, log_every_n_steps=LOG_EVERY,
                                val_check_interval=100, gradient_clip_val=1.0, **trainer)
    main(["--config", str(config), "--wandb", "disabled", "--checkpoint_every_n_steps", "0", *args])


CASES = {
    "class-conditional, Adam": ({"num_classes": 10}, (), False),
    "class-conditional, Adam, progress bar": ({"num_classes": 10}, (), True),
    "super-resolution, rotary positions, AdamW": (
        {"superres": {"encoder_layers": 1, "low_res_reading": "cell_add", "cell_remainder_input": True,
                      "exact_box_means": True}, "attention": {"relative_positions": "rotary"}, "norm": "pre"},
        ("--model.optimizer", "adamw_cosine", "--model.lr_horizon", "steps"), False),
}


@pytest.mark.parametrize("case", CASES)
def test_training_steps_read_nothing_from_the_device_between_logging_steps(tmp_path, monkeypatch, case):
    """Labels to check, gradient clipping, Adam or AdamW, the run's callbacks (throughput with
    FLOPs, learning rate, checkpoints) and the progress bar, as the presets have them."""
    model, args, progress_bar = CASES[case]
    reads = HostReads(monkeypatch)
    train(tmp_path, model, args, enable_progress_bar=progress_bar)
    logging_steps = {step for step in range(1, STEPS + 1) if step % LOG_EVERY == 0}
    quiet = {step: dict(reads.reads[step]) for step in range(1, STEPS + 1) if step not in logging_steps}
    assert quiet == {step: {} for step in quiet}
    # Logging steps do read (the logged values, the non-finite counters): the counter sees them.
    assert all(reads.reads[step] for step in logging_steps), dict(reads.reads)


def test_the_count_sees_a_deliberate_read_of_each_kind(tmp_path, monkeypatch):
    """Negative control: reads added to a training step at non-logging steps are counted there."""
    reads = HostReads(monkeypatch)
    original = ImageTransformerModule.training_step
    deliberate = {2: ("item", lambda t: t.item()), 3: ("__bool__", lambda t: bool(t > 0)),
                  4: ("tolist", lambda t: t.tolist()), 6: ("cpu", lambda t: t.cpu()),
                  7: ("to", lambda t: t.to("cpu")), 8: ("__float__", lambda t: float(t))}

    def training_step(module, batch, batch_idx):
        loss = original(module, batch, batch_idx)
        step = module.global_step + 1
        if step in deliberate:
            deliberate[step][1](loss.detach())
        return loss

    monkeypatch.setattr(ImageTransformerModule, "training_step", training_step)
    train(tmp_path)
    counted = {step: dict(reads.reads[step]) for step in range(1, STEPS + 1) if step % LOG_EVERY}
    expected = {step: {} for step in counted}
    expected.update({step: {name: 1} for step, (name, _) in deliberate.items()})
    assert counted == expected
