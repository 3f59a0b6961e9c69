"""The floating-point arithmetic a file is coded with (docs/compress.md, "Files that travel").

The decoder must compute, bit for bit, the distributions the encoder computed. On one machine it
does; on another, torch's CPU kernels may round differently, because two of the libraries under
them choose their code by the CPU they find when they start:

* ATen picks a kernel per CPU capability (DEFAULT, AVX2, AVX512: SLEEF's vectorised exp and log,
  other summation orders). ``ATEN_CPU_CAPABILITY=default`` makes it use the kernels compiled for
  every x86-64 CPU.
* MKL, torch's BLAS on x86-64 (every linear layer: SGEMM), picks a code path per CPU.
  ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical reproducibility) makes it take the one
  path every x86-64 CPU runs, Intel's or another vendor's (Intel's documentation; tested here
  on one vendor's CPU at a time: docs/compress.md).

No oneDNN primitive runs while coding (ONEDNN_VERBOSE lists none). Under the baseline kernels
the network's float32 exp, erf, ... are glibc's, which glibc too picks by CPU (FMA or not): the
two gave the same bits where measured (docs/compress.md), which is not a proof. The codec's
float64 step after the network uses neither libm nor MKL (float64.py). Each
setting is read once, when its library first runs (ATen at its first dispatch, MKL at its
first call, which may come before any coding: scoring, sampling), so they belong in the
environment the process starts with: the ``imagetx-compress`` and ``imagetx-decompress``
commands restart themselves with them (``restart_with``); a Python program is started with
them. Setting them later changes nothing that has run, so ``current`` asks each library for
the mode it runs in (ATen: ``get_cpu_capability``; MKL: ``mkl_cbwr_get``), not the
environment.

"Portable" arithmetic is both settings on torch's MKL build (x86-64): its files decode on any
x86-64 machine with the same torch. "Native" is anything else: its files decode where the
kernels are the same (the same CPU kind, the same torch build).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

PORTABLE_ENVIRONMENT = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
PORTABLE_COMMAND = " ".join(f"{name}={value}" for name, value in PORTABLE_ENVIRONMENT.items())
# ATen's name for the kernels compiled for every CPU of the architecture.
BASELINE_KERNELS = "DEFAULT"
# Set in the environment of a command that restarted itself, so that it restarts at most once.
RESTARTED = "IMAGETX_ARITHMETIC_RESTARTED"
# MKL's own answer to which code branch it runs: mkl_cbwr_get(MKL_CBWR_BRANCH), MKL_CBWR_COMPATIBLE
# for MKL_CBWR=COMPATIBLE (mkl_types.h's values). torch links MKL into libtorch_cpu, which exports
# the function as mkl_serv_cbwr_get. The first call fixes the branch as MKL's first use would
# (from the environment then), so the answer is the branch every later MKL call takes.
MKL_CBWR_BRANCH = 1
MKL_CBWR_COMPATIBLE = 3
MKL_CBWR_QUERIES = ("mkl_serv_cbwr_get", "mkl_cbwr_get", "MKL_CBWR_Get")
# Linux's record of the environment a process started with (exec's), which os.environ's later
# changes do not touch: where MKL cannot be asked, MKL_CBWR counts only if it was there at the start.
STARTUP_ENVIRONMENT = Path("/proc/self/environ")


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


@functools.cache
def mkl_cbwr_query() -> Callable[[int], int] | None:
    """MKL's ``mkl_cbwr_get`` in this torch's MKL, or None where no library exports it."""
    libraries = [Path(torch.__file__).parent / "lib" / "libtorch_cpu.so", None]  # None: the process's own symbols
    for library in libraries:
        try:
            handle = ctypes.CDLL(str(library) if library else None)
        except OSError:
            continue
        for name in MKL_CBWR_QUERIES:
            query = getattr(handle, name, None)
            if query is not None:
                query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int]
                return query
    return None


def startup_environment() -> dict[str, str] | None:
    """The environment this process started with (Linux), or None where it cannot be read."""
    try:
        entries = STARTUP_ENVIRONMENT.read_bytes().split(b"\0")
    except OSError:
        return None
    pairs = (entry.decode(errors="replace").partition("=") for entry in entries if entry)
    return {name: value for name, _, value in pairs}


def mkl_reproducible() -> bool:
    """Whether MKL runs its compatible branch (MKL_CBWR=COMPATIBLE in effect): MKL's own answer;
    where it cannot be asked, the setting in the environment both at the process's start and
    now (never the environment alone: MKL may have read it before it was set)."""
    if not torch.backends.mkl.is_available():
        return False
    query = mkl_cbwr_query()
    if query is not None:
        return query(MKL_CBWR_BRANCH) == MKL_CBWR_COMPATIBLE
    started = startup_environment() or {}
    return started.get("MKL_CBWR") == os.environ.get("MKL_CBWR") == PORTABLE_ENVIRONMENT["MKL_CBWR"]


def current() -> Arithmetic:
    """The arithmetic this process computes with, as ATen and MKL run it (not as the environment
    says now: each read its setting once, when it first ran)."""
    kernels = torch.backends.cpu.get_cpu_capability()
    return Arithmetic(kernels == BASELINE_KERNELS and mkl_reproducible(), platform.machine(), kernels,
                      torch.__version__)


def not_portable_reason(here: Arithmetic) -> str:
    """Why ``here`` is not portable, and the fix, as the end of a one-line message."""
    if not torch.backends.mkl.is_available():
        return (f"this torch has no MKL (portable arithmetic needs torch's x86-64 build), so its files decode "
                f"only on machines like this one ({here})")
    if here.kernels == BASELINE_KERNELS and os.environ.get("MKL_CBWR") == PORTABLE_ENVIRONMENT["MKL_CBWR"]:
        return (f"MKL runs its CPU's own code path, not MKL_CBWR=COMPATIBLE's: it read MKL_CBWR when it first ran, "
                f"before the setting was made, so files of this process decode only on machines like this one: "
                f"start Python with {PORTABLE_COMMAND} in the environment (imagetx-compress does)")
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
