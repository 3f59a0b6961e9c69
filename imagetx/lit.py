"""The LightningModule (SPEC §5 metric, §8 recipe): loss, metrics, logging, optimiser.

The network itself is the plain ``ImageTransformer``; this module owns what
training adds around it. One ``shared_step`` serves train, val and test.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import lightning as L
import torch
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric

from .checkpoint import imagetx_metadata
from .config import ModelConfig
from .data import downsample_area
from .model import ImageTransformer
from .schedule import noam, warmup_cosine


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite."""


def model_inputs(config: ModelConfig, batch: dict[str, torch.Tensor]):
    """(images, labels or None, low_res or None) for a batch from the DataModule.

    Super-resolution pairs are formed here from the 32×32 target itself, so the
    low-resolution input always matches the model's ``low_res_size``.
    """
    images = batch["images"]
    labels = batch["labels"] if config.num_classes else None
    low_res = downsample_area(images, config.low_res_size) if config.encoder_layers else None
    return images, labels, low_res


class ImageTransformerModule(L.LightningModule):
    def __init__(
        self,
        config: ModelConfig | None = None,
        optimizer: Literal["adam_noam", "adamw_cosine"] = "adam_noam",
        peak_lr: float = 3.5e-3,  # T2T's CIFAR-10 categorical peak; see schedule.py
        warmup_steps: int = 4000,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,  # the paper uses none
        max_nonfinite_skips: int = 0,  # 0 = stop at the first NaN/inf loss
    ) -> None:
        super().__init__()
        config = config or ModelConfig()
        self.save_hyperparameters(ignore=["config"])
        self.hparams["model_config"] = config.to_dict()  # plain dict: readable in W&B and YAML
        self.model = ImageTransformer(config)
        self.val_bpd, self.test_bpd = MeanMetric(), MeanMetric()
        self.nonfinite_skips = 0

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def bits_per_dim(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) bits/dim of every image in the batch."""
        return self.model.bits_per_dim(*model_inputs(self.config, batch))

    def shared_step(self, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        bpd = self.bits_per_dim(batch)
        batch_size = bpd.shape[0]
        if split == "train":
            loss = bpd.mean()
            self.log("train/bpd", loss, prog_bar=True, batch_size=batch_size)
            return loss
        # MeanMetric sums and counts images (across ranks too): the mean over every image.
        metric = self.val_bpd if split == "val" else self.test_bpd
        metric.update(bpd)
        self.log(f"{split}/bpd", metric, prog_bar=True, on_step=False, on_epoch=True, batch_size=batch_size)
        return bpd.mean()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        loss = self.shared_step(batch, "train")
        if not torch.isfinite(loss):
            self.nonfinite_skips += 1
            if self.nonfinite_skips > self.hparams.max_nonfinite_skips:
                raise NonFiniteLossError(
                    f"training loss is {loss.item()} at step {self.global_step} "
                    f"(after {self.nonfinite_skips - 1} skipped non-finite steps; limit "
                    f"model.max_nonfinite_skips={self.hparams.max_nonfinite_skips})")
            return None  # Lightning skips the optimiser step for a None loss
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.shared_step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.shared_step(batch, "test")

    def configure_optimizers(self):
        hp = self.hparams
        if hp.optimizer == "adam_noam":
            optimizer = torch.optim.Adam(self.parameters(), lr=hp.peak_lr, betas=hp.betas, eps=hp.eps,
                                         weight_decay=hp.weight_decay)
            schedule = partial(noam, warmup_steps=hp.warmup_steps)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=hp.peak_lr, betas=hp.betas, eps=hp.eps,
                                          weight_decay=hp.weight_decay)
            total = max(int(self.trainer.estimated_stepping_batches), 1)
            schedule = partial(warmup_cosine, warmup_steps=hp.warmup_steps, total_steps=total)
        # LambdaLR calls the schedule with the number of steps taken so far; +1 so the
        # first update uses step 1 of the schedule.
        scheduler = LambdaLR(optimizer, lambda step: schedule(step + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["imagetx"] = imagetx_metadata(self.config)
