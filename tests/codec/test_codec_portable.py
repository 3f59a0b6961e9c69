"""Files that travel (docs/compress.md, "Files that travel"): ``imagetx-compress`` codes with
portable arithmetic, so a file made on one machine decodes on another. Two machines are played
by two processes of this one that differ in what differs between two CPUs of this vendor, as an
AVX-512 and an AVX2 machine (or an AVX2 machine and one without FMA or AVX2) differ: ATen's CPU
kernels and glibc's libm variant (FMA or not) everywhere, and on Intel CPUs MKL's instruction
set too (MKL_ENABLE_INSTRUCTIONS; on AMD CPUs MKL ignores it, which a control checks). The
commands run as programs, restarting themselves with the arithmetic they need. The control,
native kernels, is refused there before decoding, with one line saying why. And a process whose MKL started without
MKL_CBWR=COMPATIBLE never writes a file labelled portable, whatever its environment says later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ASSETS
from imagetx.codec import read_header
from imagetx.codec.arithmetic import PORTABLE_ENVIRONMENT, RESTARTED

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "pretrained" / "completion"
# Two machines, by this CPU's best ATen capability: the kernels and MKL instruction set each runs with.
MACHINES = {"AVX512": ({"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
                       {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
            "AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                     {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})}
# The second machine has no FMA either: glibc's libm then runs its non-FMA variants (the x86-64 CPU
# features its dispatch chooses by, masked).
NO_FMA = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F"}
INTEL = "GenuineIntel"


def vendor() -> str:
    """The CPU's vendor as Linux lists it (GenuineIntel, AuthenticAMD, ...)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "unknown")


def machines() -> tuple[dict, dict]:
    """Two machines of this CPU's vendor. MKL chooses its code by MKL_ENABLE_INSTRUCTIONS only on
    Intel CPUs (elsewhere it ignores it: ``test_control_mkl_ignores_its_instruction_set_on_other_cpus``),
    so only there is it a difference between the two."""
    best = torch.backends.cpu.get_cpu_capability()
    if best not in MACHINES:
        pytest.skip(f"this CPU's best ATen kernels are {best}: two machines need AVX2 or AVX-512 here")
    first, second = MACHINES[best]
    if vendor() != INTEL:
        first, second = ({key: value for key, value in machine.items() if key != "MKL_ENABLE_INSTRUCTIONS"}
                         for machine in (first, second))
    return first, {**second, **NO_FMA}


