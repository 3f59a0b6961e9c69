"""A run set up for GPUs on a machine without one: said in one line before anything starts.

Lightning's ``accelerator: auto`` falls to the CPU without a word, where the GPU presets'
settings cost what nobody asked for: bf16 is emulated on CPUs without AMX or AVX512-BF16
(several times slower than fp32, docs/results.md), and each of ``--trainer.devices N`` is a
process with its own copy of the model, optimiser and data (8 processes of the recipe filled a
24 GiB machine and one was killed). ``--trainer.accelerator gpu`` there raised a 50-line
MisconfigurationException. So: asked for a GPU and none here, refused; GPU settings under
``auto`` with no GPU, refused, naming the two ways on; the same settings on a CPU asked for by
name (``--trainer.accelerator cpu``), run, with one line of what they cost.
"""

from __future__ import annotations

from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

from ..errors import UserError

GPU_NAMES = ("gpu", "cuda")


def half_precision(precision) -> bool:
    """Lightning's ``bf16-mixed``, ``16-mixed``, ``bf16-true``, ``16``, ...: 16-bit arithmetic."""
    return "16" in str(precision)


def process_count(devices) -> int | None:
    """The processes ``--trainer.devices`` starts on a CPU: a count, or None for a list or ``auto``
    (one process)."""
    if isinstance(devices, int):
        return devices
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        return int(devices)
    return None


def gpu_settings(trainer, compiled: bool) -> list[str]:
    """What in ``trainer`` (the trainer section) and the model's ``compile`` is made for GPUs, in words."""
    settings = []
    if half_precision(trainer.precision):
        settings.append(f"--trainer.precision {trainer.precision} (emulated on CPUs without AMX or AVX512-BF16, "
                        "several times slower than 32-true)")
    processes = process_count(trainer.devices)
    if processes is not None and (processes > 1 or processes == -1):
        settings.append(f"--trainer.devices {trainer.devices} (on a CPU, one process each, every one holding its "
                        "own model, optimiser and data)")
    if settings and compiled:  # minutes of compilation on a CPU; alone it is no GPU setting
        settings.append("--model.compile true (minutes to compile on a CPU before the first step)")
    return settings


def gpu_available() -> bool:
    """Whether Lightning's ``auto`` would find a GPU here (CUDA, or Apple's MPS)."""
    return CUDAAccelerator.is_available() or MPSAccelerator.is_available()


def check_gpu_settings(trainer, compiled: bool) -> str | None:
    """Refuse GPU settings on a machine without a GPU unless the CPU was asked for by name; for those
    return the one line that says what they cost (None: nothing to say)."""
    accelerator = str(trainer.accelerator).lower()
    has_gpu = gpu_available()
    if accelerator in GPU_NAMES and not has_gpu:
        raise UserError(f"--trainer.accelerator {trainer.accelerator}: this machine has no GPU that torch can "
                        "use; train on its CPU with --trainer.accelerator cpu --trainer.precision 32-true")
    if has_gpu or accelerator not in ("auto", "cpu"):
        return None
    settings = gpu_settings(trainer, compiled)
    if not settings:
        return None
    if accelerator == "auto":
        raise UserError(f"this run is set up for GPUs and this machine has none: {'; '.join(settings)}. Run it "
                        "on a GPU; or train on this CPU with --trainer.accelerator cpu --trainer.precision 32-true "
                        "--trainer.devices 1 (or --trainer.accelerator cpu alone to keep the settings as they are)")
    return f"on the CPU as asked (--trainer.accelerator cpu), with settings made for GPUs: {'; '.join(settings)}"
