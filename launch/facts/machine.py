"""What this machine has: installed package versions, GPUs, GPU and host memory, the torch build, CPU and driver,
what optional settings need here, and what the code runs from (the git revision, the image).

Probes only, each failing soft (a broken CUDA setup reads as no GPU and the caller says so). Used by `doctor`, the
run's preflight (`runner`; `rules` for the optional packages: the kernels hub route, bitsandbytes' CUDA library, the
tools DeepSpeed's JIT ops are built with), the run summary and the recorded environment (`judge`), and the bench.
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


# ---- probes of what an optional setting needs here (read by launch.checks.rules, each only when its setting is on)
def jit_build_tools() -> dict[str, str | None]:
    """What compiling a C++ extension at first use needs (`torch.utils.cpp_extension.load`, through which DeepSpeed
    builds its JIT ops), each found (where) or None: the `ninja` binary on PATH (torch runs `ninja`, found on the PATH
    the ranks inherit from the launcher), the C++ compiler (`$CXX`, default `c++`) and Python's headers (Python.h)."""
    import shutil
    import sysconfig

    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return {"ninja": shutil.which("ninja"), "a C++ compiler": shutil.which(os.environ.get("CXX", "c++")),
            "Python's headers (Python.h)": str(header) if header.is_file() else None}


def deepspeed_prebuilt_ops() -> tuple[set[str], str | None]:
    """(the DeepSpeed ops built when it was installed (DS_BUILD_OPS=1; the image builds none), the accelerator they
    were built for): DeepSpeed loads such an op without a compile when the run's accelerator is that one
    (deepspeed 0.19.8 op_builder/builder.py `OpBuilder.load`). Read from its generated git_version_info_installed.py,
    not imported: importing deepspeed costs seconds and picks an accelerator."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("deepspeed")
        text = (Path(spec.origin).parent / "git_version_info_installed.py").read_text()
        values = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(text).body
                  if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    except (AttributeError, TypeError, OSError, SyntaxError, ValueError):  # not installed, or from a source checkout
        return set(), None
    built = {name for name, done in (values.get("installed_ops") or {}).items() if done}
    return built, values.get("accelerator_name")


def bitsandbytes_cuda_problem() -> str | None:
    """Why bitsandbytes' CUDA library cannot be used in this process (None: it loaded, or torch sees no CUDA GPU).
    bitsandbytes 0.50.2 does not fail at import when it cannot load its CUDA library (cextension.py keeps the error in
    a stand-in library); the first quantized layer raises it. Loading it starts no CUDA context. Its import-time
    message about an optional Hub kernel for its CPU backend (`kernels`, not installed) is kept out, as
    launch.checks.traps.bitsandbytes_roundtrip does (launch.rank.upstream_imports says why)."""
    import logging

    cpu_ops = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = cpu_ops.level
    cpu_ops.setLevel(logging.ERROR)
    try:
        from bitsandbytes import cextension
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        return f"bitsandbytes does not import ({type(e).__name__}: {e})"
    finally:
        cpu_ops.setLevel(level)
    if cextension.BNB_BACKEND != "CUDA" or not isinstance(cextension.lib, cextension.ErrorHandlerMockBNBNativeLibrary):
        return None
    return f"its CUDA library does not load ({str(cextension.lib.error_msg).strip().splitlines()[0]})"


def kernels_requirement() -> str | None:
    """The `kernels` versions the installed transformers uses for its hub route (e.g. `kernels>=0.18.2,<0.19`)."""
    try:
        from transformers.dependency_versions_table import deps
    except Exception:  # noqa: BLE001 - no transformers: nothing uses the route
        return None
    return deps.get("kernels")


def kernels_route(requirement: str | None = None, installed: str | None = "?") -> tuple[bool, str]:
    """(usable, why): transformers maps flash_attention_2/3/4 to Hub kernels (kernels-community/...) only when the
    `kernels` package is installed at a version its requirement accepts."""
    import importlib.metadata

    from packaging.requirements import Requirement

    requirement = kernels_requirement() if requirement is None else requirement
    if installed == "?":
        try:
            installed = importlib.metadata.version("kernels")
        except importlib.metadata.PackageNotFoundError:
            installed = None
    if not requirement:
        return False, "transformers names no kernels requirement"
    if installed is None:
        return False, (f"not available: transformers needs {requirement}, which is not installed (PyPI had no such "
                       "release when the locks were made); FlashAttention without a compile comes from flash-attn-4")
    if not Requirement(requirement).specifier.contains(installed, prereleases=True):
        return False, f"not available: kernels {installed} is installed, transformers needs {requirement}"
    return True, (f"kernels {installed} (transformers needs {requirement}): kernels are fetched from the Hub at first "
                  "use and read from HF_HOME afterwards")


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
        nccl = (".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda and torch.cuda.is_available()
                else "n/a")
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