def command(name: str, *args: str, machine: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m imagetx.NAME ARGS`` as a program on ``machine``: a fresh environment without the
    portable settings or a restart's mark, so that the command sets them itself."""
    env = {key: value for key, value in os.environ.items()
           if key not in (*PORTABLE_ENVIRONMENT, RESTARTED, "MKL_ENABLE_INSTRUCTIONS", "GLIBC_TUNABLES")}
    return subprocess.run([sys.executable, "-m", f"imagetx.{name}", *args, "--progress", "false"], cwd=REPO,
                          env={**env, **machine, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)


def round_trip(tmp_path: Path, coder: dict, decoder: dict, portable: bool) -> tuple[np.ndarray, str]:
    """One val image compressed on ``coder``, decompressed on ``decoder`` -> (the image, the
    decoder's last line on stderr: empty where it decoded)."""
    images = np.load(ASSETS / "cifar10_val_first32.npz")["images"][:1]
    np.savez(tmp_path / "in.npz", images=images)
    itx, out = tmp_path / "one.itx", tmp_path / "out.npz"
    coded = command("compress", str(tmp_path / "in.npz"), "--ckpt", str(SHIPPED), "--out", str(itx), "--force",
                    "--portable", str(portable).lower(), machine=coder)
    assert coded.returncode == 0, coded.stderr
    assert read_header(itx.read_bytes()).arithmetic.portable is portable
    decoded = command("decompress", str(itx), "--ckpt", str(SHIPPED), "--out", str(out), "--force", machine=decoder)
    if decoded.returncode:
        return images, decoded.stderr.strip().splitlines()[-1]
    assert np.array_equal(np.load(out)["images"], images)
    return images, ""


@pytest.mark.parametrize("direction", ["first_to_second", "second_to_first"])
def test_a_portable_file_decodes_on_the_other_machine(tmp_path, direction):
    first, second = machines()
    coder, decoder = (first, second) if direction == "first_to_second" else (second, first)
    _, error = round_trip(tmp_path, coder, decoder, portable=True)
    assert error == ""


@pytest.mark.parametrize("direction", ["first_to_second", "second_to_first"])
def test_control_a_native_file_does_not_and_says_why_in_one_line(tmp_path, direction):
    first, second = machines()
    coder, decoder = (first, second) if direction == "first_to_second" else (second, first)
    _, error = round_trip(tmp_path, coder, decoder, portable=False)
    coded_with, decoding_with = (machine["ATEN_CPU_CAPABILITY"].upper() for machine in (coder, decoder))
    assert error.startswith("error: "), error
    assert f"coded with native {coded_with} kernels" in error and f"computes with native {decoding_with} kernels" \
        in error and "decodes only where they are the same" in error, error  # (issue 124: after a whole decode)


def test_the_committed_portable_file_decodes_on_every_machine(tmp_path):
    """tests/assets/completion_val_first2_portable.itx: the first two val images, compressed with
    the shipped completion model by ``imagetx-compress`` (portable arithmetic, torch 2.14.1). With
    that torch it decodes here, whatever the CPU; with another torch, whose kernels may differ,
    it decodes or says in one line which torch coded it."""
    data = ASSETS / "completion_val_first2_portable.itx"
    recorded = read_header(data.read_bytes()).arithmetic
    assert recorded.portable and recorded.kernels == "DEFAULT"
    out = tmp_path / "out.npz"
    decoded = command("decompress", str(data), "--ckpt", str(SHIPPED), "--out", str(out), machine={})
    if recorded.torch == torch.__version__ or decoded.returncode == 0:
        assert decoded.returncode == 0, decoded.stderr
        expected = np.load(ASSETS / "cifar10_val_first32.npz")["images"][:2]
        assert np.array_equal(np.load(out)["images"], expected)
    else:
        assert f"torch {recorded.torch}" in decoded.stderr.strip().splitlines()[-1], decoded.stderr


# float32 products of the shipped model's shapes (a decoding step's projections), by MKL's SGEMM,
# in a process of the given MKL setting: their bits, to compare between two processes of this machine.
SGEMM = """
import sys, numpy as np, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(8, 128, generator=g), torch.randn(128, 512, generator=g)
np.save(sys.argv[1], (a @ b).numpy())
"""


def test_control_mkl_ignores_its_instruction_set_on_other_cpus(tmp_path):
    """Why the two machines differ in MKL_ENABLE_INSTRUCTIONS only on Intel CPUs: elsewhere MKL
    computes the same bits under AVX512, AVX2 and SSE4_2 (the issue measured a model's
    parameters bitwise equal). Where this fails, MKL does choose by it here: vary it."""
    if vendor() == INTEL:
        pytest.skip("an Intel CPU: MKL chooses its code by MKL_ENABLE_INSTRUCTIONS, and the machines vary it")
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    env = {key: value for key, value in os.environ.items() if key not in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")}
    products = []
    for instructions in ("AVX512", "AVX2", "SSE4_2"):
        path = tmp_path / f"{instructions}.npy"
        run = subprocess.run([sys.executable, "-c", SGEMM, str(path)], env={**env, "MKL_ENABLE_INSTRUCTIONS": instructions},
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        products.append(np.load(path))
    assert all(np.array_equal(product.view(np.int32), products[0].view(np.int32)) for product in products)


# A program started without MKL_CBWR that scores (MKL's first run) and only then sets it, as in
# issue 111: MKL runs its own code path, so compress must not write a file labelled portable.
LATE_SETTING = """
import os, sys, numpy as np, torch
from imagetx.codec import CodecError, compress, decompress, read_header
from imagetx.io.load import load_model
torch.set_num_threads(1)
model = load_model(sys.argv[1])
images = np.load(sys.argv[2])["images"][:1]
with torch.no_grad():
    model.nll(torch.from_numpy(images))
os.environ["MKL_CBWR"] = "COMPATIBLE"
try:
    compress(model, images)
    print("written portable")
except CodecError as error:
    print("refused:", error)
data = compress(model, images, portable=False)
print("label:", read_header(data).arithmetic)
assert (decompress(model, data) == images).all()
print("decoded")
"""


def test_mkl_cbwr_set_after_mkl_ran_gives_no_portable_file(tmp_path):
    """Before issue 111 the file was written and labelled portable (the environment said
    MKL_CBWR=COMPATIBLE), and imagetx-decompress refused it: MKL had run its own code path. Now
    compress asks MKL which path it runs: it refuses in one line naming the fix, and a native
    file (portable=False) says so and decodes."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL: it has no portable arithmetic")
    env = {key: value for key, value in os.environ.items() if key not in (*PORTABLE_ENVIRONMENT, RESTARTED)}
    run = subprocess.run([sys.executable, "-c", LATE_SETTING, str(SHIPPED), str(ASSETS / "cifar10_val_first32.npz")],
                         cwd=REPO, env={**env, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    refused, label, decoded = run.stdout.strip().splitlines()
    assert refused.startswith("refused: MKL runs its CPU's own code path"), refused
    assert f"start Python with {' '.join(f'{k}={v}' for k, v in PORTABLE_ENVIRONMENT.items())}" in refused
    assert label == f"label: native DEFAULT kernels (x86_64, torch {torch.__version__})" and decoded == "decoded"


# Files each format wrote (experiments/codec_format_assets.py, at the tree of that format), each with
# its model and its images: (file, model, images and which of them). The tiny models and their images
# are format 6's for both (format 7's tree saved the same bytes).
TINY = ASSETS / "codec_format6"
EARLIER_FORMATS = [case for version in (6, 7) for case in [
    (f"codec_format{version}/completion_val_first2.itx", SHIPPED, ("cifar10_val_first32.npz", slice(0, 2))),
    (f"codec_format{version}/tiny_local2d.itx", TINY / "tiny_local2d", ("codec_format6/tiny_local2d_images.npz", slice(None))),
    (f"codec_format{version}/tiny_full.itx", TINY / "tiny_full", ("codec_format6/tiny_full_images.npz", slice(None)))]]


@pytest.mark.parametrize("name, model, images", EARLIER_FORMATS, ids=[case[0] for case in EARLIER_FORMATS])
def test_files_of_earlier_formats_decode(tmp_path, name, model, images):
    """Each committed file of formats 6 and 7 (1D local with rotary and DMOL; 2D local, categorical;
    full attention, DMOL) decodes to its images with the arithmetic its format was coded with, as
    the committed portable file does: with the torch that coded it, here, whatever the CPU."""
    data = ASSETS / name
    recorded = read_header(data.read_bytes()).arithmetic
    out = tmp_path / "out.npz"
    decoded = command("decompress", str(data), "--ckpt", str(model), "--out", str(out), machine={})
    if recorded.torch == torch.__version__ or decoded.returncode == 0:
        assert decoded.returncode == 0, decoded.stderr
        source, which = images
        assert np.array_equal(np.load(out)["images"], np.load(ASSETS / source)["images"][which])
    else:
        assert f"torch {recorded.torch}" in decoded.stderr.strip().splitlines()[-1], decoded.stderr
