"""Throughput, FLOP/s and MFU of a training run (docs/model.md §8, "FLOPs and MFU").

Lightning's ThroughputMonitor logs them (``train/device/flops_per_sec``, ``train/device/mfu``)
from the module's ``flops_per_batch`` (``ImageTransformerModule``, counted by ``imagetx/model/flops.py``)
and the device's peak FLOP/s, which it looks up by the name torch gives the device
(``lightning.fabric.utilities.throughput.get_available_flops``). Its table misses some devices:
an H200 is "NVIDIA H200" to torch, which its table does not parse (it warns "FLOPs not found"),
so no MFU would be logged. ``ThroughputWithPeak`` then takes the peak from ``DENSE_PEAK_FLOPS``.
On CUDA it also logs the allocator's peak (``train/device/peak_memory_gib``) on logging steps.
With several processes (DDP), ``train/samples`` is Lightning's count of one process's images:
``train/total_samples`` counts all of theirs beside it (``AllProcesses``), as Lightning's
``train/samples_per_sec`` gives the images/s of all.

Kept, as a subclass of Lightning's ThroughputMonitor: Lightning's peak table knows no "NVIDIA H200", so
no MFU would be logged there (docs/model.md §8); the allocator's peak is one column where Lightning's
DeviceStatsMonitor logs every memory statistic; ``compute_dtype`` as Lightning's own is private;
Lightning counts the images of all processes only per second, not in total.
"""

from __future__ import annotations

import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import ThroughputMonitor

from ..compat import replace_throughput_meters

# Dense peaks (no 2:4 structured sparsity), FLOP/s, by compute dtype ("tf32": float32 matmuls
# on tensor cores). NVIDIA's datasheets give the tensor-core figures "with sparsity", twice the
# dense ones, which are halved here; FP32 (no tensor cores) as given.
#   H200 SXM and H100 SXM (the same compute): https://www.nvidia.com/en-us/data-center/h200/ and
#   https://www.nvidia.com/en-us/data-center/h100/ — BF16/FP16 1,979 TFLOPS, TF32 989, FP32 67.
#   H200 NVL: https://www.nvidia.com/en-us/data-center/h200/ — BF16/FP16 1,671, TF32 835, FP32 60.
# Matched in this order against the lower-cased device name.
HOPPER_SXM = {torch.bfloat16: 989.4e12, torch.float16: 989.4e12, "tf32": 494.7e12, torch.float32: 66.9e12}
DENSE_PEAK_FLOPS: dict[str, dict[torch.dtype | str, float]] = {
    "h200 nvl": {torch.bfloat16: 835.5e12, torch.float16: 835.5e12, "tf32": 417.5e12, torch.float32: 60e12},
    "h200": HOPPER_SXM,
    "h100": HOPPER_SXM,
}


def compute_dtype(precision: str) -> torch.dtype | str:
    """The dtype matrix products run in under a Trainer's ``precision`` ("bf16-mixed", "32-true",
    ...): float32 is "tf32" where torch lets matmuls use tensor cores (as Lightning decides)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    return "tf32" if torch.get_float32_matmul_precision() != "highest" else torch.float32


def table_peak(device: torch.device, dtype: torch.dtype | str) -> float | None:
    """The peak FLOP/s of ``DENSE_PEAK_FLOPS`` for a CUDA device, or None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    for chip, peaks in DENSE_PEAK_FLOPS.items():
        if chip in name:
            return peaks.get(dtype)
    return None


class AllProcesses(Throughput):
    """Lightning's Throughput, with ``total_samples`` beside ``samples`` (one process's images) when
    there are several processes: ``samples`` × their number, as each takes batches of the same size
    (the training order pads its last one: data/datamodule.py, ``TrainOrder``)."""

    def compute(self) -> dict[str, int | float]:
        metrics = super().compute()
        if self.world_size > 1:
            metrics["total_samples"] = metrics["samples"] * self.world_size
        return metrics


class ThroughputWithPeak(ThroughputMonitor):
    """Lightning's ThroughputMonitor, with ``table_peak`` for a device Lightning knows no peak of.

    ThroughputMonitor's ``setup`` sets its public ``available_flops`` from Lightning's table and
    gives it to its meters; here that attribute falls back to ``table_peak`` where Lightning's
    is None."""

    fallback_peak: float | None = None  # table_peak of the run's device, set in setup

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.fallback_peak = table_peak(trainer.strategy.root_device, compute_dtype(str(trainer.precision)))
        super().setup(trainer, pl_module, stage)
        # the meters Lightning's setup has just built, as AllProcesses
        replace_throughput_meters(self, lambda: AllProcesses(available_flops=self.available_flops,
                                                             world_size=trainer.world_size, **self.kwargs))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        device = trainer.strategy.root_device
        if device.type == "cuda" and trainer.global_step % trainer.log_every_n_steps == 0:
            # The allocator's high-water mark since the start: a host-side counter. Straight to the
            # loggers as a float: ``pl_module.log`` would copy it to the device, and wait for the
            # device, on every step.
            peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
            for logger in trainer.loggers:
                logger.log_metrics({"train/device/peak_memory_gib": peak_gib}, step=trainer.global_step)

    @property
    def available_flops(self) -> float | None:
        return self.fallback_peak if self.lightning_peak is None else self.lightning_peak

    @available_flops.setter
    def available_flops(self, value: float | None) -> None:
        self.lightning_peak = value
