"""Files that travel (docs/compress.md, "Files that travel"): the codec under portable arithmetic
against the machine's native kernels, each in its own process, as two machines would run it.

    .venv/bin/python -m experiments.codec_arithmetic [--ckpt pretrained/completion] [--count 8]
        [--data ../shared/cifar10] [--json out.json]

Reported: (1) CPU seconds (the process's, on one thread: what other work on the machine changes
least) to compress the first ``--count`` val images and to complete the first (4 samples of its
top half), native and portable, each in a process of its own (the import is not timed); (2) which libraries' kernels the coding reaches under portable arithmetic: MKL's
functions (MKL_VERBOSE) and oneDNN's primitives (ONEDNN_VERBOSE), counted; (3) a file compressed
in one "machine" and decompressed in the other, both ways, native and portable: the machines are
this one's best and next ATen capability and MKL instruction set (AVX512 / AVX2, or AVX2 / the
baseline). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

from experiments.json_result import emit
from imagetx.codec.arithmetic import PORTABLE_ENVIRONMENT as PORTABLE

ROOT = Path(__file__).resolve().parents[1]
VAL_IMAGES = 5000  # CIFAR-10's val split: the last 5,000 training images (data/sources/cifar10.py)
# Two machines on this one: the ATen capability and MKL instruction set each runs with, by the
# best capability this CPU has.
MACHINES = {"AVX512": ({"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
                       {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
            "AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                     {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})}


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in PORTABLE}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def worker(args: argparse.Namespace) -> None:
    """In this process: time compression and completion; the result as JSON on the last line."""
    import numpy as np
    import torch

    from imagetx.codec import compress
    from imagetx.codec.arithmetic import current
    from imagetx.io.load import load_model
    from imagetx.model.sampler import sample

    model = load_model(ROOT / args.ckpt)
    with np.load(Path(args.data) / "train-4.npz") as shard:
        images = shard["images"][-VAL_IMAGES:][:args.count]
    started = time.process_time()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON) if args.census else nullcontext():
        data = compress(model, images, portable=False)
    coding = time.process_time() - started
    started = time.process_time()
    if not args.census:
        torch.manual_seed(0)
        sample(model, 4, prefix=torch.from_numpy(images[:1]).expand(4, -1, -1, -1),
               given_rows=model.config.image_size // 2)
    completing = time.process_time() - started
    print(json.dumps({"arithmetic": str(current()), "bytes": len(data), "compress_s": round(coding, 2),
                      "complete_4_s": round(completing, 2)}))


def run_worker(args: argparse.Namespace, extra: dict[str, str], census: bool = False) -> tuple[dict, str]:
    command = [sys.executable, "-m", "experiments.codec_arithmetic", "--worker", "--ckpt", args.ckpt,
               "--count", str(args.count), "--data", args.data] + (["--census"] if census else [])
    env = environment({**extra, **({"MKL_VERBOSE": "1"} if census else {})})
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def census(output: str) -> dict[str, int]:
    """MKL functions and oneDNN primitives run, counted, from their verbose lines."""
    counts = Counter()
    for line in output.splitlines():
        if line.startswith("MKL_VERBOSE ") and "(" in line:
            counts["MKL " + line.split()[1].split("(")[0]] += 1
        elif line.startswith("onednn_verbose") and ",exec," in line:
            counts["oneDNN " + line.split(",")[5]] += 1
    return dict(counts)


def cli(command: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"imagetx.{command}", *args, "--progress", "false"],
                          env=environment(env), cwd=ROOT, capture_output=True, text=True)


def travel(args: argparse.Namespace, best: str) -> list[dict]:
    """Compressed on one machine, decompressed on the other, both ways, native and portable."""
    first, second = MACHINES[best]
    results = []
    with tempfile.TemporaryDirectory() as folder:
        import numpy as np

        with np.load(Path(args.data) / "train-4.npz") as shard:
            np.savez(Path(folder) / "in.npz", images=shard["images"][-VAL_IMAGES:][:args.count])
        for portable in (True, False):
            for coder, decoder in ((first, second), (second, first)):
                itx, out = Path(folder) / "x.itx", Path(folder) / "out.npz"
                cli("compress", str(Path(folder) / "in.npz"), "--ckpt", args.ckpt, "--out", str(itx), "--force",
                    "--portable", str(portable).lower(), env=coder).check_returncode()
                done = cli("decompress", str(itx), "--ckpt", args.ckpt, "--out", str(out), "--force", env=decoder)
                exact = done.returncode == 0 and bool(
                    (np.load(out)["images"] == np.load(Path(folder) / "in.npz")["images"]).all())
                error = done.stderr.strip().splitlines()[-1] if done.returncode else ""
                results.append({"portable": portable, "compressed_with": coder, "decompressed_with": decoder,
                                "exact": exact, "error": error})
                out.unlink(missing_ok=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default="pretrained/completion")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "cifar10"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--census", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    best = torch.backends.cpu.get_cpu_capability()
    if best not in MACHINES:
        sys.exit(f"this CPU's best ATen capability is {best}: the two-machine check needs AVX2 or AVX512")
    native, _ = run_worker(args, {})
    portable, _ = run_worker(args, PORTABLE)
    _, verbose = run_worker(args, PORTABLE, census=True)
    result = {"ckpt": args.ckpt, "count": args.count, "native": native, "portable": portable,
              "portable_over_native": {key: round(portable[key] / native[key], 3)
                                       for key in ("compress_s", "complete_4_s")},
              "portable_census": census(verbose), "travel": travel(args, best)}
    for name in ("native", "portable"):
        print(f"{name:9s} {result[name]['arithmetic']}: compress {result[name]['compress_s']} CPU s, "
              f"complete 4 {result[name]['complete_4_s']} CPU s")
    print("portable coding reaches:", result["portable_census"])
    for row in result["travel"]:
        print(f"portable={row['portable']!s:5s} {row['compressed_with']} -> {row['decompressed_with']}: "
              f"{'exact' if row['exact'] else row['error']}")
    emit(result, args.json)


if __name__ == "__main__":
    main()
