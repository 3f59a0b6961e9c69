"""How far a model trained with dropout scores in eval mode (dropout off: the model imagetx reports and
samples) from the noisy model it was trained as: bits/dim of the same images in eval mode, in train mode
(a mean over ``--draws`` dropout masks), and with dropout on the input embeddings alone or on the residual
branches alone (docs/experiments.md entry 35: the road study's dropout arms).

    .venv/bin/python -m experiments.dropout_modes runs/road/runs/drop02_s0/checkpoints/last.ckpt \
        --data.root ../shared/cifar10 --split val --count 96 [--draws 3] [--json out.json]

Train mode here is each draw's own model, a different random network each time: a figure to compare, not
a likelihood imagetx reports. Prints one line a checkpoint, then one JSON object.
"""

from __future__ import annotations

import argparse

import torch

from experiments.json_result import emit
from imagetx import load_model
from imagetx.data.sources import load
from imagetx.model.modes import eval_mode


def scores(model, images: torch.Tensor, draws: int) -> dict[str, float]:
    """Bits/dim of ``images`` with dropout off, on everywhere, on the inputs only, on the residuals only;
    the model is handed back in its own mode (``eval_mode``)."""
    def bpd(input_on: bool, residual_on: bool) -> float:
        model.input_dropout.train(input_on)
        for layer in model.layers:
            layer.dropout.train(residual_on)
        runs = draws if input_on or residual_on else 1
        return sum(model.bits_per_dim(images).mean().item() for _ in range(runs)) / runs

    with torch.no_grad(), eval_mode(model):
        return {"eval": bpd(False, False), "train_mode": bpd(True, True),
                "input_dropout_only": bpd(True, False), "residual_dropout_only": bpd(False, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--data.root", dest="root", required=True)
    parser.add_argument("--split", choices=["train", "val"], default="val")
    parser.add_argument("--val_size", type=int, default=5000)
    parser.add_argument("--count", type=int, default=96, help="the split's first COUNT images")
    parser.add_argument("--draws", type=int, default=3, help="dropout masks averaged in train mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    images = load("cifar10", args.root, args.split, args.val_size, download=False)[0][: args.count]
    result = {"split": args.split, "count": len(images), "draws": args.draws, "models": {}}
    for path in args.checkpoints:
        torch.manual_seed(args.seed)
        model = load_model(path)
        figures = {"dropout": model.config.dropout, **scores(model, images, args.draws)}
        result["models"][path] = figures
        print(f"{path} (dropout {figures['dropout']}): " + ", ".join(
            f"{key} {value:.4f}" for key, value in figures.items() if key != "dropout"), flush=True)
    emit(result, args.json)


if __name__ == "__main__":
    main()
