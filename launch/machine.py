"""What this machine has: installed package versions, GPUs, GPU and host memory, the torch build, CPU and driver,
and what the code runs from (the git revision, the image).

Probes only, each failing soft (a broken CUDA setup reads as no GPU and the caller says so). Used by `doctor`, the
run's preflight (`runner`), the run summary and the recorded environment (`judge`), and the bench.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path

from launch import REPO_ROOT

# The packages whose versions are reported (doctor, run_summary.json, expected_metrics.json), in this order.
REPORTED = ["torch", "transformers", "accelerate", "deepspeed", "trl", "datasets", "peft", "bitsandbytes", "flash-attn",
            "flash-attn-4", "liger-kernel", "trackio"]


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


# Written by the Dockerfile's last stage: the image's source, revision, version, build time and image.lock's sha256
# (the same facts as its OCI labels, which a process inside the container cannot read).
IMAGE_INFO = Path("/opt/pins/image.json")
# The image reference the runtime started (compose sets it; a container cannot see its own image).
IMAGE_ENV = "LAUNCH_IMAGE"


def git_revision(root: Path = REPO_ROOT) -> str | None:
    """HEAD's commit of the checkout the code runs from, with -dirty when tracked files have uncommitted changes;
    None outside a git checkout (the image has no .git) or without git."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def image_info(path: Path = IMAGE_INFO, env=os.environ) -> dict | None:
    """The image this process runs in (its /opt/pins/image.json, plus the reference from LAUNCH_IMAGE), or None
    outside it."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    info["reference"] = env.get(IMAGE_ENV) or None
    return info


def provenance(root: Path = REPO_ROOT, path: Path = IMAGE_INFO, env=os.environ) -> dict:
    """What run_summary.json records about the code a run ran: the git revision (of the checkout; in the image,
    which has no .git, the revision it was built from) and the image, or None outside one."""
    image = image_info(path, env)
    revision = git_revision(root)
    if revision is not None:
        return {"git_revision": revision, "from": "git checkout", "image": image}
    if image is not None and image.get("revision") not in (None, "", "unknown"):
        return {"git_revision": image["revision"], "from": "image", "image": image}
    return {"git_revision": None, "from": None, "image": image}
