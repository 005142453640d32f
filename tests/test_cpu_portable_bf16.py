"""launch/cpu/portable_bf16.py: a bf16 CPU run computes bit for bit alike whichever x86-64-v3 CPU it runs on.

Other CPUs are emulated on this one with the libraries' own switches, set before torch starts: ONEDNN_MAX_CPU_ISA
(oneDNN's kernels: AMX, AVX512-BF16, AVX2...) and MKL_ENABLE_INSTRUCTIONS (MKL's). ATen's capability cannot be
emulated apart from the pin, whose ATEN_CPU_CAPABILITY is the same switch: there the test checks that torch took it.
A few bf16 training steps of a tiny decoder block (Linear, SDPA, SiLU, fp32 cross-entropy, plus an fp32 matmul and exp
for MKL) run in one subprocess per emulated CPU, with and without the pin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from launch import REPO_ROOT
from launch.config import profiles
from launch.run import runner
from launch.cpu import portable_bf16
from launch.config.options import Options
from launch.run.resolve import resolve

BF16_CPU_RUN = {"use_cpu": True, "dtype": "bfloat16", "bf16": False}
AVX2_FLAGS = frozenset({"sse2", "avx", "avx2", "fma"})


@pytest.mark.parametrize("training, machine, flags, pinned", [
    (BF16_CPU_RUN, "x86_64", AVX2_FLAGS, True),                                    # QLoRA's CPU profile
    ({"use_cpu": True, "dtype": "float32", "bf16": True}, "x86_64", AVX2_FLAGS, True),  # bf16 autocast on CPU
    ({"use_cpu": True, "dtype": "float32", "bf16": False}, "x86_64", AVX2_FLAGS, False),  # fp32 runs: untouched
    ({"use_cpu": False, "dtype": "bfloat16", "bf16": True}, "x86_64", AVX2_FLAGS, False),  # the GPU path
    (BF16_CPU_RUN, "x86_64", frozenset({"sse2", "avx"}), False),  # no AVX2: ATen's AVX2 build would not run
    (BF16_CPU_RUN, "aarch64", frozenset({"fp", "asimd", "bf16"}), False),  # not x86: other kernels altogether
])
def test_the_pin_is_for_bf16_cpu_runs_on_x86_64_v3(training, machine, flags, pinned):
    assert portable_bf16.rank_env(training, machine=machine, flags=flags) == (portable_bf16.PIN_ENV if pinned else {})


def test_cpu_flags_are_read_from_linux_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma amx_bf16\n\nprocessor\t: 1\n")
    assert portable_bf16.cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma", "amx_bf16"}
    assert portable_bf16.cpu_flags(tmp_path / "absent") == frozenset()


def test_the_launcher_pins_the_qlora_ranks_and_leaves_fp32_recipes_and_the_users_own_values(tmp_path, monkeypatch):
    for name in portable_bf16.PIN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(portable_bf16, "cpu_flags", lambda *_: AVX2_FLAGS)
    monkeypatch.setattr(portable_bf16.platform, "machine", lambda: "x86_64")

    def env(recipe: str) -> dict:
        setup = resolve(Options(recipe=recipe, smoke=True, cpu=True, output_dir=str(tmp_path / recipe)),
                        progress=lambda *_: None)
        return runner.child_env(setup, tmp_path / "monitor")

    qlora = env("qlora-fsdp")
    assert {k: qlora[k] for k in portable_bf16.PIN_ENV} == portable_bf16.PIN_ENV
    assert qlora["DS_ACCELERATOR"] == profiles.CPU_ENV["DS_ACCELERATOR"]
    assert not set(portable_bf16.PIN_ENV) & set(env("ddp"))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert env("qlora-fsdp")["ATEN_CPU_CAPABILITY"] == "avx512"


def test_the_rank_turns_onednn_off_only_where_the_launcher_pinned_the_run(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.delenv(portable_bf16.MARKER, raising=False)
    assert portable_bf16.apply() is False and torch.backends.mkldnn.enabled
    monkeypatch.setenv(portable_bf16.MARKER, "1")
    assert portable_bf16.apply() is True and not torch.backends.mkldnn.enabled


def test_bitsandbytes_4bit_dequantization_is_exact_on_both_of_its_cpu_loops():
    """bitsandbytes picks its CPU loop by CPU (AVX512 where a row is a multiple of 16 wide, else scalar), which the
    pin cannot reach: both must equal its pure-torch reference (the NF4 value times the block's scale, rounded once)."""
    import torch
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    # bitsandbytes wraps the reference in torch.compile (`_try_torch_compile`), whose C++ build would cost a fresh
    # machine a minute; the reference is the eager function inside (functools.wraps keeps it as __wrapped__)
    reference_dequantize = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    generator = torch.Generator().manual_seed(0)
    for width in (64, 62):  # the AVX512 loop (where the CPU has it), the scalar loop
        weight = (torch.randn(48, width, generator=generator) * 0.05).bfloat16()
        packed, state = F.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=True,
                                        quant_storage=torch.bfloat16)
        scales = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        reference = reference_dequantize(packed.view(torch.uint8).reshape(-1), scales.float(),
                                         _get_4bit_code("nf4", packed.device), 64, state.shape, torch.bfloat16)
        assert torch.equal(F.dequantize_4bit(packed, state), reference), width


