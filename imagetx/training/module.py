"""The LightningModule (docs/model.md §5 metric, §8 recipe): loss, metrics, logging, optimiser.

The network itself is a plain ``nn.Module`` (``build_model``); this module owns what
training adds around it. One ``shared_step`` serves train and val, scoring each batch with
``batch_bits_per_dim``, as ``imagetx.evaluate`` does.

A training step reads nothing back from the device (docs/model.md §8): the data's values were
checked when the DataModule read them, a non-finite step is skipped on the device
(``nonfinite.py``), and what is logged is read by Lightning every ``log_every_n_steps``.

Lightning's pattern: the plain network in ``self.model``, the steps, optimiser and ``LambdaLR`` here,
``load_from_checkpoint`` working; the hooks written here each say what Lightning's own lacks
(``load_from_checkpoint``: weights-only whatever torch's default; ``configure_gradient_clipping``:
Lightning refuses to clip a fused optimiser's gradients under bf16-mixed).
"""

from __future__ import annotations

import inspect
import pickle
from functools import partial
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric

from ..compat import skip_fused_step_where
from ..errors import UserError
from .budget import Horizon, budget_timer, place_decay, run_budget
from .continuation import TIMER_STATE, continued_moments
from ..io.checkpoint import LIGHTNING_PREFIX, imagetx_metadata, model_config_of, read_checkpoint, refused
from ..io.size import check_fits_memory
from ..io.older import current_names, in_today_order, reordered_projections
from ..model.config import ModelConfig
from ..data.datamodule import ImageDataModule
from ..model.flops import Flops, count_flops
from ..model.attention import FLEX_BLOCK_SIZE
from ..model.scoring import batch_bits_per_dim
from ..model.superres import SuperResolutionTransformer, build_model
from ..model.transformer import AutoregressiveModel, TransformerLayer
from .grow import GROWN, deepen
from .resume_state import check_restored
from .nonfinite import NonFiniteLossError, NonFiniteSteps, gradients_not_finite, non_finite_tensors, step_kind
from .schedule import noam, warmup_then_decay
from ..data.seeding import mix_seed, run_seed


# torch.compile's options for the network. Static shapes: under automatic dynamic shapes the graph
# compiled second (training after a fresh run's sanity validation, validation after a resumed run's
# first steps) takes a symbolic batch size, so a fresh and a resumed run trace different graphs and
# the resumed one misses the graphs a fresh run left in Inductor's cache. Each batch shape compiles
# once; the GPU presets' batch sizes divide their data.
COMPILE_OPTIONS = {"dynamic": False}


