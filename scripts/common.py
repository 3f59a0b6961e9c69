"""What the benchmark scripts share: each configuration measured in a fresh worker process
(``run_subprocess``, the result a JSON line marked ``RESULT_MARKER``), memory read from
the process (``current_rss_bytes``, ``maxrss_bytes``, ``reset_peak_rss``) and a peak over
some work (``PeakMemory``), the machine described (``machine_info``), timings that include
the device's queued work (``timed``, ``sync``), table cells (``fmt``) and the baseline that
cached sampling is measured against (``sample_uncached``). A preset's model: ``imagetx.training.presets``.

Standard library only at import time (torch is imported inside the functions that need
it), so that a driver process does not pay for it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable

RESULT_MARKER = "BENCH_RESULT_JSON:"


def sync(device) -> None:
    """Wait until the device has run what was queued on it, so that a timer reads the work
    (CUDA runs asynchronously; on a CPU the work is done when the call returns)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], object], device) -> float:
    """Seconds that ``run()`` takes on ``device``, the work it queued there included."""
    sync(device)
    start = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - start


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; falls back to ru_maxrss)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return maxrss_bytes()


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark (``ru_maxrss``) to its current RSS,
    so that a peak read later covers only what ran since (Linux ≥ 4.0: /proc/self/clear_refs).
    False where that is refused: the mark then still covers everything before."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB


class PeakMemory:
    """The peak memory of what runs after it is made. On CUDA: torch's allocation high-water
    mark (reset here; ``cuda_peak_bytes``) and the allocation before (``cuda_before``); on a
    CPU: the resident-set high-water mark (ru_maxrss) over the RSS before (``rss_figures``)."""

    def __init__(self, device) -> None:
        import torch

        self.device = torch.device(device)
        self.rss_before, self.maxrss_before = current_rss_bytes(), maxrss_bytes()
        self.cuda_before = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.cuda_before = torch.cuda.memory_allocated(self.device)

    def cuda_peak_bytes(self) -> int:
        import torch

        return torch.cuda.max_memory_allocated(self.device)

    def rss_figures(self) -> dict:
        """MiB: the peak growth (ru_maxrss now - the RSS before), its ends, and whether it is a
        lower bound: a high-water mark that never moved means the peak of what ran hid under an
        earlier one (e.g. import time)."""
        maxrss_after = maxrss_bytes()
        return {"peak_mib": max(0, maxrss_after - self.rss_before) / 2**20, "rss_before_mib": self.rss_before / 2**20,
                "maxrss_after_mib": maxrss_after / 2**20, "peak_is_lower_bound": maxrss_after <= self.maxrss_before}


def run_subprocess(cmd: list[str], spec: dict, cwd: str | os.PathLike | None = None) -> dict:
    """Run one worker process; its result is the line marked RESULT_MARKER on stdout,
    else ``spec`` with the error and the end of what it printed."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            result = json.loads(line[len(RESULT_MARKER):])
            result["worker_wall_s"] = wall
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {**spec, "error": f"rc={proc.returncode}: " + " | ".join(tail), "worker_wall_s": wall}


def machine_info(device: str, threads: int | None) -> dict:
    """Versions, CPU (model, bf16 support), thread counts and the GPU, for the JSON output."""
    import torch

    info = {
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads_default": torch.get_num_threads(),
        "threads_requested": threads,
        "device": device,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    info["cpu_bf16_support"] = sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})
                    break
    except OSError:
        pass
    if device == "cuda" and torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def fmt(value, spec: str, missing: str = "-") -> str:
    """format(value, spec), or ``missing`` right-aligned to the spec's width."""
    if value is None:
        width = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return missing.rjust(int(width)) if width else missing
    return format(value, spec)



def sample_uncached(model, count: int, labels=None, low_res=None, temperature: float = 1.0,
                    steps: int | None = None, generator=None):
    """The original's method, for comparison: rerun the whole network at every step (in eval
    mode; the model's own mode is restored after). ``steps`` stops early (the benchmark times
    a few steps and extrapolates)."""
    import torch

    from imagetx.model.heads import check_temperature, params_and_bounds
    from imagetx.model.modes import eval_mode
    from imagetx.model.sampler import check_count
    from imagetx.model.scoring import full_pass

    check_count(count)
    check_temperature(temperature)
    cfg = model.config
    device = next(model.parameters()).device
    images = torch.zeros(count, cfg.image_size, cfg.image_size, 3, dtype=torch.uint8, device=device)
    sequence = model.targets(images)
    with eval_mode(model), torch.no_grad():
        for t in range(model.order.length if steps is None else steps):
            images = model.images(sequence).to(torch.uint8)
            params, bounds = params_and_bounds(full_pass(model, images, labels, low_res))
            sequence[:, t] = model.head.sample(params[:, t : t + 1], temperature, generator,
                                               None if bounds is None else bounds[:, t : t + 1])[:, 0]
    return model.images(sequence).to(torch.uint8)