# ---- bf16 training steps under emulated CPUs, in subprocesses ------------------------------------------------------

STEPS = textwrap.dedent("""
    import hashlib, json, sys
    import torch

    if sys.argv[1] == "rank":  # as train.py's ranks: the CPU path's entry point
        from types import SimpleNamespace
        from launch.cpu import enable_cpu_path
        enable_cpu_path(SimpleNamespace())
    elif sys.argv[1] == "apply":
        from launch.cpu import portable_bf16
        portable_bf16.apply()
    torch.manual_seed(0)
    B, S, D, F, V, H = 2, 128, 64, 128, 64, 4
    emb = torch.randn(V, D).bfloat16()
    qkv, up, down, head = (torch.nn.Linear(i, o, bias=False).bfloat16()
                           for i, o in ((D, 3 * D), (D, F), (F, D), (D, V)))
    fp32 = torch.nn.Linear(D, 16, bias=False)  # an fp32 matmul and exp beside the bf16 model: MKL's part
    tokens = torch.randint(0, V, (B, S))
    params = [p for m in (qkv, up, down, head, fp32) for p in m.parameters()]
    losses = []
    for _ in range(3):
        x = emb[tokens]
        q, k, v = qkv(x).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + attention.transpose(1, 2).reshape(B, S, D)
        h = h + down(torch.nn.functional.silu(up(h)))
        logits = head(h).float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
        loss = loss + 1e-2 * fp32(h.float()).exp().mean()
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= 0.05 * p.grad
                p.grad = None
        losses.append(loss.item())
    digest = hashlib.sha256(json.dumps(losses).encode())
    for p in params:
        digest.update(p.detach().view(-1).view(torch.uint8).numpy().tobytes() if p.dtype == torch.bfloat16
                      else p.detach().numpy().tobytes())
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "onednn": torch.backends.mkldnn.enabled,
                      "digest": digest.hexdigest(), "losses": losses}))
""")

# This machine and emulations of others (each at most what this CPU has; on a lesser CPU some are this CPU itself).
NO_AMX_MKL_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}  # as on Zen 4
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}  # as on Zen 3 (ATen's part: the pin's)
EMULATION_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")


@pytest.mark.long
def test_bf16_steps_are_bitwise_identical_under_emulated_cpus_with_the_pin_only():
    pin = portable_bf16.rank_env(BF16_CPU_RUN)
    if not pin:
        pytest.skip("the pin does not apply on this machine (not x86-64 with AVX2 and FMA): nothing to compare")
    base = {k: v for k, v in os.environ.items() if k not in {*portable_bf16.PIN_ENV, *EMULATION_VARIABLES}}
    runs = {  # name: (entry, environment)
        "this CPU": ("none", {"OMP_NUM_THREADS": "1"}),
        "no AMX, MKL AVX2": ("none", {**NO_AMX_MKL_AVX2, "OMP_NUM_THREADS": "1"}),
        "pinned: this CPU": ("rank", {**pin, "OMP_NUM_THREADS": "1"}),
        "pinned: no AMX, MKL AVX2, 2 threads": ("apply", {**pin, **NO_AMX_MKL_AVX2, "OMP_NUM_THREADS": "2"}),
        "pinned: AVX2 only": ("apply", {**pin, **AVX2_ONLY, "OMP_NUM_THREADS": "1"}),
    }
    procs = {name: subprocess.Popen([sys.executable, "-c", STEPS, entry], cwd=REPO_ROOT, env={**base, **env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (entry, env) in runs.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {stderr[-3000:]}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])

    pinned = {name: result for name, result in out.items() if name.startswith("pinned")}
    assert all(r["capability"] == "AVX2" and r["onednn"] is False for r in pinned.values()), pinned
    assert len({r["digest"] for r in pinned.values()}) == 1, {name: r["losses"] for name, r in pinned.items()}
    if "amx_bf16" in portable_bf16.cpu_flags():
        # Measured on the machine the metrics were recorded on (Sapphire Rapids): unpinned, oneDNN's AMX and
        # AVX512-BF16 kernels and ATen's AVX512 build each round otherwise. On a CPU without AMX there is no AMX
        # kernel to emulate, and whether its other emulations differ here is not known in advance: not asserted.
        assert out["this CPU"]["digest"] != out["no AMX, MKL AVX2"]["digest"]
        unpinned = {out["this CPU"]["digest"], out["no AMX, MKL AVX2"]["digest"]}
        assert next(iter(pinned.values()))["digest"] not in unpinned