class ImageTransformerModule(L.LightningModule):
    def __init__(
        self,
        config: ModelConfig | None = None,
        optimizer: Literal["adam_noam", "adamw_cosine", "adamw_wsd"] = "adam_noam",
        peak_lr: float = 3.5e-3,  # T2T's CIFAR-10 categorical peak; see schedule.py
        warmup_steps: int = 4000,
        # A continuation without Adam's moments warms up again over this many steps (None:
        # warmup_steps). Adam's second moment, with beta2 0.98, averages over ~1/(1-0.98) = 50
        # steps: a re-warm-up of 100 covers it twice, however long the first warm-up was.
        rewarmup_steps: int | None = None,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,  # the paper uses none
        max_nonfinite_skips: int = 0,  # 0 = stop at the first NaN/inf loss or gradient
        # torch.compile the network (opt-in: start-up cost, helps on GPUs): the whole of it (true), or
        # each transformer layer on its own ("layers", regional: one layer's compile serves them all)
        compile: bool | Literal["layers"] = False,
        # each decoder layer's activations recomputed in the backward pass instead of kept: memory
        # for compute (scripts/bench_layers.py measures both), the same numbers
        activation_checkpointing: bool = False,
        # adamw_cosine / adamw_wsd: where the decay ends. budget: when trainer.max_time runs out
        # (measured on this machine, budget.py), or at max_steps if that comes first; steps: at max_steps.
        lr_horizon: Literal["budget", "steps"] = "budget",
        # adamw_wsd (warmup–stable–decay, schedule.py): the share of the run's steps the decay takes.
        # 0.2: 0.06 bits/dim below the cosine at 3,000 steps of quick on the CPU (docs/results.md,
        # "A schedule that can be continued"); the stable phase before it can be continued (continuation.py).
        decay_fraction: float = 0.2,
        # The learning rate of the parts that read the low-resolution input (encoder,
        # cross-attention, cell remainder input), as a fraction of peak_lr's.
        low_res_lr_scale: float = 1.0,
        attention_kernel: Literal["auto", "flex", "sdpa"] = "auto",  # how attention runs; auto: flex on CUDA
        flex_block_size: int = FLEX_BLOCK_SIZE,  # FlexAttention's tiles: 16, 32, 64 or 128
    ) -> None:
        super().__init__()
        model_config = config or ModelConfig()
        # The hyper-parameters (read from the arguments as they are now) hold the config as a
        # plain dict: readable in W&B and YAML (a checkpoint stores it once, on_save_checkpoint).
        config = model_config.to_dict()
        self.save_hyperparameters()
        check_fits_memory(model_config.validate(), "model.config")  # before any of it is built
        self.model = build_model(model_config, attention_kernel, flex_block_size, activation_checkpointing)
        self.val_bpd = MeanMetric()
        self.nonfinite = NonFiniteSteps(max_nonfinite_skips)
        self.step_loss: torch.Tensor | None = None  # this optimiser step's loss, until its update is decided
        self.data_checked = False  # the data's values were checked as it was read (setup)
        self.flops: Flops | None = None  # of one image, on the run's device (on_fit_start)
        self.batch_images = 0  # images in the last batch
        self.horizon: Horizon | None = None  # the decay's; None until fixed (budget.py), then in every checkpoint
        self.first_step = 0  # the step this run's schedule counts from: 0, or where a continuation started
        self.rewarmup: tuple[int, int] | None = None  # (from step, length): continued without optimiser moments
        self.images_seen = 0  # training images of every run in this model's lineage
        self.writing_continuation = False  # set by ContinuationCheckpoint while it saves
        self.stored_budget: dict | None = None  # the budget of the run a resumed checkpoint came from
        self.grown: list[dict] = []  # the record of each growth of this model's lineage (grow.py), in every checkpoint
        compile_network(self.model, compile)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                             **kwargs) -> "ImageTransformerModule":
        """Lightning's ``load_from_checkpoint``, reading the file with torch's weights-only
        unpickler whatever torch's default (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` turns it off):
        a file that needs any object but plain data is refused (CheckpointError) before anything
        in it runs."""
        if kwargs.pop("weights_only", True) is not True:
            raise UserError("ImageTransformerModule.load_from_checkpoint reads checkpoints weights-only: "
                            "drop weights_only (an imagetx checkpoint needs nothing else)")
        if "config" not in kwargs:  # the hyper-parameters hold it as a dict; the module takes a ModelConfig
            kwargs["config"] = model_config_of(read_checkpoint(checkpoint_path, mmap=True))
        try:
            return super().load_from_checkpoint(checkpoint_path, map_location, hparams_file, strict, weights_only=True,
                                                **kwargs)
        except pickle.UnpicklingError as error:
            raise refused(checkpoint_path, error) from error

    def compile_added(self, layers) -> None:
        """Layers added to the network (a growth) compiled as the network's are: each on its own
        under ``compile: layers`` (under ``compile: true`` the compiled network traces them anew)."""
        if self.hparams.compile == "layers":
            for layer in layers:
                compile_network(layer, "layers")

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def rewarmup_length(self) -> int:
        """The steps of a re-warm-up (a continuation without Adam's moments, a growth)."""
        length = self.hparams.rewarmup_steps
        return self.hparams.warmup_steps if length is None else length

    @property
    def decay_fraction(self) -> float | None:
        """Where the decay starts (budget.place_decay): None for the cosine, as early as it may."""
        return self.hparams.decay_fraction if self.hparams.optimizer == "adamw_wsd" else None

    def bits_per_dim(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) bits/dim of every image in the batch."""
        return batch_bits_per_dim(self.model, batch)

    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule
        self.data_checked = isinstance(datamodule, ImageDataModule) and datamodule.values_checked_for(
            self.config.num_classes)

    def on_fit_start(self) -> None:
        self.flops = count_flops(self.model, self.device)

    def on_train_start(self) -> None:
        """The next update's learning rate from this run's schedule. A resumed optimiser holds the
        rate its checkpoint's schedule set for that update, which a continuation (or a new budget)
        replaces; resuming the same run sets the same value again."""
        scheduler = self.lr_schedulers()
        if scheduler is None:
            return
        for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * self.lr_multiplier(self.global_step)

    @property
    def flops_per_batch(self) -> int | None:
        """FLOPs of the last batch (Lightning's ThroughputMonitor reads it after every batch, for
        FLOP/s and MFU): a training step's in training, a forward pass's in validation."""
        if self.flops is None:
            return None
        return self.batch_images * (self.flops.training if self.training else self.flops.forward)

    def shared_step(self, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        self.batch_images = batch["images"].shape[0]
        # Data checked as it was read: the model checks shapes and dtypes only, reading nothing back.
        bpd = batch_bits_per_dim(self.model, batch, check=not self.data_checked)
        batch_size = bpd.shape[0]
        if split == "train":
            loss = bpd.mean()
            # Not on the progress bar: Lightning would read it back from the device at every step.
            self.log("train/bpd", loss, batch_size=batch_size)
            return loss
        # MeanMetric sums and counts images (across ranks too): the mean over every image.
        self.val_bpd.update(bpd)
        self.log("val/bpd", self.val_bpd, prog_bar=True, on_step=False, on_epoch=True, batch_size=batch_size)
        return bpd.mean()

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Dropout of each training batch draws from a seed of (seed, optimiser step, batch of the
        epoch, rank): a run resumed mid-epoch takes the same steps as one never interrupted,
        whatever ran in between (validations, sample grids, the restart itself). The step, not
        Lightning's epoch count, which a run resumed mid-epoch from LitData's loader counts one
        ahead (data/streaming.py); the batch tells apart the batches of one accumulated step."""
        torch.manual_seed(mix_seed(run_seed(), self.global_step, batch_idx, self.global_rank))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.shared_step(batch, "train")
        self.images_seen += self.batch_images * self.trainer.world_size
        # Kept for on_before_optimizer_step: the first non-finite loss of the step's batches, or the last.
        step_loss = loss.detach()
        if self.step_loss is not None:
            step_loss = torch.where(torch.isfinite(self.step_loss), step_loss, self.step_loss)
        self.step_loss = step_loss
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip by the global norm here, before the fused optimiser steps. Lightning refuses to clip
        for an optimiser that unscales gradients itself (the fused Adam) under mixed precision,
        because under fp16 the gradients would still be scaled; under bf16 and fp32 no scaler
        exists and they are the true gradients. fp16 keeps Lightning's own check."""
        if gradient_clip_val is None or str(self.trainer.precision).startswith("16"):
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if gradient_clip_algorithm not in (None, "norm"):
            raise UserError(f"--trainer.gradient_clip_algorithm {gradient_clip_algorithm}: imagetx clips by the "
                            "global norm only (norm)")
        torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Decide on the device whether this step's update is applied: not when its loss or its
        gradients hold a NaN or an infinity, which would make the weights NaN. The fused optimiser
        skips the update where ``found_inf`` is set; the step is noted, to be read at the next
        logging step or checkpoint (``read_nonfinite``). Under fp16 loss scaling the GradScaler
        sets ``found_inf`` itself; a non-finite loss is still noted."""
        loss, self.step_loss = self.step_loss, None
        found = ~torch.isfinite(loss)
        scaled = str(self.trainer.precision).startswith("16")
        if not scaled:
            found |= gradients_not_finite(self.parameters())
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Every process skips the same steps: the loss is each process's own.
            found = found.int()
            torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX)
            found = found.bool()
        if not scaled:  # GradScaler's protocol with fused optimisers: no public call skips an update on the device
            skip_fused_step_where(optimizer, found)
        self.nonfinite.note(found, self.global_step + 1, step_kind(loss))

    def read_nonfinite(self) -> None:
        """Read the non-finite steps noted since the last read (one host read): raise
        NonFiniteLossError past model.max_nonfinite_skips, else warn about the skipped ones."""
        warning = self.nonfinite.read()
        if warning:
            rank_zero_warn(warning)

    def on_train_batch_end(self, outputs, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        every = self.trainer.log_every_n_steps
        if every and self.global_step % every == 0:  # Lightning's logging steps, which read the device too
            self.read_nonfinite()

    def on_train_end(self) -> None:
        self.read_nonfinite()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.shared_step(batch, "val")

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = make_optimizer(self.model, **optimizer_settings(hp))
        if hp.optimizer == "adam_noam":
            schedule = partial(noam, warmup_steps=hp.warmup_steps)
        else:
            if self.stored_budget not in (None, run_budget(self.trainer)):  # resumed with a new budget
                self.horizon = None
            if self.horizon is None and (hp.lr_horizon == "steps" or budget_timer(self.trainer) is None):
                end = max(int(self.trainer.estimated_stepping_batches), self.first_step + 1)
                self.horizon = place_decay(end, self.first_step + 1, hp.warmup_steps, self.first_step,
                                           self.decay_fraction)
            decay = "cosine" if hp.optimizer == "adamw_cosine" else "wsd"
            # Read at every step: a budget horizon is fixed after the first validation (BudgetHorizon).
            schedule = lambda step: warmup_then_decay(step, hp.warmup_steps, self.horizon, decay,  # noqa: E731
                                                      self.rewarmup)
        # LambdaLR calls the schedule with the number of steps taken so far; +1 so the
        # first update uses step 1 of the schedule.
        self.lr_multiplier = lambda step: schedule(step + 1)  # noqa: E731
        scheduler = LambdaLR(optimizer, self.lr_multiplier)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Refuses to write weights holding NaN/inf, or after more non-finite steps than allowed:
        the last good checkpoint stays in place."""
        self.read_nonfinite()
        bad = non_finite_tensors(checkpoint["state_dict"])
        if bad:
            raise NonFiniteLossError(f"the weights are not finite after step {checkpoint.get('global_step')} "
                                     f"(e.g. {bad[0]}); that checkpoint was not written")
        # The model's configuration is stored once, in the "imagetx" entry that loading reads
        # without Lightning (load_from_checkpoint passes it back as ``config``); the logs keep it
        # among the hyper-parameters. Lightning stored a copy of those: the module's own are untouched.
        checkpoint.get("hyper_parameters", {}).pop("config", None)
        checkpoint["imagetx"] = imagetx_metadata(self.config)
        checkpoint["imagetx"]["nonfinite_skips"] = self.nonfinite.skipped
        checkpoint["imagetx"]["lr_horizon"] = None if self.horizon is None else self.horizon.to_dict()
        checkpoint["imagetx"]["first_step"] = self.first_step
        checkpoint["imagetx"]["rewarmup"] = None if self.rewarmup is None else list(self.rewarmup)
        checkpoint["imagetx"]["images_seen"] = self.images_seen
        checkpoint["imagetx"]["budget"] = run_budget(self.trainer)
        checkpoint["imagetx"]["continuation"] = self.writing_continuation
        if self.grown:
            checkpoint["imagetx"][GROWN] = self.grown

    def current_layout(self, checkpoint: dict) -> None:
        """The checkpoint's weights under today's names and layouts (``io.older``), and Adam's
        moments of the fused projections it stored in the older order reordered with them."""
        reordered = reordered_projections(checkpoint["state_dict"], self.model, LIGHTNING_PREFIX)
        checkpoint["state_dict"] = current_names(checkpoint["state_dict"], self.model, LIGHTNING_PREFIX)
        if not reordered:
            return
        # The optimiser's state is by parameter index, in the parameter groups' order (their rates unread).
        names = {id(parameter): LIGHTNING_PREFIX + name for name, parameter in self.model.named_parameters()}
        order = [names[id(parameter)] for group in parameter_groups(self.model, 1.0, 1.0)
                 for parameter in group["params"]]
        for optimizer in checkpoint.get("optimizer_states", []):
            for index, state in optimizer.get("state", {}).items():
                name = order[index] if isinstance(index, int) and 0 <= index < len(order) else None
                if name in reordered:
                    shape = checkpoint["state_dict"][name].shape
                    for key, value in state.items():
                        if isinstance(value, torch.Tensor) and value.shape == shape:  # a moment, not the step
                            state[key] = in_today_order(value, *reordered[name])

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """The run goes on where the checkpoint stood. A continuation checkpoint (written just
        before a warmup–stable–decay run's decay, continuation.py) starts a new run at the peak:
        its own schedule over its own budget, the time budget counted afresh. A checkpoint taken
        before the decay, resumed with another budget (resume.py refuses one taken later), gets a
        horizon fitted to the new budget. A checkpoint of this model grown deeper (grow.py; resume.py
        has checked that only the depth differs) deepens this one first, its tensors then loaded.
        Older names and layouts are read as today's (``current_layout``), and a resumed checkpoint's
        tensors that would not fit are refused in one line (``resume_state.check_restored``)."""
        stored = checkpoint.get("imagetx", {})
        self.grown = list(stored.get(GROWN, []))
        layers = model_config_of(checkpoint).n_layers
        if self.grown and layers > self.config.n_layers:
            kept = len(self.model.layers)
            deepen(self.model, layers, seed=self.grown[-1]["seed"])
            self.compile_added(self.model.layers[kept:])
            self.hparams["config"] = self.config.to_dict()
        self.current_layout(checkpoint)
        if "optimizer_states" in checkpoint and self._trainer is not None:  # a resume (not load_from_checkpoint)
            check_restored(self._trainer.ckpt_path, checkpoint, self,
                           [group["params"] for group in parameter_groups(self.model, 1.0, 1.0)])
        self.nonfinite.skipped = int(stored.get("nonfinite_skips", 0))
        self.images_seen = int(stored.get("images_seen", 0))
        self.first_step = int(stored.get("first_step", 0))
        if stored.get("rewarmup") is not None:
            self.rewarmup = tuple(stored["rewarmup"])
        horizon = stored.get("lr_horizon")
        self.horizon = None if horizon is None else Horizon(**horizon)
        if stored.get("continuation"):
            self.horizon, self.first_step = None, int(checkpoint["global_step"])
            checkpoint.get("callbacks", {}).pop(TIMER_STATE, None)  # max_time is this run's own
            if not continued_moments(checkpoint):  # Adam starts afresh: warm up again
                self.rewarmup = (self.first_step, self.rewarmup_length)
        self.stored_budget = None if stored.get("continuation") else stored.get("budget")


