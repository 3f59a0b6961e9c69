"""Data-parallel training on two CPU processes (DDP over gloo) through the real command.

``python -m imagetx.train ... --trainer.accelerator cpu --trainer.devices 2 --trainer.strategy ddp``
is run as a subprocess (exactly what README "Multiple GPUs and machines" tells users to
run): Lightning starts the second rank itself, the training batches are shared out by
imagetx.data.datamodule's TrainOrder, and the validation batches by the DistributedSampler that
Lightning puts in front of ImageDataModule's val loader. A small callback (written to
tmp_path, imported by both ranks through PYTHONPATH) records each rank's final parameters
and the validation images that rank saw.

Checked: both ranks end with bit-identical parameters (equal to the checkpoint's), the
two ranks validated disjoint halves that together are the whole val split, and the
logged ``val/bpd`` is the bits/dim over ALL val images computed here with the final model
(the MeanMetric in imagetx/training/module.py sums and counts across ranks), not rank 0's half nor a
mean of batch means; and every rank's process ends without an exception (a rank that
dies after training fails a torchrun or srun job even when rank 0 exits 0).
Runs in about 15 s on an idle 2-core machine (two processes importing torch and Lightning).
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from helpers import cifar_arrays, write_npz_shard
from imagetx import load_model

pytestmark = pytest.mark.usefixtures("clean_wandb_env")

TRAIN_IMAGES = 8  # 2 steps x 2 ranks x batch 2: one epoch
# Even on purpose: DistributedSampler pads a split whose size is not divisible by the
# number of ranks by repeating its first images, so an odd split would count some
# images twice in any cross-rank mean. 6 = 3 per rank = a batch of 2 and a batch of 1,
# so the metric must also weight batches by their size.
VAL_IMAGES = 6
GREY = [0, 4, 5]  # val images that are flat grey; the others are random noise

PROBE = '''
import os
import sys

import lightning as L
import torch


class RecordRanks(L.Callback):
    """Saves, per rank, the flattened parameters at the end of training and the
    validation images this rank was given (sanity check excluded); an exception that
    ends any rank's process (after training too) is written to exception-PID.txt."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.val_images = []
        previous = sys.excepthook

        def record(kind, value, traceback):
            with open(os.path.join(directory, f"exception-{os.getpid()}.txt"), "w") as handle:
                handle.write(f"{kind.__name__}: {value}")
            previous(kind, value, traceback)

        sys.excepthook = record

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.val_images.append(batch["images"].detach().cpu())

    def on_train_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in pl_module.model.parameters()])
        torch.save({"rank": trainer.global_rank, "world_size": trainer.world_size, "step": trainer.global_step,
                    "params": flat, "val_batches": self.val_images},
                   os.path.join(self.directory, f"rank{trainer.global_rank}.pt"))
