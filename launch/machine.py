"""What this machine has: installed package versions, GPUs, GPU and host memory, the torch build, CPU and driver.

Probes only, each failing soft (a broken CUDA setup reads as no GPU and the caller says so). Used by `doctor`, the
run's preflight (`runner`), the run summary and the recorded environment (`judge`), and the bench.
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

# The packages whose versions are reported (doctor, run_summary.json, expected_metrics.json), in this order.
REPORTED = ["torch", "transformers", "accelerate", "deepspeed", "trl", "datasets", "flash-attn", "liger-kernel", "trackio"]


def installed_versions(names=REPORTED) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_info() -> tuple[int, list[str]]:
    try:
        import torch

        if not torch.cuda.is_available():
            return 0, []
        n = torch.cuda.device_count()
        return n, [torch.cuda.get_device_name(i) for i in range(n)]
    except Exception:  # noqa: BLE001 - a broken CUDA setup reads as no GPU; doctor says so
        return 0, []


def gpu_memory_gib() -> float:
    """Memory of the first visible GPU in GiB, as torch reports it (an 80 GB H100 reports about 79.1)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30


def host_memory_gib() -> float | None:
    """This machine's memory in GiB (None if it cannot be read)."""
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except Exception:  # noqa: BLE001
        return None


def torch_build() -> str:
    try:
        import torch

        cuda = torch.version.cuda or "none (CPU build)"
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda and torch.cuda.is_available() else "n/a"
        return f"CUDA {cuda}, NCCL {nccl}"
    except Exception as e:  # noqa: BLE001
        return f"torch unusable: {e}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def gpu_driver(path: Path = NVIDIA_DRIVER_FILE) -> str | None:
    """The NVIDIA kernel module's first line ("NVRM version: ... Kernel Module  580.65.06 ..."), None without one."""
    try:
        return path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
