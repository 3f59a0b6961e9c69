"""The memory the training data takes in a run of several processes on one machine: a synthetic
downsampled ImageNet (docs/data.md's layout, npz batch files), read by N processes at once as
training reads it (``ImageDataModule.dataset("train")``), every image then touched.

    python -m scripts.data_memory --images 100000 --side 64 --processes 2 --json data_memory.json

Reported for each process: how much its proportional set size (PSS: shared pages split among the
processes that map them) grew, and the peak of what Python allocated while reading (tracemalloc:
numpy's arrays), each as a multiple of the training images' bytes. Each pool is memory-mapped
(imagetx/data/sources/mapped.py): two processes should each grow by about half the data, and the one
that writes the mapped copy should peak at about the data and one batch file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

FILES = 10  # batch files, as the official release has (train_data_batch_1 ... _10)


def make_data(root: Path, images: int, side: int, seed: int = 0) -> int:
    """``images`` random images of ``side`` in FILES npz batch files under ``root``; returns their bytes."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for index, count in enumerate(np.array_split(np.arange(images), FILES), start=1):
        data = rng.integers(0, 256, size=(len(count), 3 * side * side), dtype=np.uint8)
        labels = rng.integers(1, 1001, size=len(count))
        np.savez(root / f"train_data_batch_{index}.npz", data=data, labels=labels)
    return images * side * side * 3


def pss_bytes() -> int:
    """This process's proportional set size, from /proc/self/smaps_rollup (Linux)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss line in /proc/self/smaps_rollup")


def wait_for(paths: list[Path]) -> None:
    while not all(path.exists() for path in paths):
        time.sleep(0.05)


def worker(root: str, out: str, processes: int) -> None:
    """One process: read the training split as training does, touch every image, write the figures,
    measured once every process maps the pool (PSS splits a page among those that map it then)."""
    from imagetx.data.datamodule import ImageDataModule

    data = ImageDataModule(root=root, source="imagenet", val_size=0)
    before = pss_bytes()
    tracemalloc.start()
    dataset = data.dataset("train")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    checksum = int(dataset.images.sum(dtype=np.int64) if isinstance(dataset.images, np.ndarray)
                   else dataset.images.sum(dtype=__import__("torch").int64))  # every page read
    folder = Path(out).parent
    Path(f"{out}.ready").touch()
    wait_for([folder / f"process{rank}.json.ready" for rank in range(processes)])
    Path(out).write_text(json.dumps({"pss_growth": pss_bytes() - before, "read_peak": peak,
                                     "images": len(dataset), "checksum": checksum}))
    wait_for([folder / f"process{rank}.json" for rank in range(processes)])  # the pool stays mapped till then


def main(args: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m scripts.data_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args(args)
    if options.worker:
        worker(options.worker[0], options.worker[1], int(options.worker[2]))
        return {}
    folder = Path(tempfile.mkdtemp(prefix="data_memory_"))
    try:
        size = make_data(folder / "imagenet", options.images, options.side)
        outs = [folder / f"process{rank}.json" for rank in range(options.processes)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        processes = [subprocess.Popen([sys.executable, "-m", "scripts.data_memory", "--worker",
                                       str(folder / "imagenet"), str(out), str(options.processes)], env=env)
                     for out in outs]
        if any(process.wait() for process in processes):
            raise SystemExit("error: a reading process failed (its traceback is above)")
        results = [json.loads(out.read_text()) for out in outs]
        summary = {"images": options.images, "side": options.side, "processes": options.processes,
                   "data_bytes": size, "pss_growth_x": [round(r["pss_growth"] / size, 3) for r in results],
                   "read_peak_x": [round(r["read_peak"] / size, 3) for r in results],
                   "same_images": len({r["checksum"] for r in results}) == 1}
        print(f"{options.processes} processes, {options.images:,} images of {options.side}x{options.side} "
              f"({size / 2**30:.2f} GiB): PSS grew by {summary['pss_growth_x']} x the data, reading peaked at "
              f"{summary['read_peak_x']} x")
        if options.json:
            options.json.write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
