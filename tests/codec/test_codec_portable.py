"""Files that travel (docs/compress.md, "Files that travel"): ``imagetx-compress`` codes with
portable arithmetic, so a file made on one machine decodes on another. Two machines are played
by two processes of this one that differ in ATen's CPU kernels and MKL's instruction set, as an
AVX-512 and an AVX2 machine (or an AVX2 machine and one without) differ; the commands run as
programs, restarting themselves with the arithmetic they need. The control, native kernels,
fails there with one line saying why."""

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


def machines() -> tuple[dict, dict]:
    best = torch.backends.cpu.get_cpu_capability()
    if best not in MACHINES:
        pytest.skip(f"this CPU's best ATen kernels are {best}: two machines need AVX2 or AVX-512 here")
    return MACHINES[best]


def command(name: str, *args: str, machine: dict[str, str]) -> subprocess.CompletedProcess:
    """``python -m imagetx.NAME ARGS`` as a program on ``machine``: a fresh environment without the
    portable settings or a restart's mark, so that the command sets them itself."""
    env = {key: value for key, value in os.environ.items() if key not in (*PORTABLE_ENVIRONMENT, RESTARTED)}
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
    coded_with = coder["ATEN_CPU_CAPABILITY"].upper()
    assert error.startswith("error: ") and "does not decode here" in error, error
    assert f"coded with other arithmetic, native {coded_with} kernels" in error, error


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
