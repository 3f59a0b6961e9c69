"""Round trip of the val images through imagetx.compress (docs/results.md, "Lossless
compression"): every image compressed in files of ``--per_file`` images, each file decompressed
and compared pixel by pixel with what went in.

    .venv/bin/python -m experiments.compress_roundtrip [--ckpt pretrained/completion]
        [--data ../shared/cifar10] [--count 5000] [--skip 0] [--per_file 100] [--workers 2] [--json out.json]
    .venv/bin/python -m experiments.compress_roundtrip --merge A.json B.json.partial.jsonl ... [--json out.json]

The val split is the last 5,000 of the 50,000 training images (``imagetx.evaluate --split
val``): the second half of train-4.npz. Files are coded by ``--workers`` processes side by side,
each on one torch thread. Reported: differing pixels over all images (the target: 0), the
files' bytes and bits/dim, the ideal bits of the quantised distributions, and seconds per file
each way. The last line printed is one JSON object (``--json``: also that file, and each file's
result as it is done in ``JSON.partial.jsonl``). ``--merge`` sums runs made in parts (``--skip``)
into one such summary, and refuses when they leave val images out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from experiments.json_result import emit

ROOT = Path(__file__).resolve().parents[1]
VAL_IMAGES = 5000  # CIFAR-10's val split: the last 5,000 training images (data/sources/cifar10.py)
DIMS_PER_IMAGE = 32 * 32 * 3  # a CIFAR-10 image's sub-pixels: what bits/dim divides by


def val_images(data: Path, count: int) -> np.ndarray:
    """The first ``count`` images of the val split: the last 5,000 of train-4.npz's 10,000."""
    with np.load(data / "train-4.npz") as shard:
        return shard["images"][-VAL_IMAGES:][:count]


def code_file(job: tuple[str, np.ndarray, int]) -> dict:
    ckpt, images, start = job
    import torch

    from imagetx.codec import compress_with_stats, decompress
    from imagetx.io.load import load_model

    torch.set_num_threads(1)
    model = load_model(ckpt)
    began = time.perf_counter()
    data, stats = compress_with_stats(model, images, batch=len(images))
    middle = time.perf_counter()
    back = decompress(model, data)
    ended = time.perf_counter()
    return {"start": start, "images": len(images), "bytes": len(data), "ideal_bits": stats.ideal_bits,
            "differing_pixels": int((back != images).any(axis=-1).sum()),
            "compress_seconds": middle - began, "decompress_seconds": ended - middle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default=str(ROOT / "pretrained" / "completion"))
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "cifar10"))
    parser.add_argument("--count", type=int, default=VAL_IMAGES)
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N val images (done already)")
    parser.add_argument("--per_file", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--merge", nargs="+", default=None, metavar="RESULTS",
                        help="no coding: one summary over these runs' --json / .partial.jsonl results")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args.json)
        return
    images = val_images(Path(args.data), args.skip + args.count)[args.skip:]
    jobs = [(args.ckpt, images[start:start + args.per_file], args.skip + start)
            for start in range(0, len(images), args.per_file)]
    began = time.perf_counter()
    files = []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for item in tqdm(pool.imap_unordered(code_file, jobs), total=len(jobs), desc="files", unit="file"):
            files.append(item)
            if args.json:  # each file's result as it comes: a run cut short still says what it did
                with open(args.json + ".partial.jsonl", "a") as partial:
                    partial.write(json.dumps(item) + "\n")
    emit(summary(files, args.ckpt, args.per_file, args.workers, time.perf_counter() - began), args.json)


def summary(files: list[dict], ckpt: str, per_file: int, workers: int, wall_seconds: float | None) -> dict:
    """The totals over the files' results: differing pixels, bytes, bits/dim, seconds per file."""
    files = sorted(files, key=lambda item: item["start"])
    images = sum(item["images"] for item in files)
    dims = images * DIMS_PER_IMAGE
    total_bytes = sum(item["bytes"] for item in files)
    return {"ckpt": ckpt, "images": images, "per_file": per_file, "files": len(files),
            "differing_pixels": sum(item["differing_pixels"] for item in files),
            "bytes": total_bytes, "bits_per_dim": 8 * total_bytes / dims,
            "ideal_bits_per_dim": sum(item["ideal_bits"] for item in files) / dims,
            "compress_seconds_per_file": float(np.median([item["compress_seconds"] for item in files])),
            "decompress_seconds_per_file": float(np.median([item["decompress_seconds"] for item in files])),
            "wall_seconds": wall_seconds, "workers": workers, "per_file_results": files}


def merge(paths: list[str], out: str | None) -> None:
    """One summary over the per-file results of several runs (their --json files or .partial.jsonl
    files), each file of images counted once: a round trip made in parts, as one."""
    files = {}
    for path in paths:
        text = Path(path).read_text()
        found = json.loads(text)["per_file_results"] if path.endswith(".json") else [
            json.loads(line) for line in text.splitlines() if line.strip()]
        files.update({item["start"]: item for item in found})
    starts = sorted(files)
    gaps = [(a, b) for a, b in zip(starts, starts[1:]) if b != a + files[a]["images"]]
    if gaps or not starts or starts[0] != 0:
        raise SystemExit(f"error: the runs leave val images out (first start {starts[:1]}, gaps after {gaps}); "
                         "run experiments.compress_roundtrip --skip N --count M for them")
    emit(summary(list(files.values()), "merged", files[starts[0]]["images"], 0, None), out)

if __name__ == "__main__":
    main()
