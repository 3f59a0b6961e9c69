"""Train the PixelCNN++ baseline (``pixelcnn_pp_model.py``) for a wall-clock budget and score it
on the validation split: what PixelCNN++ reaches in the time the Image Transformer is given, on
the CPU (beside ``quick``) or on a GPU (beside ``pretrained/cifar10_gpu``).

    OMP_NUM_THREADS=1 .venv/bin/python -m experiments.pixelcnn_pp --data.root ../shared/cifar10 \\
        --max-minutes 14 [--batch-size 16 --lr 1e-3 --seed 0 --val-limit N --json PATH]
    python -m experiments.pixelcnn_pp --data.root ../shared/cifar10 --device cuda --precision bf16 \\
        --compile --batch-size 120 --nr-resnet 5 --nr-filters 160 --dropout 0.5 --max-minutes 8 \\
        --curve-seconds 30 --grid samples.png --json result.json     # the paper's size, on one GPU

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

SIGTERM or SIGINT (Ctrl-C) ends training after the step under way; the run then scores
and writes its result as at the end of its budget (without the grid). A step whose loss or
gradients are not finite is not applied (fused Adam's ``found_inf``, as imagetx's own training
skips one: ``imagetx.training.nonfinite``); past ``--max-nonfinite-skips`` such steps (0: the
first), training ends at the next progress line, naming the step, and the finite weights are scored.

The clock counts training steps only: it starts at the first step, stops at the first step
ending past the budget, and leaves out the compilation pass (``--compile``: one forward and
backward before the first step, no update) and the curve's scoring (``--curve-seconds``: the
Polyak weights on the val images every so many seconds of training, in the training
precision). The final scores are in float32 with TF32 off, whatever the training precision;
under ``--precision bf16`` the Polyak weights are also scored in bf16 (``val_bpd_bf16``), which
says what the training precision costs the likelihood. Throughput: images/s over each progress
window (the median of them), FLOPs per image counted as ``imagetx.model.flops`` counts the Image
Transformer's (``FlopCounterMode``: products at 2 FLOPs a multiply-add, forward and backward),
MFU against ``imagetx.training.throughput``'s dense peak, the allocator's peak memory.
Progress lines every ``--progress-seconds``, a summary, and as the last line one JSON object
(``json_result.emit``).
"""

from __future__ import annotations

import argparse
import copy
import math
import signal
import statistics
import time
from contextlib import contextmanager, nullcontext

import torch
from torch.utils.flop_counter import FlopCounterMode

from experiments.json_result import emit
from experiments.pixelcnn_pp_model import PixelCNNpp, to_model_input
from imagetx.compat import skip_fused_step_where
from imagetx.data.datamodule import ImageDataModule, TrainOrder
from imagetx.data.images import save_grid
from imagetx.model.config import CHANNELS
from imagetx.sample import IMAGES_PER_ROW
from imagetx.training.nonfinite import NonFiniteLossError, NonFiniteSteps, gradients_not_finite, step_kind
from imagetx.training.throughput import table_peak
from scripts.common import sync

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


@contextmanager
def exact_float32():
    """float32 products as float32 (no TF32 in cuDNN's convolutions or in matrix products): for
    final scores that do not depend on the device's defaults."""
    saved = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast for the network (its DMOL head projects and scores in float32 regardless:
    ``imagetx.model.heads``), or nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


@torch.no_grad()
def val_bits_per_dim(net: PixelCNNpp, images: torch.Tensor, batch_size: int, bf16: bool = False) -> float:
    """The mean over ``images`` of each image's bits/dim (in float64), in eval mode."""
    was_training = net.training
    net.eval()
    total = 0.0
    with autocast(images.device, bf16):
        for start in range(0, len(images), batch_size):
            total += float(bits_per_dim(net.nats(images[start : start + batch_size])).double().sum())
    net.train(was_training)
    return total / len(images)


def training_flops_per_image(net: PixelCNNpp, image: torch.Tensor) -> int:
    """FLOPs of one training image, forward and backward (``FlopCounterMode``: the convolutions
    and the head's product; the first layers' input, the image, takes no gradient). Leaves no
    gradient behind."""
    with FlopCounterMode(display=False) as counter:
        net.nats(image[:1]).sum().backward()
    net.zero_grad(set_to_none=True)
    return counter.get_total_flops()


