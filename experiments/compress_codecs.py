"""imagetx.compress against the classical lossless codecs, and its speed (docs/results.md,
"Lossless compression"), on the val images with the shipped completion model.

    .venv/bin/python -m experiments.compress_codecs [--ckpt pretrained/completion]
        [--data ../shared/cifar10] [--count 5000] [--single 20] [--file 100] [--json out.json]

(``--single 0`` / ``--file 0``: those parts left out.)

* the classical codecs (imagetx/codec/classical.py: PNG optimised, WebP lossless, JPEG XL
  lossless, JPEG 2000 reversible), one file per image, on the first ``--count`` val images, each
  checked to decode exactly; their encode and decode speed;
* the model's own bits/dim on the same images (one teacher-forced pass, as imagetx.evaluate);
* imagetx files of one image (the first ``--single`` images, each its own file) and one file
  of ``--file`` images: bytes against the model's bits of the same images (the overhead, header
  included), and images per second compressing and decompressing (one torch thread; batch 1
  and batch ``--file``), every file decompressed and compared.

The last line printed is one JSON object (``--json``: also that file). Say, with the figures,
what else the machine was running.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from experiments.compress_roundtrip import VAL_IMAGES, val_images
from experiments.json_result import emit
from imagetx.codec import compress_with_stats, decompress
from imagetx.codec.classical import CODECS, available, encoded
from imagetx.io.load import load_model
from imagetx.model.scoring import evaluate

ROOT = Path(__file__).resolve().parents[1]


def classical(images: np.ndarray) -> dict:
    """Each codec's total bytes, bits/dim and speed over the images, one file per image."""
    results = {}
    for name in available():
        files, started = [], time.perf_counter()
        for image in tqdm(images, desc=name, unit="image", leave=False):
            files.append(encoded(image, name))  # decodes it again and checks: part of the time
        encode_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for data in files:
            with Image.open(io.BytesIO(data)) as opened:
                opened.load()
        decode_seconds = time.perf_counter() - started
        total = sum(map(len, files))
        results[name] = {"bytes": total, "bits_per_dim": 8 * total / images.size,
                         "settings": CODECS[name][1], "encode_and_check_images_per_second": len(images) / encode_seconds,
                         "decode_images_per_second": len(images) / decode_seconds}
    return results


def model_bits(model, images: np.ndarray) -> float:
    """The model's NLL of the images in bits (one teacher-forced pass; imagetx.evaluate's)."""
    return evaluate(model, torch.from_numpy(images), None, batch_size=100, progress=False)["bpd"] * images.size


def coded(model, images: np.ndarray) -> dict:
    """One imagetx file of ``images``: its bytes, the model's bits, the times each way."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    data, stats = compress_with_stats(model, images, batch=len(images))
    encode_seconds = time.perf_counter() - started
    started = time.perf_counter()
    back = decompress(model, data)
    decode_seconds = time.perf_counter() - started
    bits = model_bits(model, images)
    return {"images": len(images), "bytes": len(data), "model_bits": bits, "ideal_bits": stats.ideal_bits,
            "overhead_percent": 100 * (8 * len(data) / bits - 1), "exact": bool(np.array_equal(back, images)),
            "compress_seconds": encode_seconds, "decompress_seconds": decode_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default=str(ROOT / "pretrained" / "completion"))
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "cifar10"))
    parser.add_argument("--count", type=int, default=VAL_IMAGES)
    parser.add_argument("--single", type=int, default=20)
    parser.add_argument("--file", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    images = val_images(Path(args.data), args.count)
    model = load_model(args.ckpt)
    result = {"ckpt": args.ckpt, "images": len(images), "torch": torch.__version__}
    result["model_bits_per_dim"] = model_bits(model, images) / images.size
    result["classical"] = classical(images)
    if args.single:  # 0: left out (the sizes over many images need no files of one)
        singles = [coded(model, images[i:i + 1]) for i in tqdm(range(args.single), desc="files of 1", unit="file")]
        bytes_single, bits_single = sum(s["bytes"] for s in singles), sum(s["model_bits"] for s in singles)
        result["single"] = {"files": len(singles), "bits_per_dim": 8 * bytes_single / (len(singles) * images[0].size),
                            "model_bits_per_dim": bits_single / (len(singles) * images[0].size),
                            "overhead_percent": 100 * (8 * bytes_single / bits_single - 1),
                            "overhead_bytes_per_file": (bytes_single - bits_single / 8) / len(singles),
                            "exact": all(s["exact"] for s in singles),
                            "compress_images_per_second": len(singles) / sum(s["compress_seconds"] for s in singles),
                            "decompress_images_per_second": len(singles) / sum(s["decompress_seconds"] for s in singles)}
    if args.file:  # 0: left out (experiments/compress_roundtrip.py codes files of 100 too)
        batch = coded(model, images[:args.file])
        batch["bits_per_dim"] = 8 * batch["bytes"] / images[:args.file].size
        batch["model_bits_per_dim"] = batch["model_bits"] / images[:args.file].size
        batch["compress_images_per_second"] = args.file / batch["compress_seconds"]
        batch["decompress_images_per_second"] = args.file / batch["decompress_seconds"]
        result["file"] = batch
    result["dims_per_image"] = int(images[0].size)
    emit(result, args.json)


if __name__ == "__main__":
    main()
