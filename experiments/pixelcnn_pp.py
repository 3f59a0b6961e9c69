"""Train the PixelCNN++ baseline (``pixelcnn_pp_model.py``) for a wall-clock budget and score it
on the validation split: what PixelCNN++ reaches in the CPU time ``quick`` is given.

    OMP_NUM_THREADS=1 .venv/bin/python -m experiments.pixelcnn_pp --data.root ../shared/cifar10 \
        --max-minutes 14 [--batch-size 16 --lr 1e-3 --seed 0 --val-limit N --json PATH]

The images are the project's (``ImageDataModule``): training on the training split, in
``TrainOrder``'s order (with ``--seed 0`` the same order as a ``quick`` run with
``seed_everything 0``), no flips; bits/dim on the val split (the last 5,000 training images),
as ``imagetx.evaluate`` scores it: the mean of the images' bits/dim, over every image.
The recipe is the reference's: Adam with β = (0.95, 0.9995), the learning rate decayed by
0.999995 each step, no gradient clipping, and the val score from Polyak-averaged weights
(decay 0.9995, warmed up as TensorFlow's moving average with ``num_updates``: at step n the
decay is at most (1 + n)/(10 + n), since the reference's plain 0.9995 would still give the
random initial weights a weight of 0.9995^1500 ≈ 0.47 after the ~1,500 steps a 14-minute CPU
run takes; ``val_bpd_raw`` is the score of the trained weights themselves).

The clock starts at the first step and training stops at the first step ending past the
budget; evaluation is not counted. Progress lines every ``--progress-seconds``, a summary,
and as the last line one JSON object (``json_result.emit``).
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
from torch.utils.data import DataLoader

from experiments.json_result import emit
from experiments.pixelcnn_pp_model import PixelCNNpp
from imagetx.data.datamodule import ImageDataModule, TrainOrder
from imagetx.model.config import CHANNELS

IMAGE_SIZE = 32  # CIFAR-10
DIMS = IMAGE_SIZE * IMAGE_SIZE * CHANNELS  # 3,072 sub-pixels: bits/dim = nats / (3072 · ln 2)
# The reference's Adam moments (openai/pixel-cnn train.py: mom1 0.95, mom2 0.9995) and its
# learning-rate decay per step (lr_decay 0.999995: ×0.95 over 10,000 steps).
BETAS = (0.95, 0.9995)
LR_DECAY = 0.999995
# The reference's Polyak averaging of the weights for evaluation (polyak_decay 0.9995: an
# average over about the last 2,000 steps), at most (1 + n)/(10 + n) at step n (the warm-up of
# TensorFlow's ExponentialMovingAverage with num_updates: an average over about the last n/9 steps).
POLYAK_DECAY = 0.9995
POLYAK_WARMUP = (1, 10)


def bits_per_dim(nats: torch.Tensor) -> torch.Tensor:
    return nats / (DIMS * math.log(2))


@torch.no_grad()
def val_bits_per_dim(net: PixelCNNpp, images: torch.Tensor, batch_size: int) -> float:
    """The mean over ``images`` of each image's bits/dim (in float64), in eval mode."""
    net.eval()
    total = 0.0
    for start in range(0, len(images), batch_size):
        total += float(bits_per_dim(net.nats(images[start : start + batch_size])).double().sum())
    net.train()
    return total / len(images)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data.root", dest="root", required=True, help="CIFAR-10 npz shards (or torchvision's folder)")
    parser.add_argument("--val-size", type=int, default=None,
                        help="training images held out for val, the last ones (default: the source's, 5,000)")
    parser.add_argument("--max-minutes", type=float, required=True, help="training wall-clock budget, from step 1")
    parser.add_argument("--max-steps", type=int, default=None, help="also stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=16, help="training images per step (the reference's 16)")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="val images scored at once (memory only)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate at step 1 (the reference's)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and training order")
    parser.add_argument("--nr-resnet", type=int, default=1, help="gated resnets per stage (paper: 5)")
    parser.add_argument("--nr-filters", type=int, default=32, help="channels of both streams (paper: 160)")
    parser.add_argument("--nr-logistic-mix", type=int, default=10, help="logistic mixture components (paper: 10)")
    parser.add_argument("--dropout", type=float, default=0.0, help="in each gated resnet (paper: 0.5)")
    parser.add_argument("--polyak-decay", type=float, default=POLYAK_DECAY,
                        help="weight averaging for the val score; 0: score the trained weights only")
    parser.add_argument("--val-limit", type=int, default=None, help="score only the first N val images")
    parser.add_argument("--progress-seconds", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--json", default=None, help="also write the result here")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_minutes <= 0 or args.batch_size < 1 or (args.val_limit is not None and args.val_limit < 1):
        parser.error("--max-minutes, --batch-size and --val-limit must be positive")
    if not 0 <= args.polyak_decay < 1:
        parser.error("--polyak-decay must be in [0, 1)")
    data = ImageDataModule(root=args.root, val_size=args.val_size, batch_size=args.batch_size, download=False,
                           image_size=IMAGE_SIZE, num_classes=0)
    train, val_images = data.dataset("train"), data.dataset("val").images[: args.val_limit]
    print(f"data: {len(train):,} train images, {len(val_images):,} val images scored ({args.root})", flush=True)

    torch.manual_seed(args.seed)
    net = PixelCNNpp(args.nr_resnet, args.nr_filters, args.nr_logistic_mix, args.dropout).train()
    averaged = copy.deepcopy(net).eval() if args.polyak_decay else None
    weights = list(net.parameters())
    averaged_weights = list(averaged.parameters()) if averaged is not None else []
    optimizer = torch.optim.Adam(weights, lr=args.lr, betas=BETAS)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=LR_DECAY)
    order = TrainOrder(train, seed=args.seed)  # the quick run's order for the same seed; no flips
    loader = DataLoader(train, batch_size=args.batch_size, sampler=order)
    print(f"PixelCNN++: {sum(p.numel() for p in weights):,} parameters, nr_resnet {args.nr_resnet}, "
          f"nr_filters {args.nr_filters}, {args.nr_logistic_mix} logistics; {torch.get_num_threads()} threads",
          flush=True)

    budget = 60.0 * args.max_minutes
    steps = images_seen = 0
    recent: list[float] = []  # training bits/dim since the last progress line
    started = last_report = None
    epoch, done = 0, False
    while not done:
        order.set_epoch(epoch)
        for batch in loader:
            now = time.perf_counter()
            started = started if started is not None else now
            last_report = last_report if last_report is not None else now
            images = batch["images"]
            loss = bits_per_dim(net.nats(images)).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            steps, images_seen = steps + 1, images_seen + len(images)
            if averaged is not None:  # Polyak averaging: avg ← decay·avg + (1 − decay)·weights
                decay = min(args.polyak_decay, (POLYAK_WARMUP[0] + steps) / (POLYAK_WARMUP[1] + steps))
                with torch.no_grad():
                    for mean, weight in zip(averaged_weights, weights):
                        mean.lerp_(weight, 1.0 - decay)
            recent.append(float(loss.detach()))
            elapsed = time.perf_counter() - started
            done = elapsed >= budget or (args.max_steps is not None and steps >= args.max_steps)
            if done or time.perf_counter() - last_report >= args.progress_seconds:
                print(f"step {steps:6d}  {elapsed / 60:6.2f} min  train {sum(recent) / len(recent):.4f} bits/dim  "
                      f"{steps / max(elapsed, 1e-9):.2f} steps/s", flush=True)
                recent, last_report = [], time.perf_counter()
            if done:
                break
        epoch += 1
    minutes = (time.perf_counter() - started) / 60

    scored = time.perf_counter()
    raw = val_bits_per_dim(net, val_images, args.eval_batch_size)
    val = val_bits_per_dim(averaged, val_images, args.eval_batch_size) if averaged is not None else raw
    print(f"{steps:,} steps in {minutes:.2f} min ({images_seen:,} images); val {val:.4f} bits/dim "
          f"(trained weights {raw:.4f}) over {len(val_images):,} images, scored in "
          f"{time.perf_counter() - scored:.0f} s", flush=True)
    emit({"model": "pixelcnn_pp", "steps": steps, "minutes": round(minutes, 3), "images_seen": images_seen,
          "val_bpd": val, "val_bpd_raw": raw, "val_images": len(val_images),
          "settings": {key: value for key, value in vars(args).items() if key not in ("json", "progress_seconds")},
          "torch": torch.__version__, "threads": torch.get_num_threads()}, args.json)


if __name__ == "__main__":
    main()