@torch.no_grad()
def sample_images(net: PixelCNNpp, count: int, generator: torch.Generator, bf16: bool = False) -> torch.Tensor:
    """``count`` images (count, 32, 32, 3) uint8, drawn a pixel at a time in raster order, each
    pixel's three values from the head's distribution given the pixels drawn before it (one
    forward pass of the whole image per pixel: the network is causal, so what is not yet drawn,
    zeros, is not read)."""
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    images = torch.zeros(count, IMAGE_SIZE, IMAGE_SIZE, CHANNELS, dtype=torch.uint8, device=device)
    pixels = images.view(count, IMAGE_SIZE * IMAGE_SIZE, CHANNELS)  # (B, T, 3), a view: drawing fills images
    with autocast(device, bf16):
        for t in range(pixels.shape[1]):
            params = net(to_model_input(images))[:, t : t + 1]  # (B, 1, 10·K)
            pixels[:, t : t + 1] = net.head.sample(params, generator=generator).to(torch.uint8)
    net.train(was_training)
    return images


def batches(train_images: torch.Tensor, order: TrainOrder, batch_size: int):
    """Training batches (B, 32, 32, 3) without end, an epoch at a time in ``order``'s order
    (the batches a DataLoader over ``order`` gives; no flips), gathered where the images are."""
    epoch = 0
    while True:
        order.set_epoch(epoch)
        indices = torch.tensor([index for index, _ in order], device=train_images.device)
        yield from (train_images[chunk] for chunk in indices.split(batch_size))
        epoch += 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data.root", dest="root", required=True, help="CIFAR-10 npz shards (or torchvision's folder)")
    parser.add_argument("--val-size", type=int, default=None,
                        help="training images held out for val, the last ones (default: the source's, 5,000)")
    parser.add_argument("--max-minutes", type=float, required=True, help="training wall-clock budget, from step 1")
    parser.add_argument("--max-steps", type=int, default=None, help="also stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="training images per step (the reference's 16 a GPU, 8 GPUs: 128 a step)")
    parser.add_argument("--eval-batch-size", type=int, default=64, help="val images scored at once (memory only)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate at step 1 (the reference's)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and training order")
    parser.add_argument("--nr-resnet", type=int, default=1, help="gated resnets per stage (paper: 5)")
    parser.add_argument("--nr-filters", type=int, default=32, help="channels of both streams (paper: 160)")
    parser.add_argument("--nr-logistic-mix", type=int, default=10, help="logistic mixture components (paper: 10)")
    parser.add_argument("--dropout", type=float, default=0.0, help="in each gated resnet (paper: 0.5)")
    parser.add_argument("--polyak-decay", type=float, default=POLYAK_DECAY,
                        help="weight averaging for the val score; 0: score the trained weights only")
    parser.add_argument("--max-nonfinite-skips", type=int, default=0,
                        help="updates skipped for a NaN/inf loss or gradient before training stops "
                             "(0: stop at the first)")
    parser.add_argument("--val-limit", type=int, default=None, help="score only the first N val images")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", choices=("32", "bf16"), default="32",
                        help="training precision: float32 (TF32 allowed on CUDA), or bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the training loss (static shapes)")
    parser.add_argument("--curve-seconds", type=float, default=0.0,
                        help="score the Polyak weights on the val images every so many training seconds (0: never)")
    parser.add_argument("--grid", default=None, help="also draw samples of the Polyak weights into this PNG")
    parser.add_argument("--grid-samples", type=int, default=16,
                        help=f"samples in the grid, in rows of {IMAGES_PER_ROW}")
    parser.add_argument("--progress-seconds", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--json", default=None, help="also write the result here")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_minutes <= 0 or args.batch_size < 1 or args.grid_samples < 1 or (
            args.val_limit is not None and args.val_limit < 1):
        parser.error("--max-minutes, --batch-size, --grid-samples and --val-limit must be positive")
    if not 0 <= args.polyak_decay < 1:
        parser.error("--polyak-decay must be in [0, 1)")
    if args.max_nonfinite_skips < 0:
        parser.error("--max-nonfinite-skips must be 0 or more")
    stop = []  # a signal received: training ends after the step under way, and the result is kept

    def request_stop(number, frame) -> None:
        stop.append(signal.Signals(number).name)
        print(f"{stop[-1]}: training ends after the step under way; scoring follows", flush=True)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, request_stop)
    device, bf16 = torch.device(args.device), args.precision == "bf16"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is visible; train with --device cpu")
        # float32 training takes TF32 in products (as Lightning's "32-true" with high matmul precision)
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    data = ImageDataModule(root=args.root, val_size=args.val_size, batch_size=args.batch_size, download=False,
                           image_size=IMAGE_SIZE, num_classes=0)
    train = data.dataset("train")
    val_images = data.dataset("val").images[: args.val_limit].to(device)
    print(f"data: {len(train):,} train images, {len(val_images):,} val images scored ({args.root})", flush=True)

    torch.manual_seed(args.seed)
    net = PixelCNNpp(args.nr_resnet, args.nr_filters, args.nr_logistic_mix, args.dropout).to(device).train()
    averaged = copy.deepcopy(net).eval() if args.polyak_decay else None
    weights = list(net.parameters())
    averaged_weights = list(averaged.parameters()) if averaged is not None else []
    # fused: one kernel for all the weights (the same update as the loop over them), which skips the
    # update where ``found_inf`` is set: a step whose loss or gradients are not finite (as imagetx's
    # training does, imagetx.training.nonfinite), counted on the device and read at progress lines
    optimizer = torch.optim.Adam(weights, lr=args.lr, betas=BETAS, fused=True)
    nonfinite, nonfinite_stop = NonFiniteSteps(args.max_nonfinite_skips, option="--max-nonfinite-skips"), None
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=LR_DECAY)
    order = TrainOrder(train, seed=args.seed)  # the quick run's order for the same seed; no flips
    stream = batches(train.images.to(device), order, args.batch_size)
    flops = training_flops_per_image(net, val_images)
    peak = table_peak(device, torch.bfloat16 if bf16 else "tf32")
    print(f"PixelCNN++: {sum(p.numel() for p in weights):,} parameters, nr_resnet {args.nr_resnet}, "
          f"nr_filters {args.nr_filters}, {args.nr_logistic_mix} logistics, dropout {args.dropout}; "
          f"{flops / 1e9:.1f} GFLOPs a training image; {device}, precision {args.precision}"
          f"{', compiled' if args.compile else ''}; {torch.get_num_threads()} threads", flush=True)

    def batch_loss(images: torch.Tensor) -> torch.Tensor:
        with autocast(device, bf16):
            return bits_per_dim(net.nats(images)).mean()

    step_loss = torch.compile(batch_loss, dynamic=False) if args.compile else batch_loss
    first = next(stream)
    compile_seconds = None
    if args.compile:  # compiled here, outside the clock: a forward and backward, no update
        compile_started = time.perf_counter()
        step_loss(first).backward()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        compile_seconds = time.perf_counter() - compile_started
        print(f"compiled the training loss in {compile_seconds:.0f} s", flush=True)

    budget = 60.0 * args.max_minutes
    scored_net = averaged if averaged is not None else net  # what the curve and the grid show
    steps = images_seen = 0
    # The clock: training seconds before the current stretch of steps, and when the stretch began
    # (each progress line and curve point ends one: their syncs, scoring and printing are left out).
    clock, stretch_began = 0.0, time.perf_counter()
    window = new_window(device, began=0.0)
    progress, curve = [], []
    next_point = args.curve_seconds or math.inf
    done = False
    images = first
    while not done:
        loss = step_loss(images)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        found = ~torch.isfinite(loss.detach()) | gradients_not_finite(weights)
        skip_fused_step_where(optimizer, found)
        nonfinite.note(found, steps + 1, step_kind(loss.detach()))
        optimizer.step()
        schedule.step()
        steps, images_seen = steps + 1, images_seen + len(images)
        if averaged is not None:  # Polyak averaging: avg ← decay·avg + (1 − decay)·weights
            decay = min(args.polyak_decay, (POLYAK_WARMUP[0] + steps) / (POLYAK_WARMUP[1] + steps))
            with torch.no_grad():
                for mean, weight in zip(averaged_weights, weights):
                    mean.lerp_(weight, 1.0 - decay)
        # read back at the progress lines only: no sync a step; a skipped step's loss left out
        window["loss"] += torch.where(found, 0.0, loss.detach())
        window["finite"] += ~found
        window["images"] += len(images)
        images = next(stream)
        # (on CUDA the host runs ahead of the device by a few steps at most, until the sync below)
        trained = clock + time.perf_counter() - stretch_began
        done = trained >= budget or (args.max_steps is not None and steps >= args.max_steps) or bool(stop)
        report = done or trained - window["began"] >= args.progress_seconds
        point = trained >= next_point
        if not (report or point):
            continue
        sync(device)  # the steps queued so far, timed to their end
        trained = clock + time.perf_counter() - stretch_began
        if report:
            rate = window["images"] / (trained - window["began"])
            finite = int(window["finite"])
            progress.append({"minutes": trained / 60, "steps": steps, "images_per_sec": rate,
                             "train_bpd": float(window["loss"]) / finite if finite else math.nan})
            print(f"step {steps:6d}  {trained / 60:6.2f} min  train {progress[-1]['train_bpd']:.4f} bits/dim  "
                  f"{rate:,.0f} images/s", flush=True)
            window = new_window(device, began=trained)
            try:  # the non-finite steps since the last line: a warning, or the end past the limit
                warning = nonfinite.read()
            except NonFiniteLossError as error:
                warning = nonfinite_stop = str(error)
                done = True
            if warning:
                print(warning, flush=True)
        if point or (done and args.curve_seconds > 0):
            value = val_bits_per_dim(scored_net, val_images, args.eval_batch_size, bf16)
            curve.append({"minutes": trained / 60, "steps": steps, "images_seen": images_seen, "val_bpd": value})
            print(f"val {value:.4f} bits/dim at {trained / 60:.2f} min (step {steps})", flush=True)
            next_point = trained + args.curve_seconds
        clock, stretch_began = trained, time.perf_counter()
    minutes = trained / 60
    peak_memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None

    scored = time.perf_counter()
    with exact_float32():
        raw = val_bits_per_dim(net, val_images, args.eval_batch_size)
        val = val_bits_per_dim(averaged, val_images, args.eval_batch_size) if averaged is not None else raw
    val_bf16 = None  # under bf16: the last curve point, where there is one (the same weights, precision, images)
    if bf16:
        val_bf16 = curve[-1]["val_bpd"] if curve else val_bits_per_dim(scored_net, val_images, args.eval_batch_size,
                                                                       bf16=True)
    print(f"{steps:,} steps in {minutes:.2f} min ({images_seen:,} images); val {val:.4f} bits/dim "
          f"(trained weights {raw:.4f}) over {len(val_images):,} images, scored in float32 in "
          f"{time.perf_counter() - scored:.0f} s" + (f"; in bf16 {val_bf16:.4f}" if bf16 else ""), flush=True)
    if args.grid and not stop:
        drawn = sample_images(scored_net, args.grid_samples, torch.Generator(device).manual_seed(args.seed), bf16)
        print(f"{args.grid_samples} samples: {save_grid(list(drawn.split(IMAGES_PER_ROW)), args.grid)}", flush=True)

    images_per_sec = statistics.median(line["images_per_sec"] for line in progress)
    emit({"model": "pixelcnn_pp", "steps": steps, "minutes": round(minutes, 3), "images_seen": images_seen,
          "val_bpd": val, "val_bpd_raw": raw, "val_bpd_bf16": val_bf16, "val_images": len(val_images),
          "curve": curve, "progress": progress, "images_per_sec": images_per_sec,
          "flops_per_image": flops, "mfu": images_per_sec * flops / peak if peak else None,
          "peak_memory_gib": peak_memory, "compile_seconds": compile_seconds,
          "stopped_by": stop[0] if stop else None, "nonfinite_skips": nonfinite.skipped,
          "nonfinite_stop": nonfinite_stop,
          "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
          "settings": {key: value for key, value in vars(args).items() if key not in ("json", "progress_seconds")},
          "torch": torch.__version__, "threads": torch.get_num_threads()}, args.json)


def new_window(device: torch.device, began: float) -> dict:
    """A progress window's counters: its finite losses' sum and count (on the device), its images,
    and the training second it began at."""
    return {"loss": torch.zeros((), device=device), "finite": torch.zeros((), dtype=torch.long, device=device),
            "images": 0, "began": began}


if __name__ == "__main__":
    main()