# The optimiser settings of ImageTransformerModule (and of a preset's ``model`` section).
OPTIMIZER_SETTINGS = ("optimizer", "peak_lr", "betas", "eps", "weight_decay", "low_res_lr_scale")


def optimizer_settings(hyper_parameters: dict) -> dict:
    """The ``OPTIMIZER_SETTINGS`` of ``hyper_parameters`` (a module's, or a preset's ``model``
    section), ImageTransformerModule's defaults for those it leaves out."""
    defaults = inspect.signature(ImageTransformerModule).parameters
    return {key: hyper_parameters.get(key, defaults[key].default) for key in OPTIMIZER_SETTINGS}


def compile_network(model: torch.nn.Module, mode: bool | str) -> None:
    """``torch.compile`` the network in place, so that parameter names (and checkpoints) stay the
    plain network's: the whole of it (``True``), or each transformer layer on its own (``"layers"``,
    regional compilation: the layers differ in their tensors only, which torch takes as the graph's
    inputs, so one layer's graph serves every layer and the compilation costs about one layer's);
    nothing for ``False``."""
    if mode == "layers":
        for module in model.modules():
            if isinstance(module, TransformerLayer):
                module.compile(**COMPILE_OPTIONS)
    elif mode:
        model.compile(**COMPILE_OPTIONS)


