"""The LightningModule (docs/model.md §5 metric, §8 recipe): loss, metrics, logging, optimiser.

The network itself is the plain ``ImageTransformer``; this module owns what
training adds around it. One ``shared_step`` serves train, val and test.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric

from .checkpoint import imagetx_metadata
from .config import ModelConfig
from .data import downsample_area, mix_seed, run_seed
from .model import ImageTransformer
from .schedule import noam, warmup_cosine


class NonFiniteLossError(FloatingPointError):
    """The training loss, the gradients or the weights became NaN or infinite."""


def non_finite_tensors(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors in ``state`` holding a NaN or an infinity (one sync)."""
    names = [name for name, value in state.items() if torch.is_tensor(value) and value.is_floating_point()]
    if not names:
        return []
    finite = torch.stack([torch.isfinite(state[name]).all() for name in names]).cpu()
    return [name for name, ok in zip(names, finite.tolist()) if not ok]


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
    flops_per_batch = None  # read by Lightning's ThroughputMonitor; not counted, so no FLOP/s metrics

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
        compile: bool = False,  # torch.compile the network (opt-in: start-up cost, helps on GPUs)
    ) -> None:
        super().__init__()
        config = config or ModelConfig()
        self.save_hyperparameters(ignore=["config"])
        self.hparams["model_config"] = config.to_dict()  # plain dict: readable in W&B and YAML
        self.model = ImageTransformer(config)
        self.val_bpd, self.test_bpd = MeanMetric(), MeanMetric()
        self.nonfinite_skips = 0
        if compile:
            # In place, so parameter names (and checkpoints) stay those of the plain model.
            self.model.compile()

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

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Dropout of each training step draws from a seed of (seed, epoch, batch, rank): a run
        resumed mid-epoch takes the same steps as one never interrupted, whatever ran in
        between (validations, sample grids, the restart itself)."""
        torch.manual_seed(mix_seed(run_seed(), self.current_epoch, batch_idx, self.global_rank))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        loss = self.shared_step(batch, "train")
        if not torch.isfinite(loss):
            self.skip_nonfinite(f"training loss is {loss.item()}")
            return None  # Lightning skips backward and the optimiser step for a None loss
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """Non-finite gradients (with a finite loss) would turn the weights into NaN: skip such
        a step like a non-finite loss. Under fp16 loss scaling the GradScaler does this itself."""
        if str(self.trainer.precision).startswith("16"):
            return
        grads = {name: p.grad for name, p in self.named_parameters() if p.grad is not None}
        bad = non_finite_tensors(grads)
        if bad:
            self.skip_nonfinite(f"gradients are not finite (e.g. {bad[0]})")
            for p in self.parameters():
                p.grad = None  # the optimiser leaves parameters without gradients untouched

    def skip_nonfinite(self, what: str) -> None:
        """Count one non-finite step; raise NonFiniteLossError past model.max_nonfinite_skips."""
        self.nonfinite_skips += 1
        limit = self.hparams.max_nonfinite_skips
        step = self.global_step + 1  # the optimiser step being taken (a checkpoint at step N is after it)
        where = f"at step {step} (epoch {self.current_epoch})"
        if self.nonfinite_skips > limit:
            if limit:
                why = f"{limit} such steps were skipped already, the limit set by --model.max_nonfinite_skips {limit}"
            else:
                why = "--model.max_nonfinite_skips N would skip up to N such steps"
            raise NonFiniteLossError(f"{what} {where}; training stopped ({why})")
        rank_zero_warn(f"{what} {where}: step skipped ({self.nonfinite_skips} of "
                       f"model.max_nonfinite_skips={limit})")

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
        """Refuses to write weights holding NaN/inf: the last good checkpoint stays in place."""
        bad = non_finite_tensors(checkpoint["state_dict"])
        if bad:
            raise NonFiniteLossError(f"the weights are not finite after step {checkpoint.get('global_step')} "
                                     f"(e.g. {bad[0]}); that checkpoint was not written")
        checkpoint["imagetx"] = imagetx_metadata(self.config)
        checkpoint["imagetx"]["nonfinite_skips"] = self.nonfinite_skips

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite_skips = int(checkpoint.get("imagetx", {}).get("nonfinite_skips", 0))
