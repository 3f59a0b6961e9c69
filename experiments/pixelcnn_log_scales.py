"""How wide PixelCNN++'s DMOL components get in its first training steps (docs/experiments.md,
entry 34): the largest log-scale the network outputs at each step, over every position,
channel and mixture component of the batch, before the head's clamp; the DMOL head's
log-probability had a non-finite gradient from log-scales of about 88 (``TINY_GAP``).

    OMP_NUM_THREADS=1 .venv/bin/python -m experiments.pixelcnn_log_scales --data.root ../shared/cifar10 \\
        --steps 60 --batch-size 8 [--nr-resnet 5 --nr-filters 160 --dropout 0.5 --json PATH]

The recipe is ``pixelcnn_pp.py``'s (Adam 1e-3, β (0.95, 0.9995), the training order of ``--seed``),
in float32 on the CPU. One line a step: the training loss, the largest log-scale, how many
exceed 88; as the last line one JSON object.
"""

from __future__ import annotations

import argparse

import torch
from einops import rearrange

from experiments.json_result import emit
from experiments.pixelcnn_pp import BETAS, IMAGE_SIZE, batches, bits_per_dim
from experiments.pixelcnn_pp_model import PixelCNNpp, to_model_input
from imagetx.data.datamodule import ImageDataModule, TrainOrder
from imagetx.model.config import CHANNELS

# exp(-s) is below float32's smallest normal number (1.2e-38) from s ≈ 87.3: the head's old
# gradient, 1/gap, overflowed from about there
UNDERFLOW_LOG_SCALE = 88.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data.root", dest="root", required=True)
    parser.add_argument("--val-size", type=int, default=None, help="images held out (default: the source's, 5,000)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nr-resnet", type=int, default=5)
    parser.add_argument("--nr-filters", type=int, default=160)
    parser.add_argument("--nr-logistic-mix", type=int, default=10)
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    train = ImageDataModule(root=args.root, val_size=args.val_size, batch_size=args.batch_size, download=False,
                            image_size=IMAGE_SIZE, num_classes=0).dataset("train")
    torch.manual_seed(args.seed)
    net = PixelCNNpp(args.nr_resnet, args.nr_filters, args.nr_logistic_mix, args.dropout).train()
    optimizer = torch.optim.Adam(net.parameters(), lr=args.lr, betas=BETAS)
    stream = batches(train.images, TrainOrder(train, seed=args.seed), args.batch_size)
    k = args.nr_logistic_mix
    rows = []
    for step in range(1, args.steps + 1):
        images = next(stream)
        params = net(to_model_input(images))  # (B, T, 10·K)
        rest = rearrange(params[..., k:], "b t (c p k) -> b t c p k", c=CHANNELS, p=3, k=k)
        log_scales = rest[..., 1, :].detach()  # (B, T, 3, K), before the head's clamp
        loss = bits_per_dim(-net.head.log_prob(params, images.flatten(1, 2)).sum(1)).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        rows.append({"step": step, "train_bpd": float(loss.detach()), "max_log_scale": float(log_scales.max()),
                     "above_88": int((log_scales > UNDERFLOW_LOG_SCALE).sum()),
                     "finite_gradients": all(bool(torch.isfinite(p.grad).all()) for p in net.parameters())})
        print(f"step {step:4d}  train {rows[-1]['train_bpd']:8.4f} bits/dim  largest log-scale "
              f"{rows[-1]['max_log_scale']:8.3f}  above 88: {rows[-1]['above_88']}", flush=True)
    settings = {key: value for key, value in vars(args).items() if key != "json"}
    emit({"rows": rows, "settings": settings, "torch": torch.__version__}, args.json)


if __name__ == "__main__":
    main()
