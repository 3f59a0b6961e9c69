"""The floating-point arithmetic a file is coded with (docs/compress.md, "Files that travel").

The decoder must compute, bit for bit, the distributions the encoder computed. On one machine it
does; on another, torch's CPU kernels may round differently, because two of the libraries under
them choose their code by the CPU they find when they start:

* ATen picks a kernel per CPU capability (DEFAULT, AVX2, AVX512: SLEEF's vectorised exp and log,
  other summation orders). ``ATEN_CPU_CAPABILITY=default`` makes it use the kernels compiled for
  every x86-64 CPU.
* MKL, torch's BLAS on x86-64 (every linear layer: SGEMM; the DMOL head's float64 products:
  DGEMM_BATCH), picks a code path per CPU. ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical
  reproducibility) makes it take the one path every x86-64 CPU runs.

No oneDNN primitive runs while coding (ONEDNN_VERBOSE lists none), so nothing else chooses by
CPU. Both settings are read when torch and MKL start, so they must be in the environment before
torch is imported: the ``imagetx-compress`` and ``imagetx-decompress`` commands restart
themselves with them (``restart_with``); a Python program is started with them.

"Portable" arithmetic is both settings on torch's MKL build (x86-64): its files decode on any
x86-64 machine with the same torch. "Native" is anything else: its files decode where the
kernels are the same (the same CPU kind, the same torch build).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

import torch

PORTABLE_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
PORTABLE_COMMAND = " ".join(f"{name}={value}" for name, value in PORTABLE_ENVIRONMENT.items())
# ATen's name for the kernels compiled for every CPU of the architecture.
BASELINE_KERNELS = "DEFAULT"
# Set in the environment of a command that restarted itself, so that it restarts at most once.
RESTARTED = "IMAGETX_ARITHMETIC_RESTARTED"


@dataclass(frozen=True)
class Arithmetic:
    """What decides the floating point of the coding: the portable settings in effect or not, the
    machine's architecture, ATen's kernels and the torch build."""

    portable: bool
    machine: str  # platform.machine(): x86_64, aarch64, ...
    kernels: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...
    torch: str  # torch.__version__, with its build tag (+cpu, +cu130)

    def __str__(self) -> str:
        kind = "portable arithmetic" if self.portable else f"native {self.kernels} kernels"
        return f"{kind} ({self.machine}, torch {self.torch})"


def current() -> Arithmetic:
    """The arithmetic this process computes with."""
    kernels = torch.backends.cpu.get_cpu_capability()
    mkl_reproducible = torch.backends.mkl.is_available() and os.environ.get("MKL_CBWR") == "COMPATIBLE"
    return Arithmetic(kernels == BASELINE_KERNELS and mkl_reproducible, platform.machine(), kernels,
                      torch.__version__)


def not_portable_reason(here: Arithmetic) -> str:
    """Why ``here`` is not portable, and the fix, as the end of a one-line message."""
    if not torch.backends.mkl.is_available():
        return (f"this torch has no MKL (portable arithmetic needs torch's x86-64 build), so its files decode "
                f"only on machines like this one ({here})")
    return (f"this process computes with {here}, whose files decode only on machines like this one: start "
            f"Python with {PORTABLE_COMMAND} in the environment (imagetx-compress does)")


def environment(portable: bool) -> dict[str, str]:
    """This process's environment with the portable settings set (``portable``) or removed."""
    env = {name: value for name, value in os.environ.items() if name not in PORTABLE_ENVIRONMENT}
    if portable:
        env.update(PORTABLE_ENVIRONMENT)
    env[RESTARTED] = "1"
    return env


def restart_with(portable: bool, module: str) -> None:
    """Run ``python -m module`` with this command's arguments again, in place of this process,
    with the portable settings set or removed, unless this process already computes so or is such
    a restart (it then goes on, and the codec says what is wrong; the mark is not passed on to the
    processes it starts)."""
    if os.environ.pop(RESTARTED, None) or current().portable == portable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], environment(portable))