'''


def write_data(root):
    """train-0.npz: TRAIN_IMAGES random images, then the VAL_IMAGES val images (the last
    val_size images are the val split). Some val images are flat grey, the others noise
    (bits/dim far apart), placed so that with DistributedSampler's rank r = images r, r+2,
    r+4 (batches [0, 2], [4] and [1, 3], [5]) neither rank 0's mean nor a mean of batch
    means equals the mean over all images."""
    images, labels = cifar_arrays(TRAIN_IMAGES + VAL_IMAGES, seed=3)
    val = images[TRAIN_IMAGES:]
    for i in GREY:
        val[i] = 120 + i  # flat, and every image distinct
    root.mkdir()
    write_npz_shard(root / "train-0.npz", images, labels)
    return torch.from_numpy(val.copy())


@pytest.mark.slow
def test_ddp_two_cpu_processes_identical_weights_and_global_val_bpd(tmp_path):
    data_root, run_dir, probe_dir = tmp_path / "data", tmp_path / "run", tmp_path / "probe"
    val_images = write_data(data_root)
    probe_dir.mkdir()
    (probe_dir / "ddp_probe.py").write_text(PROBE)
    config = {
        "seed_everything": 0,
        "trainer": {"default_root_dir": str(run_dir), "max_steps": 2, "val_check_interval": 2,
                    "check_val_every_n_epoch": None, "num_sanity_val_steps": 0, "enable_progress_bar": False,
                    "enable_model_summary": False, "log_every_n_steps": 1,
                    "callbacks": [{"class_path": "ddp_probe.RecordRanks",
                                   "init_args": {"directory": str(probe_dir)}}]},
        "model": {"config": {"image_size": 32, "head": "dmol", "mixture_components": 2, "n_layers": 1,
                             "d_model": 16, "d_filter": 32, "dropout": 0.0, "position_encoding": "learned",
                             "attention": {"n_heads": 2, "kind": "local_1d", "query_block_length": 256}},
                  "optimizer": "adam_noam", "peak_lr": 0.003, "warmup_steps": 2},
        "data": {"batch_size": 2, "eval_batch_size": 2, "val_size": VAL_IMAGES},
    }
    config_path = tmp_path / "ddp.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")]))}
    env.pop("MASTER_PORT", None)  # Lightning picks a free port
    command = [sys.executable, "-m", "imagetx.train", "--config", str(config_path), "--data.root", str(data_root),
               "--wandb", "disabled",
               "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"two-process DDP run: {seconds:.1f} s")

    # ----- both ranks ran, to the same step, and hold identical parameters
    ranks = [torch.load(probe_dir / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [d["rank"] for d in ranks] == [0, 1]
    assert all(d["world_size"] == 2 and d["step"] == 2 for d in ranks)
    assert torch.equal(ranks[0]["params"], ranks[1]["params"]), \
        f"ranks differ by up to {(ranks[0]['params'] - ranks[1]['params']).abs().max():.3g}"
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2
    model = load_model(last).eval()
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]), ranks[0]["params"])

    # ----- the val split was shared out: disjoint halves that together are all of it
    batches = [d["val_batches"] for d in ranks]
    seen = [torch.cat(b) for b in batches]
    assert [len(s) for s in seen] == [VAL_IMAGES // 2] * 2
    keys = [{image.numpy().tobytes() for image in s} for s in seen]
    assert not keys[0] & keys[1]
    assert keys[0] | keys[1] == {image.numpy().tobytes() for image in val_images}

    # ----- the logged val/bpd is the mean over every rank's images
    with torch.no_grad():
        bpd = model.bits_per_dim(val_images).double()
        rank0_only = model.bits_per_dim(seen[0]).double().mean().item()
        batch_means = [model.bits_per_dim(b).double().mean().item() for b in batches[0] + batches[1]]
    expected = bpd.mean().item()
    metrics = list(run_dir.glob("csv/version_*/metrics.csv"))
    assert len(metrics) == 1
    with metrics[0].open() as handle:
        logged = [float(row["val/bpd"]) for row in csv.DictReader(handle) if row.get("val/bpd")]
    assert len(logged) == 1, logged  # one validation, at step 2 (= max_steps, the final weights)
    assert math.isclose(logged[0], expected, rel_tol=1e-5), (logged[0], expected, rank0_only)
    # the check tells the right mean from the usual wrong ones: rank 0's images alone, and
    # the unweighted mean of batch means, give clearly different numbers
    assert abs(rank0_only - expected) > 1e-3, (rank0_only, expected)
    assert abs(sum(batch_means) / len(batch_means) - expected) > 1e-3, (batch_means, expected)

    # ----- train/samples counts one process's images (Lightning's); train/total_samples both ranks'
    with metrics[0].open() as handle:
        counts = [(float(row["train/samples"]), float(row["train/total_samples"])) for row in csv.DictReader(handle)
                  if row.get("train/samples")]
    assert counts and counts[-1] == (4, 8) and all(total == 2 * one for one, total in counts), counts

    # ----- every rank's process ends cleanly, not only rank 0's (whose exit code is the command's):
    # under torchrun or srun a failing rank fails the whole job
    crashes = [path.read_text() for path in probe_dir.glob("exception-*.txt")]
    assert not crashes and "Traceback" not in proc.stderr, \
        (f"a rank crashed after training: {crashes} (e.g. a collective call such as "
         f"trainer.save_checkpoint made on some ranks only)\n{proc.stderr[-3000:]}")
