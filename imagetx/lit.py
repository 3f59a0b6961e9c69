"""The LightningModule (docs/model.md §5 metric, §8 recipe): loss, metrics, logging, optimiser.

The network itself is the plain ``ImageTransformer``; this module owns what
training adds around it. One ``shared_step`` serves train and val, scoring each batch with
``batch_bits_per_dim``, as ``imagetx.evaluate`` does.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric

from .budget import Horizon, budget_timer
from .checkpoint import imagetx_metadata
from .config import ModelConfig
from .data import downsample_area
from .model import ImageTransformer
from .schedule import noam, warmup_cosine
from .seeding import mix_seed, run_seed


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


def batch_bits_per_dim(model: ImageTransformer, batch: dict[str, torch.Tensor], given_rows: int = 0) -> torch.Tensor:
    """(B,) bits/dim of every image of a batch from the DataModule: of the whole image, or of
    the part below its first ``given_rows`` rows given them (``ImageTransformer.bits_per_dim``)."""
    return model.bits_per_dim(*model_inputs(model.config, batch), given_rows=given_rows)


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
        # adamw_cosine: where the cosine ends. budget: when trainer.max_time runs out (measured
        # on this machine, budget.py), or at max_steps if that comes first; steps: at max_steps.
        lr_horizon: Literal["budget", "steps"] = "budget",
    ) -> None:
        super().__init__()
        # The hyper-parameters (read from the arguments as they are now) hold the config as a
        # plain dict: readable in W&B and YAML, loadable with torch.load(weights_only=True), and
        # passed back as it is by load_from_checkpoint.
        if not isinstance(config, dict):
            config = (config or ModelConfig()).to_dict()
        self.save_hyperparameters()
        self.model = ImageTransformer(ModelConfig.from_dict(config))
        self.val_bpd = MeanMetric()
        self.nonfinite_skips = 0
        self.horizon: Horizon | None = None  # the cosine's; None until fixed (budget.py), then in every checkpoint
        if compile:
            # In place, so parameter names (and checkpoints) stay those of the plain model.
            self.model.compile()

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def bits_per_dim(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) bits/dim of every image in the batch."""
        return batch_bits_per_dim(self.model, batch)

    def shared_step(self, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        bpd = self.bits_per_dim(batch)
        batch_size = bpd.shape[0]
        if split == "train":
            loss = bpd.mean()
            self.log("train/bpd", loss, prog_bar=True, batch_size=batch_size)
            return loss
        # MeanMetric sums and counts images (across ranks too): the mean over every image.
        self.val_bpd.update(bpd)
        self.log("val/bpd", self.val_bpd, prog_bar=True, on_step=False, on_epoch=True, batch_size=batch_size)
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

    def configure_optimizers(self):
        hp = self.hparams
        if hp.optimizer == "adam_noam":
            optimizer = torch.optim.Adam(self.parameters(), lr=hp.peak_lr, betas=hp.betas, eps=hp.eps,
                                         weight_decay=hp.weight_decay)
            schedule = partial(noam, warmup_steps=hp.warmup_steps)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=hp.peak_lr, betas=hp.betas, eps=hp.eps,
                                          weight_decay=hp.weight_decay)
            if self.horizon is None and (hp.lr_horizon == "steps" or budget_timer(self.trainer) is None):
                self.horizon = Horizon(hp.warmup_steps, max(int(self.trainer.estimated_stepping_batches), 1))
            # Read at every step: a budget horizon is fixed after the first validation (BudgetHorizon).
            schedule = lambda step: warmup_cosine(step, hp.warmup_steps, self.horizon)  # noqa: E731
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
        checkpoint["imagetx"]["lr_horizon"] = None if self.horizon is None else self.horizon.to_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        stored = checkpoint.get("imagetx", {})
        self.nonfinite_skips = int(stored.get("nonfinite_skips", 0))
        horizon = stored.get("lr_horizon")
        self.horizon = None if horizon is None else Horizon(**horizon)
