"""Training callbacks: throughput, sample grids, and atomic checkpoint files.

* ``TrainingSpeed`` logs images/s (and positions/s) of the optimisation steps.
* ``SampleGrid`` draws images with the cached sampler every N steps, writes a PNG
  into the run directory and, when a W&B logger is active, logs the grid there.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from .images import save_grid
from .sampler import sample


class TrainingSpeed(L.Callback):
    """Logs ``train/images_per_sec`` over the last ``window`` steps (data loading included)."""

    def __init__(self, window: int = 10) -> None:
        self.window = window
        self._start: float | None = None
        self._images = 0
        self._steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None:
            self._start, self._images, self._steps = time.perf_counter(), 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._images += batch["images"].shape[0]
        self._steps += 1
        if self._steps >= self.window:
            seconds = time.perf_counter() - self._start
            images_per_sec = self._images * trainer.world_size / seconds
            pl_module.log("train/images_per_sec", images_per_sec, rank_zero_only=True)
            pl_module.log("train/positions_per_sec", images_per_sec * pl_module.model.order.length,
                          rank_zero_only=True)
            self._start = None


class SampleGrid(L.Callback):
    """Every ``every_n_steps``: sample ``count`` images, save ``samples/step_XXXXXXX.png``, log to W&B."""

    def __init__(self, every_n_steps: int = 1000, count: int = 8, temperature: float = 1.0,
                 seed: int = 0, at_end: bool = True) -> None:
        self.every_n_steps, self.count, self.temperature, self.seed = every_n_steps, count, temperature, seed
        self.at_end = at_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every_n_steps > 0 and step > 0 and step % self.every_n_steps == 0:
            self.draw(trainer, pl_module, batch)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.at_end and trainer.global_step > 0:
            self.draw(trainer, pl_module, None)

    @rank_zero_only
    def draw(self, trainer, pl_module, batch) -> None:
        model = pl_module.model
        cfg = model.config
        device = pl_module.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        labels = torch.arange(self.count, device=device) % cfg.num_classes if cfg.num_classes else None
        low_res = None
        if cfg.encoder_layers:
            if batch is None:
                return  # super-resolution grids need inputs; the last batch is gone at train end
            from .data import downsample_area

            low_res = downsample_area(batch["images"][: self.count], cfg.low_res_size)
        count = self.count if low_res is None else low_res.shape[0]
        images = sample(model, count, labels, low_res, self.temperature, generator=generator)
        directory = Path(trainer.default_root_dir) / "samples"
        path = save_grid([images], directory / f"step_{trainer.global_step:07d}.png")
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="samples", images=[str(path)], step=trainer.global_step)
