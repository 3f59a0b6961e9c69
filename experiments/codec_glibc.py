"""The codec's float64 probabilities under glibc's two libm variants (docs/compress.md, "Files
that travel"): a process with glibc's FMA variants, and one with them masked, as on a CPU
without FMA, both with portable arithmetic; in each, the probabilities of every distribution of
the first ``--count`` val images, computed by this imagetx (codec/float64.py) and as the codec
computed them before issue 111 (torch's float64 functions, glibc's under ATen's baseline
kernels, and a float64 bmm), and their quantised frequencies.

    .venv/bin/python -m experiments.codec_glibc [--ckpt pretrained/completion] [--count 8]
        [--images tests/assets/cifar10_val_first32.npz] [--json out.json]

The last line printed is one JSON object: how many probabilities and frequencies differ between
the two processes, for each way, and between the two ways, and how many frequencies would be
expected to differ an image from the probabilities' differences.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from experiments.json_result import emit
from imagetx.codec.arithmetic import PORTABLE_ENVIRONMENT
from imagetx.codec.distributions import TOTAL
from imagetx.model.config import LEVELS

ROOT = Path(__file__).resolve().parents[1]
NO_FMA = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"}  # glibc's FMA variants masked

# In each process: the probabilities both ways, of the same parameters (this imagetx's coding
# pass decides the values fed back; the images' own, so the same in both ways).
DUMP = r'''
import sys, numpy as np, torch
import imagetx.codec.coder as coder
from imagetx.codec.arithmetic import current
from imagetx.codec.container import FORMAT_VERSION
from imagetx.codec.distributions import PixelDistributions, categorical_probs, quantise
from imagetx.io.load import load_model
from imagetx.model.config import HALF_RANGE, LEVELS
from imagetx.model.heads import HALF_BIN
torch.set_num_threads(1)
assert current().portable, current()

class Before:
    """The DMOL distributions as imagetx computed them before issue 111 (torch's functions)."""
    def __init__(self, head, params):
        logits, self.means, log_scales, self.coeffs = head.split(params.double())
        self.inv_scales = torch.exp(-log_scales)
        self.log_weights = torch.log_softmax(logits, dim=-1)
        self.levels = []
        bins = torch.arange(LEVELS, dtype=torch.float64) / HALF_RANGE - 1.0
        self.edges = (bins[:-1] + HALF_BIN)[None, None, :]
    def mean(self, c):
        x = [level.double() / HALF_RANGE - 1.0 for level in self.levels]
        m = self.means[:, c]
        if c >= 1: m = m + self.coeffs[:, 0 if c == 1 else 1] * x[0][:, None]
        if c == 2: m = m + self.coeffs[:, 2] * x[1][:, None]
        return m
    def channel(self, c):
        m, inv_s = self.mean(c), self.inv_scales[:, c]
        standard = torch.addcmul((-m * inv_s)[:, :, None], inv_s[:, :, None], self.edges)
        cdf = torch.bmm(self.log_weights.exp()[:, None, :], standard.sigmoid_())[:, 0]
        n = cdf.shape[0]
        return torch.diff(cdf, prepend=cdf.new_zeros(n, 1), append=cdf.new_ones(n, 1)).clamp(min=0.0)
    def observe(self, c, levels):
        inv_s = self.inv_scales[:, c]
        centered = (levels.double() / HALF_RANGE - 1.0)[:, None] - self.mean(c)
        upper, lower = inv_s * (centered + HALF_BIN), inv_s * (centered - HALF_BIN)
        ls = torch.nn.functional.logsigmoid
        interior = ls(upper) + ls(-lower) + torch.log(-torch.expm1(-2.0 * HALF_BIN * inv_s))
        lo, hi = (levels == 0)[:, None], (levels == LEVELS - 1)[:, None]
        mass = torch.where(lo, ls(upper), torch.where(hi, ls(-lower), interior))
        self.log_weights = torch.log_softmax(self.log_weights + mass, dim=-1)
        self.levels.append(levels)

now, before = [], []
class Both(PixelDistributions):
    def __init__(self, head, params):
        super().__init__(head, params)
        self.before = Before(head, params)
    def channel(self, c):
        p = super().channel(c)
        now.append(p)
        before.append(self.before.channel(c))
        return p
    def observe(self, c, levels):
        super().observe(c, levels)
        self.before.observe(c, levels)
def categorical(logits):
    p = categorical_probs(logits)
    now.append(p)
    before.append(torch.softmax(logits.double(), dim=-1))
    return p
coder.PixelDistributions, coder.categorical_probs = Both, categorical
model = load_model(sys.argv[2])
images = torch.from_numpy(np.load(sys.argv[3])["images"][:int(sys.argv[4])])
coder.encode_values(model, model.targets(images), coder.constriction.stream.queue.RangeEncoder(), FORMAT_VERSION)
now, before = torch.cat(now), torch.cat(before)
np.savez(sys.argv[1], now=now.numpy(), before=before.numpy(), now_freq=quantise(now).numpy(),
         before_freq=quantise(before).numpy())
'''


def dump(path: Path, ckpt: str, images: str, count: int, variant: dict[str, str]) -> dict[str, np.ndarray]:
    env = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    run = subprocess.run([sys.executable, "-c", DUMP, str(path), ckpt, images, str(count)], cwd=ROOT,
                         env={**env, **PORTABLE_ENVIRONMENT, **variant, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(run.stderr.strip().splitlines()[-1])
    return dict(np.load(path))


def differing(a: np.ndarray, b: np.ndarray) -> int:
    return int((a.view(np.int64) != b.view(np.int64)).sum())


# Relative differences are compared where a probability is at least this: smaller ones cost the
# 24 bits of the least frequency whatever they are (distributions.quantise).
COUNTED_MASS = 2.0 ** -24
FREE = TOTAL - LEVELS  # quantise's scale: floor(p · FREE) + 1


def largest_relative(now: np.ndarray, before: np.ndarray) -> float:
    counted = before >= COUNTED_MASS
    return float(np.max(np.abs(now[counted] - before[counted]) / before[counted]))


def compared(p: np.ndarray, q: np.ndarray, p_freq: np.ndarray, q_freq: np.ndarray, count: int) -> dict:
    """How two ways' probabilities differ: in how many, in how many frequencies, and how many
    frequencies are expected to differ an image: quantise floors p·FREE, so a difference δ in p
    moves it across an integer with chance about FREE·|δ| (the fractional parts spread evenly)."""
    return {"probabilities": differing(p, q), "frequencies": int((p_freq != q_freq).sum()),
            "expected_frequencies_an_image": float(np.abs(p - q).sum() * FREE / count)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default=str(ROOT / "pretrained" / "completion"))
    parser.add_argument("--images", default=str(ROOT / "tests" / "assets" / "cifar10_val_first32.npz"))
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        fma = dump(Path(folder) / "fma.npz", args.ckpt, args.images, args.count, {})
        no_fma = dump(Path(folder) / "no_fma.npz", args.ckpt, args.images, args.count, NO_FMA)
    result = {"count": args.count, "probabilities": int(fma["now"].size)}
    for way in ("now", "before"):
        result[f"{way}_fma_vs_no_fma"] = compared(fma[way], no_fma[way], fma[f"{way}_freq"], no_fma[f"{way}_freq"],
                                                  args.count)
    result["now_vs_before"] = {**compared(fma["now"], fma["before"], fma["now_freq"], fma["before_freq"], args.count),
                               "largest_relative": largest_relative(fma["now"], fma["before"])}
    emit(result, args.json)


if __name__ == "__main__":
    main()
