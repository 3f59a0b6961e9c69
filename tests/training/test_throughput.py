"""FLOP/s and MFU in the run's metrics: the module's FLOPs per batch (imagetx/model/flops.py) through
Lightning's ThroughputMonitor, and the device peaks of imagetx/training/throughput.py where Lightning has
none (the H200)."""

from __future__ import annotations

import csv

import pytest
import torch
from lightning.fabric.utilities.throughput import get_available_flops

import imagetx.training.throughput as throughput
from helpers import TINY_TRAIN_MODEL, write_cifar_npz, write_train_config
from imagetx import build_model, ModelConfig
from imagetx.model.flops import count_flops
from imagetx.train import main

pytestmark = pytest.mark.usefixtures("no_cifar_download", "clean_wandb_env")


@pytest.mark.parametrize("name, dtype, peak", [
    ("NVIDIA H200", torch.bfloat16, 989.4e12),
    ("NVIDIA H200 NVL", torch.bfloat16, 835.5e12),
    ("NVIDIA H200", "tf32", 494.7e12),
    ("NVIDIA H100 80GB HBM3", torch.float16, 989.4e12),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, None),  # not in imagetx's table: Lightning's has it
    ("NVIDIA H200", torch.float64, None),
])
def test_table_peaks_by_device_name(monkeypatch, name, dtype, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert throughput.table_peak(torch.device("cuda", 0), dtype) == peak
    assert throughput.table_peak(torch.device("cpu"), dtype) is None


def test_lightning_has_no_peak_for_an_h200_and_the_h100_peaks_agree(monkeypatch):
    """Why the table exists, and that it agrees with Lightning where both know the device."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    with pytest.warns(UserWarning, match="FLOPs not found"):
        assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) == throughput.table_peak(
        torch.device("cuda", 0), torch.bfloat16)


def test_compute_dtype_of_each_precision(monkeypatch):
    assert throughput.compute_dtype("bf16-mixed") is torch.bfloat16
    assert throughput.compute_dtype("16-mixed") is torch.float16
    assert throughput.compute_dtype("64-true") is torch.float64
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert throughput.compute_dtype("32-true") is torch.float32
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert throughput.compute_dtype("32-true") == "tf32"


def test_lightnings_peak_wins_where_it_has_one():
    monitor = throughput.ThroughputWithPeak(batch_size_fn=len)
    monitor.fallback_peak = 2e15
    assert monitor.available_flops == 2e15  # Lightning found none (None, set in __init__)
    monitor.available_flops = 1e15  # what ThroughputMonitor.setup does with Lightning's peak
    assert monitor.available_flops == 1e15


def test_training_logs_flops_per_second_and_mfu_against_the_peak(tmp_path, monkeypatch):
    """A CPU run given a peak of 1 TFLOP/s (Lightning knows none for a CPU): per image, the logged
    FLOP/s are the model's training FLOPs; MFU is FLOP/s over the peak."""
    peak = 1e12
    monkeypatch.setattr(throughput, "table_peak", lambda device, dtype: peak)
    data = tmp_path / "data"
    write_cifar_npz(data, train_sizes=(12, 12))  # 11 batches of 2 per epoch: one size throughout
    config = write_train_config(tmp_path / "c.yaml", tmp_path / "run", data, max_steps=10, log_every_n_steps=10,
                                val_check_interval=100)
    main(["--config", str(config), "--wandb", "disabled"])
    rows = []
    for path in (tmp_path / "run").glob("csv/version_*/metrics.csv"):
        with path.open() as handle:
            rows += [row for row in csv.DictReader(handle) if row.get("train/device/mfu")]
    assert len(rows) == 1  # at step 10: the monitor's window (10 batches) is full
    row = rows[0]
    flops_per_sec, images_per_sec = float(row["train/device/flops_per_sec"]), float(row["train/device/samples_per_sec"])
    per_image = count_flops(build_model(ModelConfig(**TINY_TRAIN_MODEL))).training
    assert flops_per_sec / images_per_sec == pytest.approx(per_image, rel=1e-9)
    assert float(row["train/device/mfu"]) == pytest.approx(flops_per_sec / peak, rel=1e-9)


@pytest.mark.parametrize("world_size", [1, 2])
def test_with_several_processes_the_images_of_all_are_counted_beside_one_processs(monkeypatch, world_size):
    """``train/samples`` is Lightning's count of one process's images; with several processes
    ``train/total_samples`` counts all of theirs (each takes batches of the same size), beside
    Lightning's ``train/samples_per_sec``, the images/s of all. (Lightning's setup, which builds
    the meters, is stubbed: it needs a running Trainer; tests/training/test_ddp.py runs two processes.)"""
    from types import SimpleNamespace

    from lightning.fabric.utilities.throughput import Throughput

    monitor = throughput.ThroughputWithPeak(batch_size_fn=len, window_size=2)
    trainer = SimpleNamespace(world_size=world_size, strategy=SimpleNamespace(root_device=torch.device("cpu")),
                              precision="32-true")
    monkeypatch.setattr(throughput.ThroughputMonitor, "setup", lambda self, trainer, module, stage: (
        self._throughputs.update(train=Throughput(world_size=trainer.world_size, **self.kwargs))))
    monitor.setup(trainer, None, "fit")
    meter = monitor._throughputs["train"]
    for step in (1, 2):
        meter.update(time=float(step), batches=step, samples=8 * step)
    metrics = meter.compute()
    assert metrics["samples"] == 16
    if world_size == 1:
        assert "total_samples" not in metrics and "samples_per_sec" not in metrics
    else:
        assert metrics["total_samples"] == 32 and metrics["samples_per_sec"] == 16.0


@pytest.mark.parametrize("device, step, logged", [("cuda", 10, True), ("cuda", 11, False), ("cpu", 10, False)])
def test_peak_memory_is_logged_on_cuda_logging_steps_only(monkeypatch, device, step, logged):
    """On CUDA each logging step (every ``log_every_n_steps``) logs the allocator's high-water mark
    in GiB; other steps and a CPU run log none. (ThroughputMonitor's own bookkeeping is stubbed: it
    needs a running Trainer.)"""
    monkeypatch.setattr(throughput.ThroughputMonitor, "on_train_batch_end", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    logs = []

    class Logger:
        def log_metrics(self, metrics, step):
            logs.append((metrics, step))

    class Trainer:
        class strategy:
            root_device = torch.device(device)

        global_step, log_every_n_steps, loggers = step, 5, [Logger()]

    throughput.ThroughputWithPeak(batch_size_fn=len).on_train_batch_end(Trainer(), None, None, None, 0)
    assert logs == ([({"train/device/peak_memory_gib": 3.0}, step)] if logged else [])
