"""What the 8×8 input can be worth to a weak model (docs/model.md §6): bits/dim of a
simple per-context linear predictor with and without the low-resolution input.

    .venv/bin/python -m experiments.superres_information --data.root ../shared/cifar10 \
        [--train 6000] [--val 2000] [--json out.json]

Each sub-pixel is predicted, channel by channel in the DMOL order (R, G, B), as a
least-squares combination of its left and upper neighbours and the pixel's earlier
channels; the residual is coded with a histogram fitted on the training images. The
fit is made separately per context: how far the left and upper neighbours differ
(an edge detector), and, with the input, the pixel's position in its 4×4 cell and how
far the left neighbour is from the cell's mean. Three predictors:

* ``without_input``: neighbours only (what an unconditional model can use),
* ``own_cell``: plus the mean of the low-resolution pixel it lies in,
* ``with_neighbour_cells``: plus the 8 cells around that one.

For a model that scores near these numbers, their difference is a fair guess at how
much the input can lower its bits/dim (experiments/README.md says what it found).
Training images: the first N of the train split; scored on the first N of val. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from imagetx.model.superres import downsample_area
from imagetx.data.sources import DataError, load

from experiments.json_result import emit

SIDE = 32  # CIFAR-10 images are SIDE x SIDE pixels
CELL = 4  # SIDE / 8: side of the high-resolution block under one low-resolution pixel
EDGE_BINS = [2, 5, 10, 20, 40, 80]  # |difference| thresholds, in intensity levels
RESIDUAL_RANGE = 600  # residuals are clipped to ±this for the histogram (levels are 0..255)


def shifted(a: np.ndarray, axis: int) -> np.ndarray:
    """The left (axis 2) or upper (axis 1) neighbour of every pixel, edge-replicated."""
    first = np.take(a, [0], axis=axis)
    return np.concatenate([first, np.delete(a, -1, axis=axis)], axis=axis)


def low_res_of(images: np.ndarray) -> np.ndarray:
    """The 8×8 inputs (float), made exactly as the model's (imagetx.model.transformer.downsample_area)."""
    return downsample_area(torch.from_numpy(images.astype(np.uint8)), SIDE // CELL).numpy().astype(np.float64)


def cell_means(low_res: np.ndarray, dr: int = 0, dc: int = 0) -> np.ndarray:
    """(N, 32, 32, 3): the mean of the low-res cell (dr, dc) away from each pixel's own."""
    side = low_res.shape[1]
    padded = np.pad(low_res, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")[:, 1 + dr : 1 + dr + side,
                                                                            1 + dc : 1 + dc + side]
    return padded.repeat(CELL, axis=1).repeat(CELL, axis=2)


NEIGHBOUR_CELLS = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if dr or dc]


def neighbourhood(images: np.ndarray, variant: str) -> dict[str, np.ndarray | list[np.ndarray]]:
    """What the predictors may look at, computed once for all three channels: the left and
    upper neighbours and, with the input, the cell means (N, 32, 32, 3 each)."""
    near: dict = {"left": shifted(images, 2), "up": shifted(images, 1)}
    if variant != "without_input":
        low_res = low_res_of(images)
        near["own"] = cell_means(low_res)
        if variant == "with_neighbour_cells":
            near["cells"] = [cell_means(low_res, dr, dc) for dr, dc in NEIGHBOUR_CELLS]
    return near


def features(images: np.ndarray, near: dict, channel: int):
    """-> (features (M, F), targets (M,), contexts (M,)) for one channel of every pixel."""
    left, up, c = near["left"], near["up"], channel
    cols = [left[..., c], up[..., c], np.ones_like(images[..., c])]
    for earlier in range(c):
        cols += [images[..., earlier], left[..., earlier]]
    context = np.digitize(np.abs(left[..., c] - up[..., c]), EDGE_BINS)
    if "own" in near:
        own = near["own"]
        cols += [own[..., c]] + [own[..., earlier] for earlier in range(c)]
        position = (np.arange(SIDE)[:, None] % CELL) * CELL + np.arange(SIDE)[None, :] % CELL
        context = (context * (len(EDGE_BINS) + 1) + np.digitize(np.abs(left[..., c] - own[..., c]), EDGE_BINS)) \
            * CELL * CELL + position
    cols += [cell[..., c] for cell in near.get("cells", [])]
    return (np.stack(cols, axis=-1).reshape(-1, len(cols)), images[..., c].reshape(-1), context.reshape(-1))


def coded_bits(train_residual: np.ndarray, val_residual: np.ndarray) -> np.ndarray:
    """Bits of each val residual under a histogram of the train residuals (+½ smoothing)."""
    width = 2 * RESIDUAL_RANGE + 1
    to_bin = lambda r: np.clip(np.rint(r).astype(int) + RESIDUAL_RANGE, 0, width - 1)  # noqa: E731
    counts = np.bincount(to_bin(train_residual), minlength=width) + 0.5
    return -np.log2(counts[to_bin(val_residual)] / counts.sum())


def rows_by_context(contexts: np.ndarray) -> dict[int, np.ndarray]:
    """Context id -> the row indices holding it (one sort, not one scan per context)."""
    order = np.argsort(contexts, kind="stable")
    ids, starts = np.unique(contexts[order], return_index=True)
    return dict(zip(ids.tolist(), np.split(order, starts[1:])))


def bits_per_dim(train: np.ndarray, val: np.ndarray, variant: str) -> float:
    near_train, near_val = neighbourhood(train, variant), neighbourhood(val, variant)
    total = 0.0
    for channel in range(3):
        fx, fy, fc = features(train, near_train, channel)
        vx, vy, vc = features(val, near_val, channel)
        fit_rows = rows_by_context(fc)
        everything = np.arange(len(fy))
        for context, score in rows_by_context(vc).items():
            fit = fit_rows.get(context, everything)
            if len(fit) < 2 * fx.shape[1]:  # too few examples to fit: fall back to every context
                fit = everything
            weights = np.linalg.lstsq(fx[fit], fy[fit], rcond=None)[0]
            total += coded_bits(fy[fit] - fx[fit] @ weights, vy[score] - vx[score] @ weights).sum()
    return total / val.size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data.root", dest="root", default=None)
    parser.add_argument("--val_size", type=int, default=5000, help="images held out of training for val")
    parser.add_argument("--train", type=int, default=6000, help="training images the predictors are fitted on")
    parser.add_argument("--val", type=int, default=2000, help="val images they are scored on")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args()
    if args.train < 1 or args.val < 1:
        sys.exit("error: --train and --val must each be at least 1 image")
    try:
        train = load("cifar10", args.root, "train", args.val_size, download=False)[0]
        val = load("cifar10", args.root, "val", args.val_size, download=False)[0]
    except DataError as err:
        sys.exit(f"error: {err}")
    train, val = (x[:n].numpy().astype(np.float64) for x, n in ((train, args.train), (val, args.val)))
    result = {variant: round(bits_per_dim(train, val, variant), 4)
              for variant in ("without_input", "own_cell", "with_neighbour_cells")}
    result.update(train_images=len(train), val_images=len(val))
    emit(result, args.json)


if __name__ == "__main__":
    main()
