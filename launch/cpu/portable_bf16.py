"""bf16 on CPU computed the same way, bit for bit, on every x86-64 CPU with AVX2 (x86-64-v3), so that a bf16 CPU
run's recorded metrics (qlora-fsdp's smoke-cpu profile: QLoRA stays bf16 on CPU, launch/config/profiles.py) hold on
whatever machine CI gets.

The cause. Without this, torch 2.13's CPU arithmetic picks its kernels by the CPU it runs on, and each accumulates
fp32 partial sums in its own order; in bf16 a last-bit difference flips a rounding, and training carries it on:
- bf16 matmuls go to oneDNN wherever it has a bf16 kernel (`use_mkldnn_bf16_matmul` = the user's
  `torch.backends.mkldnn` switch and `mkldnn_bf16_device_check`, i.e. `ideep::has_bf16_type_support`: AVX512 or
  AVX-NE-CONVERT); oneDNN then takes AMX tiles (Sapphire Rapids), AVX512-BF16 (Zen 4) or its AVX512 emulation (Skylake),
  and elsewhere (AVX2-only CPUs such as GitHub's Zen 3 runners) torch's own gemm runs;
- ATen's vectorised kernels (softmax, log-softmax, reductions) run the build for the CPU's widest vectors
  (`torch.backends.cpu.get_cpu_capability()`: AVX512 or AVX2), 16 or 8 fp32 lanes;
- MKL (fp32 matmuls, and the VML exp/log ATen calls on contiguous fp32) dispatches by CPU too.
Measured on the machine the metrics were recorded on (Intel Xeon, Sapphire Rapids: AMX and AVX512-BF16), emulating
other CPUs with oneDNN's and ATen's own switches (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY): the 12-step qlora-fsdp
smoke run drifts from step 2 or 3 (oneDNN without AMX, as on Zen 4: loss mean diff -7.7e-5, max 3.4e-4; AVX2 only:
-2.7e-5, 1.5e-4), the issue's Zen 4 CI machine measured -1.06e-4 / 4.6e-4 against the bound 1e-5.

The pin, in the ranks of a `--cpu` run that computes in bf16, on x86-64 with AVX2 and FMA:
- oneDNN off (`torch.backends.mkldnn.enabled = False`, set by `apply()` from `launch.cpu.enable_cpu_path`): every bf16
  matmul takes torch's own gemm, whatever oneDNN could do on this CPU;
- ATEN_CPU_CAPABILITY=avx2: ATen runs its AVX2 build, which every x86-64-v3 CPU executes alike;
- MKL_CBWR=COMPATIBLE: MKL's reproducible branch for Intel and compatible (AMD) CPUs alike (oneMKL developer
  guide, conditional numerical reproducibility: on non-Intel CPUs only AUTO and COMPATIBLE are supported;
  COMPATIBLE leaves out rcpps/rsqrtps, whose approximations differ between vendors).
The two variables are read once, when torch starts, so the launcher puts them in the ranks' environment
(`rank_env`, through launch/config/profiles.py `cpu_env`); the user's own value of any of them wins. The parts go
together: on an AMX CPU, ATen's AVX2 build beside an enabled oneDNN fails in bf16 SDPA (torch 2.13: "pack_vnni2 is only
supported when avx512 is supported").

With the pin, the full smoke run's losses and grad norms are bitwise identical under every emulation tried (oneDNN
at AMX, AVX512-BF16, AVX512, AVX2; MKL_ENABLE_INSTRUCTIONS=AVX2 or SSE4_2; 1 to 3 threads per rank). Not pinned,
because measured not to matter: the threads per rank (Accelerate sets OMP_NUM_THREADS = physical cores / processes);
bitsandbytes' 4-bit dequantisation, which picks its AVX512 or scalar loop by CPU but is exact either way (the NF4
value times the block's scale, rounded once: both loops equal its pure-torch reference). Not reachable from here: a
real other CPU (only emulated), and CPUs without AVX2 or not x86 (no pin: their own kernels, other results).

fp32 CPU runs are left alone: the pin would change their arithmetic too (ATen's AVX2 log-softmax rounds otherwise
than its AVX512 one), and their recorded metrics held on the Zen 4 machine. Nothing on the GPU path imports this
module (the launcher does, for a `--cpu` run only). By hand (plain `accelerate launch` of our train.py):
`ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE LAUNCH_PORTABLE_BF16=1`. Tested by tests/test_cpu_portable_bf16.py.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

MARKER = "LAUNCH_PORTABLE_BF16"  # "1": the rank turns oneDNN off (apply)
# Read when torch starts, so set in the ranks' environment by the launcher.
PIN_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's dispatch (DispatchStub) takes it as given: the CPU must have AVX2 and FMA
    "MKL_CBWR": "COMPATIBLE",
    MARKER: "1",
}
NEEDED_FLAGS = frozenset({"avx2", "fma"})  # what ATen's AVX2 build executes (x86-64-v3)
X86_64 = frozenset({"x86_64", "amd64"})
BF16_DTYPES = frozenset({"bfloat16", "bf16"})
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where unreadable: then no pin)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def computes_in_bf16(training: dict) -> bool:
    """A CPU run whose weights or autocast are bf16 (QLoRA's profile: dtype bfloat16)."""
    return bool(training.get("use_cpu")) and (str(training.get("dtype") or "").lower() in BF16_DTYPES
                                              or bool(training.get("bf16")))


def rank_env(training: dict, machine: str | None = None, flags: frozenset[str] | None = None) -> dict:
    """The pin's variables for the ranks of this run: PIN_ENV for a bf16 CPU run on x86-64 with AVX2 and FMA, else {}
    (fp32 runs, GPU runs, other CPUs). `machine`, `flags`: this machine's (platform.machine(), /proc/cpuinfo)."""
    if not computes_in_bf16(training):
        return {}
    machine = (machine if machine is not None else platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    if machine not in X86_64 or not NEEDED_FLAGS <= flags:
        return {}
    return dict(PIN_ENV)


def apply() -> bool:
    """In a rank (launch.cpu.enable_cpu_path): oneDNN off when the launcher pinned this run. True if it did."""
    if os.environ.get(MARKER) != "1":
        return False
    import torch

    torch.backends.mkldnn.enabled = False
    return True
