"""Performance traps of a GPU machine's libraries and driver, each a check that doctor and the image's start run.

Each check is a small function returning `(name, what was found, problem or None)`; `launch.checks.image.trap_checks()`
runs them all. Nothing heavy is imported at module level: torch is imported inside the checks (or passed in, as the
tests do with fakes). Where there is nothing to check (a CPU build of torch, no visible GPU) a check says
"no GPU: not checked" and reports no problem.

- cuDNN: the cuDNN that torch loaded is the one of the locked `nvidia-cudnn-cu13` wheel. A system cuDNN found
  first by the loader (an older CUDA base image, LD_LIBRARY_PATH) sends SDPA to a slower path: TRL's 1M-token
  Qwen3-8B step went from 373 s to 606 s (transformers #48324, #48163). Checked whenever torch is a CUDA build
  (loading cuDNN needs no GPU, so the image checks it at build time and in CI too).
- SDPA backend: what `torch.nn.functional.scaled_dot_product_attention` would run on this GPU, asked from
  torch's own dispatcher (`torch._fused_sdp_choice`, the function SDPA calls) on tiny bf16 tensors, for the two
  shapes the recipes use: causal without a mask (ring CP, wrapped packing) and with a boolean mask (packed
  documents under sdpa). cuDNN attention is probed by running it once (`sdpa_kernel([CUDNN_ATTENTION])`), since
  that fails when the loaded cuDNN is not the one torch expects. Problem: the math fallback (no fused kernel)
  for the causal shape, or, on compute capability 9.x/10.x, cuDNN attention not running.
- Driver: the CUDA version the driver supports (`cudaDriverGetVersion`, through torch) is at least the CUDA
  release torch was built for (13.0: driver R580 or newer); the driver's version string comes from
  /proc/driver/nvidia/version when readable.
- flash-attn: installed or not (it is opt-in in the image: FLASH_ATTN=1), and when installed, that its CUDA
  extension imports against this torch (a build for another torch fails with an undefined symbol) and, on a
  GPU, that it has a kernel for this GPU's compute capability (read from its fat binary).
- flash-attn-4: FlashAttention without a compile (in the default image): installed or not, and on a GPU where
  transformers runs it (compute capability >= 9, Hopper and Blackwell) that `flash_attn.cute` imports.
- kernels hub: whether transformers' other no-compile route (`kernels` fetching FlashAttention builds from the
  Hugging Face Hub) is usable: it needs the `kernels` package at the versions transformers accepts.
- adapters: bitsandbytes quantizes a tensor to 4-bit NF4 and back on this machine's device (CPU or GPU), as a
  QLoRA run's base model needs; run for `doctor` without a recipe and for recipes that load in 4 or 8 bits.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

from launch.facts import pins as pinfiles
from launch.facts.machine import NVIDIA_DRIVER_FILE, gpu_driver, kernels_route
from launch.facts.pins import normalize

NOT_CHECKED = "no GPU: not checked"
CUDNN_WHEEL = "nvidia-cudnn-cu13"
# Compute capabilities where cuDNN attention is the fast path (Hopper, Blackwell): cuDNN SDPA is 1.7-2.3x faster than
# the flash backend on Hopper, slower on A100.
CUDNN_ATTENTION_MAJORS = (9, 10)
# FlashAttention 4 (the flash-attn-4 wheel, CuTe DSL): transformers 5.23 runs attn_implementation
# flash_attention_4 on compute capability >= 9 only (FLASH_ATTENTION_COMPATIBILITY_MATRIX: cuda_min_major_version).
FLASH_ATTN_4 = "flash_attention_4"
FLASH_ATTN_4_MIN_MAJOR = 9

Check = tuple[str, str, "str | None"]


def _torch(torch_module=None):
    if torch_module is not None:
        return torch_module
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch: every check says so
        return None
    return torch


def _cuda_build(torch) -> bool:
    return torch is not None and bool(getattr(getattr(torch, "version", None), "cuda", None))


def _gpu(torch) -> bool:
    if not _cuda_build(torch):
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _locked(name: str, lock: dict[str, str] | None) -> str | None:
    if lock is None:
        try:
            lock = pinfiles.read_lock(pinfiles.IMAGE_LOCK)
        except (OSError, ValueError):
            return None
    return {normalize(k): v for k, v in lock.items()}.get(normalize(name))


# --------------------------------------------------------------------------------------------------------
# cuDNN


def cudnn_number(version: str) -> int | None:
    """The wheel version 9.20.0.48 as torch.backends.cudnn.version() writes it: 92000 (major*10000 + minor*100
    + patch, cuDNN 9's CUDNN_VERSION)."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if not m:
        return None
    major, minor, patch = map(int, m.groups())
    return major * 10000 + minor * 100 + patch


def cudnn_problem(loaded: int | None, locked: str | None, loaded_from: str | None = None,
                  source: str = "image.lock") -> str | None:
    """source: where `locked` comes from (image.lock; on a machine with its own torch build, its installed wheels)."""
    if locked is None:
        return f"{CUDNN_WHEEL} is not in {source}: the cuDNN torch loads cannot be checked"
    want = cudnn_number(locked)
    if loaded is None:
        return f"torch loads no cuDNN (locked {CUDNN_WHEEL} {locked}): SDPA and convolutions lose their cuDNN paths"
    if loaded != want:
        where = f" from {loaded_from}" if loaded_from else ""
        return (f"torch loaded cuDNN {loaded}{where}, but {source} has {CUDNN_WHEEL} {locked} ({want}): a system "
                "cuDNN is found before the wheel's (LD_LIBRARY_PATH, /etc/ld.so.conf, a CUDA base image), which sends "
                "SDPA to a slower path (transformers #48324: 373 s -> 606 s per 1M-token step). Remove it from the "
                "loader's path.")
    if loaded_from and "site-packages" not in loaded_from and "dist-packages" not in loaded_from:
        return (f"torch loaded cuDNN {loaded} from {loaded_from}, not from the {CUDNN_WHEEL} wheel: a system copy "
                "of the same version, which the next system update may change; remove it from the loader's path.")
    return None


def loaded_library(stem: str, maps: Path = Path("/proc/self/maps")) -> str | None:
    """The file a shared library was loaded from in this process (e.g. stem 'libcudnn.so'), if any."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split()[-1] if line.split() else ""
        if os.path.basename(path).startswith(stem):
            return path
    return None


def check_cudnn(torch_module=None, lock: dict[str, str] | None = None,
                maps: Path = Path("/proc/self/maps"), source: str = "image.lock") -> Check:
    torch = _torch(torch_module)
    if not _cuda_build(torch):
        return "cuDNN", NOT_CHECKED, None
    locked = _locked(CUDNN_WHEEL, lock)
    try:
        loaded = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        loaded = None
    loaded_from = loaded_library("libcudnn.so", maps) if loaded else None
    found = f"{loaded} loaded" + (f" from {loaded_from}" if loaded_from else "") + f"; locked {CUDNN_WHEEL} {locked}"
    return "cuDNN", found, cudnn_problem(loaded, locked, loaded_from, source)


# --------------------------------------------------------------------------------------------------------
# SDPA backend


def sdpa_problem(capability: tuple[int, int], causal: str, masked: str, cudnn_runs: bool) -> str | None:
    if causal in ("MATH", "ERROR"):
        return (f"SDPA would use its {causal.lower()} fallback for causal bf16 attention on this GPU (compute "
                f"capability {capability[0]}.{capability[1]}): no fused kernel (flash, memory-efficient, cuDNN) "
                "accepted it; check that torch is a CUDA build for this GPU and its cuDNN is the locked one.")
    if capability[0] in CUDNN_ATTENTION_MAJORS and not cudnn_runs:
        return (f"cuDNN attention does not run on this GPU (compute capability {capability[0]}.{capability[1]}), "
                "where it is the fastest SDPA backend (1.7-2.3x the flash backend on Hopper): usually a cuDNN other "
                f"than the {CUDNN_WHEEL} wheel's is loaded (see the cuDNN check).")
    return None


def _sdpa_choice(torch, q, k, v, mask, causal: bool) -> str:
    from torch.nn.attention import SDPBackend

    choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, causal)
    names = {int(member.value) if hasattr(member, "value") else int(member): name
             for name, member in SDPBackend.__members__.items()}
    return names.get(int(choice), str(choice))


def _cudnn_attention_runs(torch, q, k, v) -> bool:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - "No available kernel", cuDNN errors
        return False
    return True


def check_sdpa_backend(torch_module=None, probe: Callable[..., tuple[str, str, bool]] | None = None) -> Check:
    """probe(torch) -> (causal choice, masked choice, cuDNN attention runs): the real one by default."""
    torch = _torch(torch_module)
    if not _gpu(torch):
        return "SDPA backend", NOT_CHECKED, None
    capability = tuple(torch.cuda.get_device_capability(0))
    if probe is None:
        def probe(torch):
            shape = (1, 8, 256, 128)  # batch, heads, tokens, head dim: tiny, and every fused kernel takes it
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril()
            return (_sdpa_choice(torch, q, k, v, None, True), _sdpa_choice(torch, q, k, v, mask, False),
                    _cudnn_attention_runs(torch, q, k, v))
    causal, masked, cudnn_runs = probe(torch)
    found = (f"compute capability {capability[0]}.{capability[1]}: causal -> {causal}, with a mask (packed "
             f"documents) -> {masked}; cuDNN attention {'runs' if cudnn_runs else 'does not run'}")
    return "SDPA backend", found, sdpa_problem(capability, causal, masked, cudnn_runs)


# --------------------------------------------------------------------------------------------------------
# Driver


def cuda_version_number(version: str) -> int:
    """'13.0' -> 13000 (cudaDriverGetVersion's encoding: major*1000 + minor*10)."""
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major) * 1000 + int(minor) * 10


def driver_problem(driver_cuda: int | None, needed: str, release: str | None = None) -> str | None:
    if driver_cuda is None:
        return "the driver's CUDA version could not be read"
    if driver_cuda < cuda_version_number(needed):
        have = f"{driver_cuda // 1000}.{driver_cuda % 1000 // 10}"
        return (f"the driver{f' {release}' if release else ''} supports CUDA {have}, torch is built for CUDA "
                f"{needed}: install driver R580 or newer (CUDA 13.0).")
    return None


def driver_release(proc: Path = NVIDIA_DRIVER_FILE) -> str | None:
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", gpu_driver(proc) or "")
    return m.group(1) if m else None


def check_driver(torch_module=None, proc: Path = NVIDIA_DRIVER_FILE) -> Check:
    torch = _torch(torch_module)
    if not _gpu(torch):
        return "driver", NOT_CHECKED, None
    needed = torch.version.cuda
    try:
        driver_cuda = int(torch._C._cuda_getDriverVersion())
    except Exception:  # noqa: BLE001
        driver_cuda = None
    release = driver_release(proc)
    shown = f"{driver_cuda // 1000}.{driver_cuda % 1000 // 10}" if driver_cuda else "?"
    found = f"{release or 'version unknown'}, supports CUDA {shown}; torch built for CUDA {needed}"
    return "driver", found, driver_problem(driver_cuda, needed, release)


# --------------------------------------------------------------------------------------------------------
# flash-attn


def fatbin_archs(path: str | Path) -> list[int]:
    """The GPU architectures (80 = sm_80, ...) of the machine code (ELF entries) in a library's CUDA fat binaries,
    read from the fatbin headers (magic 0xBA55ED50; entry: kind 2 = ELF, arch at byte 28), as cuobjdump
    --list-elf lists them; the nvcc wheel has no cuobjdump. The Dockerfile's flash-attn stage does the same."""
    import struct

    data = Path(path).read_bytes()
    archs: set[int] = set()
    pos = 0
    while (pos := data.find(struct.pack("<I", 0xBA55ED50), pos)) >= 0:
        _, header, size = struct.unpack_from("<HHQ", data, pos + 4)
        entry, end = pos + header, pos + header + size
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            if kind == 2:
                archs.add(struct.unpack_from("<I", data, entry + 28)[0])
            entry = end if entry_header == 0 else entry + entry_header + payload
        pos = max(end, pos + 4)
    return sorted(archs)


def runs_on(archs: list[int], capability: tuple[int, int]) -> bool:
    """SASS for sm_XY runs on compute capability X.Z with Z >= Y (same major)."""
    major, minor = capability
    return any(a // 10 == major and a % 10 <= minor for a in archs)


def flash_attn_import(importer: Callable[[str], Any] | None = None) -> tuple[str | None, str | None, str | None]:
    """(version or None when not installed, import error or None, path of flash_attn_2_cuda or None)."""
    import importlib
    import importlib.metadata

    try:
        version = importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return None, None, None
    importer = importer or importlib.import_module
    try:
        importer("flash_attn")
        extension = importer("flash_attn_2_cuda")
    except Exception as e:  # noqa: BLE001 - ImportError / OSError (undefined symbol)
        return version, f"{type(e).__name__}: {e}", None
    return version, None, getattr(extension, "__file__", None)


def check_flash_attn(torch_module=None, state: tuple[str | None, str | None, str | None] | None = None,
                     archs: list[int] | None = None) -> Check:
    """state: flash_attn_import()'s answer; archs: its kernels' architectures (read from its library)."""
    torch = _torch(torch_module)
    if not _cuda_build(torch):
        return "flash-attn", NOT_CHECKED, None
    version, error, library = flash_attn_import() if state is None else state
    if version is None:
        return "flash-attn", "not installed (the image's FLASH_ATTN=1 build adds it)", None
    if error:
        return "flash-attn", f"{version}, does not import", (
            f"flash-attn {version} does not import against torch {torch.__version__} ({error}): a build for "
            "another torch fails with an undefined symbol; rebuild the image (FLASH_ATTN=1 compiles it against "
            "the installed torch).")
    found = f"{version}, imports against torch {torch.__version__}"
    if not _gpu(torch):
        return "flash-attn", found, None
    if archs is None and library:
        archs = fatbin_archs(library)
    capability = tuple(torch.cuda.get_device_capability(0))
    found += f"; kernels {', '.join(f'sm_{a}' for a in archs or [])}"
    if archs is not None and not runs_on(archs, capability):
        return "flash-attn", found, (
            f"flash-attn has no kernel for this GPU (compute capability {capability[0]}.{capability[1]}): rebuild "
            "with TORCH_CUDA_ARCH_LIST including it (docs/container.md).")
    return "flash-attn", found, None


# --------------------------------------------------------------------------------------------------------
# flash-attn-4 and the kernels hub: FlashAttention without a compile


def flash_attn_4_import(importer: Callable[[str], Any] | None = None,
                        load: bool = True) -> tuple[str | None, str | None]:
    """(version or None when not installed, import error or None). load=False: the version only (importing the CuTe
    DSL takes seconds; it is worth it only where transformers would run it)."""
    import importlib
    import importlib.metadata

    try:
        version = importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    if not load:
        return version, None
    try:
        (importer or importlib.import_module)("flash_attn.cute")
    except Exception as e:  # noqa: BLE001 - ImportError, OSError (CUDA libraries), RuntimeError
        return version, f"{type(e).__name__}: {e}"
    return version, None


def check_flash_attn_4(torch_module=None, state: tuple[str | None, str | None] | None = None) -> Check:
    """state: flash_attn_4_import()'s answer (imported only on a GPU it runs on)."""
    torch = _torch(torch_module)
    if not _cuda_build(torch):
        return "flash-attn-4", NOT_CHECKED, None
    gpu = _gpu(torch)
    capability = tuple(torch.cuda.get_device_capability(0)) if gpu else None
    runs_here = capability is not None and capability[0] >= FLASH_ATTN_4_MIN_MAJOR
    version, error = flash_attn_4_import(load=runs_here) if state is None else state
    if version is None:
        return "flash-attn-4", "not installed (image.lock has it: a venv without it runs sdpa)", None
    if not gpu:
        return "flash-attn-4", (f"{version} installed; not imported (no GPU: transformers runs it on compute "
                                f"capability >= {FLASH_ATTN_4_MIN_MAJOR}.0 only)"), None
    if not runs_here:
        return "flash-attn-4", (f"{version} installed; not for this GPU (compute capability {capability[0]}."
                                f"{capability[1]}: transformers runs it on >= {FLASH_ATTN_4_MIN_MAJOR}.0)"), None
    if error:
        return "flash-attn-4", f"{version}, does not import", (
            f"flash-attn-4 {version} does not import ({error}): attn_implementation {FLASH_ATTN_4} cannot run; "
            "rebuild the image from requirements/image.lock, or keep attn_implementation: sdpa.")
    return "flash-attn-4", f"{version}, imports; usable as attn_implementation {FLASH_ATTN_4} on this GPU", None


def check_kernels_route(requirement: str | None = None, installed: str | None = "?") -> Check:
    return "kernels hub", kernels_route(requirement, installed)[1], None


# --------------------------------------------------------------------------------------------------------
# Adapters: bitsandbytes' 4-bit path on this machine


def bitsandbytes_roundtrip(torch, device: str) -> float:
    """Quantize a small bf16 tensor to 4-bit NF4 (double quantization, bf16 storage: QLoRA's settings) and back on
    `device`; returns the largest absolute error. bitsandbytes' import-time warning about its optional Hub kernel
    for CPU (`kernels`, not installed) is kept out of the report."""
    import logging

    cpu_ops = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = cpu_ops.level
    cpu_ops.setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as F
    finally:
        cpu_ops.setLevel(level)
    x = torch.linspace(-1, 1, 64 * 64, dtype=torch.float32).reshape(64, 64).to(device=device, dtype=torch.bfloat16)
    packed, state = F.quantize_4bit(x, quant_type="nf4", compress_statistics=True, quant_storage=torch.bfloat16)
    return float((F.dequantize_4bit(packed, state).float() - x.float()).abs().max())


# NF4 has 16 levels over [-1, 1] (absmax-scaled blocks of 64): the largest step is about 0.28, so a round trip of
# values in [-1, 1] is off by at most about half of it. A broken kernel returns garbage (errors near 1 or NaN).
NF4_MAX_ERROR = 0.2


def check_bitsandbytes(torch_module=None, roundtrip: Callable[[Any, str], float] | None = None) -> Check:
    import importlib.metadata

    torch = _torch(torch_module)
    try:
        version = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return "bitsandbytes", "not installed", (
            "bitsandbytes is not installed: a 4-bit (QLoRA) base model cannot be loaded; install the lock "
            "(bash ci/setup.sh, or the image).")
    if torch is None:
        return "bitsandbytes", f"{version}; torch does not import", None
    device = "cuda" if _gpu(torch) else "cpu"
    try:
        error = (roundtrip or bitsandbytes_roundtrip)(torch, device)
    except Exception as e:  # noqa: BLE001
        return "bitsandbytes", f"{version}, 4-bit on {device} fails", (
            f"bitsandbytes {version} cannot quantize to 4-bit on {device} ({type(e).__name__}: {e}): a QLoRA run's "
            "base model cannot load here.")
    found = f"{version}, NF4 4-bit round trip on {device}: max error {error:.3f}"
    if not error <= NF4_MAX_ERROR:
        return "bitsandbytes", found, (f"bitsandbytes {version}'s NF4 round trip on {device} is off by {error:.3f} "
                                       f"(at most {NF4_MAX_ERROR} expected): its {device} kernels are broken.")
    return "bitsandbytes", found, None
