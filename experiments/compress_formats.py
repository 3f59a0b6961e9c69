"""The compressed file's format 1 against format 2 (docs/compress.md, "How it codes"): the same
images in one file each way, with the shipped completion model. Format 1 let constriction
re-quantise the integer frequencies; format 2 codes with exactly them, so its ``ideal_bits``
(the sum of -log2(frequency / 2**24)) is what its payload costs, up to the coder's rounding.

    .venv/bin/python -m experiments.compress_formats [--ckpt pretrained/completion]
        [--data ../shared/cifar10] [--images val|noise] [--count 29] [--json out.json]

``val``: the first ``--count`` val images; ``noise``: that many images of uniform noise (seed 0),
where the least frequencies are common. Every file is decompressed and compared. The last line
printed is one JSON object: per format the file's bytes, its payload's bits, ``ideal_bits`` and
their difference, and the model's own bits of the images.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch

import imagetx.codec.api as codec_api
from experiments.compress_roundtrip import val_images
from experiments.json_result import emit
from imagetx.codec import compress_with_stats, decompress
from imagetx.codec.container import READ_VERSIONS, TRAILER, header_size
from imagetx.io.load import load_model

ROOT = Path(__file__).resolve().parents[1]
SIDE = 32  # CIFAR-10's images, the shipped model's size


def code(model, images: np.ndarray, version: int) -> dict:
    """One file of ``images`` in format ``version``: its bytes and bits against ``ideal_bits``."""
    codec_api.FORMAT_VERSION = version  # what compress writes; decompress reads the file's own
    data, stats = compress_with_stats(model, images)
    if data[len(b"ITXC")] != version or not np.array_equal(decompress(model, data), images):
        raise AssertionError(f"format {version}: the file does not give the images back")
    # the header and its CRC: 50 bytes, 115 from format 3 on (it records the arithmetic), 119 from
    # format 5 on (the length of its names list, empty here: images from Python have no names)
    header = header_size(version)
    payload_bits = 8 * (len(data) - header - TRAILER.size)
    return {"file_bytes": len(data), "payload_bits": payload_bits, "ideal_bits": round(stats.ideal_bits, 1),
            "payload_minus_ideal_bits": round(payload_bits - stats.ideal_bits, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default=str(ROOT / "pretrained" / "completion"))
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "cifar10"))
    parser.add_argument("--images", choices=("val", "noise"), default="val")
    parser.add_argument("--count", type=int, default=29)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.ckpt)
    if args.images == "val":
        images = val_images(Path(args.data), args.count)
    else:
        images = np.random.default_rng(0).integers(0, 256, (args.count, SIDE, SIDE, 3), dtype=np.uint8)
    with torch.no_grad():
        model_bits = float(model.nll(torch.from_numpy(images)).sum()) / math.log(2)
    formats = {f"format_{version}": code(model, images, version) for version in READ_VERSIONS}
    emit({"images": args.images, "count": len(images), "model_bits": round(model_bits, 1), **formats}, args.json)


if __name__ == "__main__":
    main()