def parameter_groups(model: AutoregressiveModel, peak_lr: float, low_res_lr_scale: float) -> list[dict]:
    """The optimiser's parameter groups: the parts that read the low-resolution input at
    ``low_res_lr_scale`` times the peak learning rate, the rest at the peak."""
    parts = model.low_res_modules() if isinstance(model, SuperResolutionTransformer) else []
    low_res = [p for module in parts for p in module.parameters()]  # in the modules' order
    reads_low_res = {id(p) for p in low_res}
    groups = [{"params": [p for p in model.parameters() if id(p) not in reads_low_res], "lr": peak_lr},
              {"params": low_res, "lr": peak_lr * low_res_lr_scale}]
    return [group for group in groups if group["params"]]


def make_optimizer(model: AutoregressiveModel, optimizer: str, peak_lr: float, betas: tuple[float, float], eps: float,
                   weight_decay: float, low_res_lr_scale: float) -> torch.optim.Optimizer:
    """Training's optimiser over ``model`` at the peak learning rate (the schedule scales it):
    Adam for ``adam_noam``, AdamW for the others. The settings come from ``optimizer_settings``:
    the module's, or a preset's for benchmarks.

    fused: one kernel per update, no host read of the step count (the default single-tensor
    path reads it per parameter on the CPU), and the update skipped on the device where
    ``on_before_optimizer_step`` sets ``found_inf``."""
    kind = torch.optim.Adam if optimizer == "adam_noam" else torch.optim.AdamW
    return kind(parameter_groups(model, peak_lr, low_res_lr_scale), betas=tuple(betas), eps=eps,
                weight_decay=weight_decay, fused=True)
