"""Files of the current compressed-file format, kept in tests/assets/codec_formatN/ so that later
formats' decoders are tested against files an earlier tree wrote (issue 125 step 7): the shipped
completion model's (1D local, rotary, DMOL) file of the first two val images, and two tiny
models (2D local with a categorical head; full attention with a DMOL head) saved beside their
files of two random images. Run once, by the tree whose format the files are to hold:

    .venv/bin/python experiments/codec_format_assets.py tests/assets/codec_format6

It calls ``imagetx-compress`` (portable arithmetic: the files decode on any x86-64 machine with the
same torch) and prints each file's format and size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from imagetx import ModelConfig, build_model
from imagetx.codec import read_header
from imagetx.io.hub import save_pretrained

TINY = dict(image_size=8, n_layers=2, d_model=32, d_filter=64, dropout=0.0, norm="pre", position_encoding="learned",
            mixture_components=2)
MODELS = {
    "tiny_local2d": dict(TINY, head="categorical",
                         attention=dict(n_heads=2, kind="local_2d", query_block_shape=(2, 6), memory_flange=(2, 3),
                                        relative_positions="rotary")),
    "tiny_full": dict(TINY, head="dmol", attention=dict(n_heads=2, kind="full")),
}


def compress(ckpt: Path, images: Path, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "imagetx.compress", "--ckpt", str(ckpt), "--out", str(out), "--force",
                    "--compare", "false", "--progress", "false", str(images)], check=True)
    header = read_header(out.read_bytes())
    print(f"{out}: format {header.version}, {header.arithmetic}, {out.stat().st_size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:  # the val images are tests/assets/cifar10_val_first32.npz's
        val = Path(scratch) / "val_first2.npz"
        np.savez(val, images=np.load("tests/assets/cifar10_val_first32.npz")["images"][:2])
        compress(Path("pretrained/completion"), val, out / "completion_val_first2.itx")
    for seed, (name, config) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        model = build_model(ModelConfig.from_dict(config)).eval()
        save_pretrained(model, out / name, card=f"A random {name} model: a compressed-file format's test asset.")
        images = np.random.default_rng(seed).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
        np.savez(out / f"{name}_images.npz", images=images)
        compress(out / name, out / f"{name}_images.npz", out / f"{name}.itx")


if __name__ == "__main__":
    main()
