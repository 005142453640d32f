"""launch/checks/image.py: the performance-trap checks doctor and the image's start run (cuDNN, SDPA backend,
driver, flash-attn, attention per recipe), tested with fake torch modules, each in its passing and failing case.
And the CPU-checkable facts behind the attention recommendation (docs/container.md): with transformers' SDPA,
padded batches and packed documents (TRL's padding-free rows: position_ids, no attention mask) give the same
logits as each sequence run alone; without a mask and with continuous positions (wrapped packing) it is plain
causal attention.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from launch.checks import image as ic
from launch.facts import pins as pinfiles

LOCKED_CUDNN = pinfiles.read_lock(pinfiles.IMAGE_LOCK)["nvidia-cudnn-cu13"]
LOCKED_CUDNN_NUMBER = ic.cudnn_number(LOCKED_CUDNN)


def fake_torch(*, cuda="13.0", gpu=True, cudnn=LOCKED_CUDNN_NUMBER, capability=(9, 0), driver=13000):
    return SimpleNamespace(
        __version__="2.13.0+cu130" if cuda else "2.13.0+cpu",
        version=SimpleNamespace(cuda=cuda),
        backends=SimpleNamespace(cudnn=SimpleNamespace(version=lambda: cudnn)),
        cuda=SimpleNamespace(is_available=lambda: gpu, get_device_capability=lambda index=0: capability),
        _C=SimpleNamespace(_cuda_getDriverVersion=lambda: driver),
    )


def maps_file(tmp_path: Path, library: str) -> Path:
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 00:00 1 {library}\n7f02-7f03 r-xp 00000000 00:00 1 /usr/lib/libc.so.6\n")
    return maps


WHEEL_CUDNN = "/opt/venv/lib/python3.13/site-packages/nvidia/cudnn/lib/libcudnn.so.9"


# --------------------------------------------------------------------------------------------------------
# no GPU, no CUDA build


def test_module_imports_nothing_heavy():
    code = ("import sys, launch.checks.image; "
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'deepspeed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_without_cuda_every_check_says_not_checked():
    """torch's CPU build: every check, the per-recipe ones too, says so and passes; with a CUDA build but no GPU
    only the library checks (cuDNN, flash-attn) run."""
    checks = ic.trap_checks({"ddp": "flash_attention_2", "ring-cp-8gpu": "sdpa"},
                            torch_module=fake_torch(cuda=None, gpu=False))
    assert len(checks) == 8
    for name, found, problem in checks:
        assert problem is None, (name, problem)
        # the kernels hub route is a fact about the installed packages, not about a GPU
        assert found.startswith(ic.NOT_CHECKED) or name == "kernels hub", (name, found)
    no_gpu = {name: found for name, found, _ in ic.trap_checks({"ddp": "sdpa"}, torch_module=fake_torch(gpu=False))}
    assert no_gpu["SDPA backend"] == no_gpu["driver"] == ic.NOT_CHECKED
    assert not no_gpu["cuDNN"].startswith(ic.NOT_CHECKED) and not no_gpu["flash-attn"].startswith(ic.NOT_CHECKED)


def test_on_this_machine_the_checks_run_without_problems():
    """The CPU venv (torch's CPU build): nothing to check, nothing fails; every recipe is listed."""
    settings = ic.recipe_attn_settings()
    assert {"ddp", "zero3", "ring-cp-8gpu", "alst-ulysses-8gpu"} <= settings.keys()
    assert settings["ring-cp-8gpu"] == "sdpa"
    checks = ic.trap_checks(settings)
    assert [name for name, _, _ in checks][:6] == ["cuDNN", "SDPA backend", "driver", "flash-attn", "flash-attn-4",
                                                    "kernels hub"]
    assert len(checks) == 6 + len(settings)
    assert all(problem is None for _, _, problem in checks)


# --------------------------------------------------------------------------------------------------------
# cuDNN


def test_cudnn_number_is_torch_encoding():
    assert ic.cudnn_number("9.20.0.48") == 92000
    assert ic.cudnn_number("9.1.1.17") == 90101
    assert ic.cudnn_number("nine") is None


def test_cudnn_from_the_locked_wheel_passes(tmp_path):
    name, found, problem = ic.check_cudnn(fake_torch(), maps=maps_file(tmp_path, WHEEL_CUDNN))
    assert name == "cuDNN" and problem is None
    assert str(ic.cudnn_number(LOCKED_CUDNN)) in found and WHEEL_CUDNN in found and LOCKED_CUDNN in found
    # a CUDA build without a GPU still loads cuDNN: checked (the image checks it at build time and in CI)
    assert ic.check_cudnn(fake_torch(gpu=False), maps=maps_file(tmp_path, WHEEL_CUDNN))[2] is None


def test_cudnn_other_version_is_a_problem(tmp_path):
    system = "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"
    _, _, problem = ic.check_cudnn(fake_torch(cudnn=91000), maps=maps_file(tmp_path, system))
    assert problem and "91000" in problem and system in problem and "#48324" in problem


def test_cudnn_same_version_from_a_system_copy_is_a_problem(tmp_path):
    system = "/usr/local/cuda/lib64/libcudnn.so.9"
    _, _, problem = ic.check_cudnn(fake_torch(), maps=maps_file(tmp_path, system))
    assert problem and system in problem and "not from the nvidia-cudnn-cu13 wheel" in problem


def test_cudnn_missing_or_unlocked_is_a_problem(tmp_path):
    assert ic.check_cudnn(fake_torch(cudnn=None), maps=maps_file(tmp_path, WHEEL_CUDNN))[2]
    assert ic.check_cudnn(fake_torch(), lock={"torch": "2.13.0"}, maps=maps_file(tmp_path, WHEEL_CUDNN))[2]


# --------------------------------------------------------------------------------------------------------
# SDPA backend


def test_sdpa_backend_fast_paths_pass():
    def hopper(torch):
        return "FLASH_ATTENTION", "EFFICIENT_ATTENTION", True
    name, found, problem = ic.check_sdpa_backend(fake_torch(capability=(9, 0)), probe=hopper)
    assert name == "SDPA backend" and problem is None
    assert "9.0" in found and "FLASH_ATTENTION" in found and "EFFICIENT_ATTENTION" in found and "runs" in found
    # A100: cuDNN attention is not the fast path there, so it need not run
    assert ic.check_sdpa_backend(fake_torch(capability=(8, 0)),
                                 probe=lambda torch: ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", False))[2] is None


def test_sdpa_math_fallback_is_a_problem():
    _, _, problem = ic.check_sdpa_backend(fake_torch(capability=(8, 0)),
                                          probe=lambda torch: ("MATH", "MATH", False))
    assert problem and "math" in problem


def test_sdpa_cudnn_not_running_on_hopper_is_a_problem():
    _, found, problem = ic.check_sdpa_backend(fake_torch(capability=(9, 0)),
                                              probe=lambda torch: ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", False))
    assert problem and "cuDNN attention does not run" in problem and "does not run" in found
    assert ic.check_sdpa_backend(fake_torch(capability=(10, 0)),
                                 probe=lambda torch: ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", False))[2]


def test_sdpa_choice_reads_torchs_dispatcher():
    """On CPU, torch's own dispatcher answers for CPU tensors: the same call the GPU check makes."""
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 2, 8, 16)
    assert ic._sdpa_choice(torch, q, q, q, None, True) in {"FLASH_ATTENTION", "MATH"}


# --------------------------------------------------------------------------------------------------------
# driver


def test_driver_new_enough_passes(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu Sep 25 2025\n")
    name, found, problem = ic.check_driver(fake_torch(driver=13000), proc=proc)
    assert name == "driver" and problem is None and "580.95.05" in found and "13.0" in found
    assert ic.check_driver(fake_torch(driver=13020), proc=tmp_path / "absent")[2] is None


def test_driver_too_old_is_a_problem(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul 8 2025\n")
    _, _, problem = ic.check_driver(fake_torch(driver=12080), proc=proc)
    assert problem and "12.8" in problem and "R580" in problem and "570.172.08" in problem
    assert ic.check_driver(fake_torch(driver=None), proc=proc)[2]


# --------------------------------------------------------------------------------------------------------
# flash-attn


def test_flash_attn_absent_is_reported_not_a_problem():
    _, found, problem = ic.check_flash_attn(fake_torch(), state=(None, None, None))
    assert problem is None and "not installed" in found and "FLASH_ATTN=1" in found


def test_flash_attn_that_imports_with_a_kernel_for_this_gpu_passes():
    _, found, problem = ic.check_flash_attn(fake_torch(capability=(9, 0)), state=("2.8.3.post2", None, None),
                                            archs=[80, 90])
    assert problem is None and "2.8.3.post2" in found and "sm_90" in found


def test_flash_attn_abi_mismatch_is_a_problem():
    error = "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    _, _, problem = ic.check_flash_attn(fake_torch(), state=("2.8.3.post2", error, None))
    assert problem and "undefined symbol" in problem and "2.13.0" in problem


def test_flash_attn_without_a_kernel_for_this_gpu_is_a_problem():
    _, _, problem = ic.check_flash_attn(fake_torch(capability=(10, 0)), state=("2.8.3.post2", None, None),
                                        archs=[80, 90])
    assert problem and "10.0" in problem and "TORCH_CUDA_ARCH_LIST" in problem
    assert ic.runs_on([80, 90], (8, 6)) and ic.runs_on([80, 90], (9, 0))
    assert not ic.runs_on([80, 90], (10, 0)) and not ic.runs_on([86], (8, 0))


def test_flash_attn_import_reports_what_fails(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.8.3.post2")

    def broken(name):
        if name == "flash_attn_2_cuda":
            raise ImportError("undefined symbol: _ZN3c104cuda9SetDeviceEi")
        return SimpleNamespace(__file__="/x.so")

    version, error, library = ic.flash_attn_import(broken)
    assert version == "2.8.3.post2" and "undefined symbol" in error and library is None
    assert ic.flash_attn_import(lambda name: SimpleNamespace(__file__="/x.so")) == ("2.8.3.post2", None, "/x.so")


def fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fat binary as nvcc lays it out: header (magic, version, header size, size), then entries (kind,
    version, header size, payload size, ..., arch at byte 28) each followed by its payload."""
    body = b""
    for kind, arch in entries:
        payload = b"\x7fELF" + bytes(12)
        header = struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)
        body += header + bytes(64 - len(header)) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_archs_reads_the_elf_entries(tmp_path):
    library = tmp_path / "flash_attn_2_cuda.so"
    library.write_bytes(b"\x7fELF junk" + fatbin([(2, 80), (1, 80), (2, 90)]) + b"more" + fatbin([(2, 90)]))
    assert ic.fatbin_archs(library) == [80, 90]  # PTX entries (kind 1) are not machine code
    library.write_bytes(b"no fat binary here")
    assert ic.fatbin_archs(library) == []


# --------------------------------------------------------------------------------------------------------
# attention per recipe


H100, A100 = (9, 0), (8, 0)
FA4 = "4.0.0b36"


def facts(capability=H100, gpu=True, flash_attn_2=False, flash_attn_4=FA4, error=None, kernels=False):
    return ic.AttentionFacts(gpu=gpu, capability=capability if gpu else None, flash_attn_2=flash_attn_2,
                             flash_attn_4=flash_attn_4, flash_attn_4_error=error, kernels=kernels)


def test_recipe_attention_on_a_gpu():
    recipes = {"ddp": "flash_attention_2", "ring-cp-8gpu": "sdpa"}
    paths = {"ddp": "dp", "ring-cp-8gpu": "cp"}
    with_flash = dict((n, (f, p)) for n, f, p in
                      ic.check_recipes(recipes, fake_torch(), state=("2.8.3.post2", None, "/x.so"), paths=paths))
    assert with_flash["attention ddp"] == ("flash_attention_2 (flash-attn)", None)
    assert with_flash["attention ring-cp-8gpu"] == ("sdpa (ring CP dispatches SDPA only)", None)
    without = dict((n, (f, p)) for n, f, p in ic.check_recipes(recipes, fake_torch(), state=(None, None, None),
                                                               paths=paths))
    found, problem = without["attention ddp"]
    assert problem and "FLASH_ATTN=1" in problem and "attn_implementation: sdpa" in problem
    assert without["attention ring-cp-8gpu"][1] is None
    broken = dict((n, (f, p)) for n, f, p in
                  ic.check_recipes(recipes, fake_torch(), state=("2.8.3.post2", "ImportError: x", None), paths=paths))
    assert broken["attention ddp"][1]


def test_which_attention_each_layout_gets_and_why():
    """flash-attn-4 (no compile) where transformers runs it (compute capability >= 9) for the padded DP/ZeRO/FSDP
    recipes, offered as an opt-in beside their sdpa; never for ring CP (SDPA only) or Ulysses SP (Accelerate
    refuses it); every refusal names the fallback, SDPA."""
    get = ic.recipe_attention
    found, problem = get("zero3", "sdpa", facts(), "dp")
    assert problem is None and found.startswith("sdpa (the recipe's setting)")
    assert "-- --attn_implementation flash_attention_4" in found
    assert get("zero3", "flash_attention_4", facts(), "dp") == (
        "flash_attention_4 (flash-attn-4 4.0.0b36; its kernels are JIT-compiled at first use)", None)
    # A100: no flash-attn-4 offer, and asking for it is refused, naming why and the fallback
    found, problem = get("zero3", "sdpa", facts(A100), "dp")
    assert problem is None and "flash_attention_4" not in found
    found, problem = get("zero3", "flash_attention_4", facts(A100), "dp")
    assert found.startswith("nothing") and "compute capability is 8.0" in problem
    # not installed, or installed but broken
    assert "flash-attn-4 is not installed" in get("zero3", "flash_attention_4", facts(flash_attn_4=None), "dp")[1]
    assert "does not import (OSError: libcuda" in get("zero3", "flash_attention_4",
                                                      facts(error="OSError: libcuda.so.1"), "dp")[1]
    # Ulysses SP and ring CP
    assert "Accelerate's ParallelismConfig refuses" in get("alst-ulysses-8gpu", "flash_attention_4", facts(), "sp")[1]
    assert get("alst-ulysses-8gpu", "sdpa", facts(), "sp")[0].startswith("sdpa (the recipe's setting (Ulysses")
    assert "flash_attention_4" not in get("alst-ulysses-8gpu", "sdpa", facts(), "sp")[0]
    assert "ring-attention CP dispatches SDPA only" in get("ring-cp-8gpu", "flash_attention_2", facts(), "cp")[1]
    # the kernels hub would stand in for a missing flash-attn where it is usable (not at our pins)
    assert get("zero3", "flash_attention_2", facts(kernels=True), "dp")[0].startswith("kernels-community/flash-attn2")
    assert "kernels hub" in get("zero3", "flash_attention_3", facts(), "dp")[1]
    # every refusal names the fallback every recipe runs
    refusals = [get("r", want, f, path)[1] for want in ("flash_attention_2", "flash_attention_3", "flash_attention_4",
                                                        "kernels-community/flash-attn3")
                for f in (facts(), facts(A100), facts(flash_attn_4=None)) for path in ("dp", "sp", "cp")]
    assert all("set attn_implementation: sdpa" in p for p in refusals if p), refusals
    # no GPU: what a GPU would run, and the opt-in where the image has flash-attn-4
    found, problem = get("zero3", "sdpa", facts(gpu=False), "dp")
    assert problem is None and found.startswith(ic.NOT_CHECKED) and "flash_attention_4" in found


def test_the_attention_rules_are_upstreams():
    """The facts the rules above encode, read from the installed transformers and Accelerate."""
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    assert FLASH_ATTENTION_COMPATIBILITY_MATRIX[4]["cuda_min_major_version"] == ic.FLASH_ATTN_4_MIN_MAJOR
    with pytest.raises(ValueError, match="flash_attention_4"):
        DeepSpeedSequenceParallelConfig(sp_attn_implementation=ic.FLASH_ATTN_4)
    for name in ic.SP_BUILTIN_ATTENTION:
        DeepSpeedSequenceParallelConfig(sp_attn_implementation=name)
    assert ic.recipe_paths(["ring-cp-8gpu", "alst-ulysses-8gpu", "zero3"]) == {
        "ring-cp-8gpu": "cp", "alst-ulysses-8gpu": "sp", "zero3": "dp"}


def test_flash_attn_4_check():
    torch = fake_torch()
    assert ic.check_flash_attn_4(torch, state=(FA4, None)) == (
        "flash-attn-4", f"{FA4}, imports; usable as attn_implementation flash_attention_4 on this GPU", None)
    name, found, problem = ic.check_flash_attn_4(torch, state=(FA4, "ImportError: no cutlass"))
    assert problem and "does not import (ImportError: no cutlass)" in problem
    assert "not for this GPU (compute capability 8.0" in ic.check_flash_attn_4(fake_torch(capability=A100),
                                                                               state=(FA4, None))[1]
    assert "not imported (no GPU" in ic.check_flash_attn_4(fake_torch(gpu=False), state=(FA4, None))[1]
    assert ic.check_flash_attn_4(torch, state=(None, None))[1].startswith("not installed")
    assert ic.check_flash_attn_4(fake_torch(cuda=None, gpu=False)) == ("flash-attn-4", ic.NOT_CHECKED, None)


def test_kernels_hub_route():
    """transformers uses Hub kernels only with `kernels` at the versions it names (5.23: >= 0.18.2, < 0.19, which
    PyPI did not have when the locks were made: requirements/pins.txt)."""
    requirement = ic.kernels_requirement()
    assert requirement and requirement.startswith("kernels")
    usable, why = ic.kernels_route("kernels>=0.18.2,<0.19", None)
    assert not usable and "not installed" in why
    usable, why = ic.kernels_route("kernels>=0.18.2,<0.19", "0.17.2")
    assert not usable and "kernels 0.17.2 is installed" in why
    assert ic.kernels_route("kernels>=0.18.2,<0.19", "0.18.2")[0]
    assert "kernels" not in pinfiles.read_lock(pinfiles.IMAGE_LOCK), "the lock has kernels: revisit this route"


def test_bitsandbytes_check():
    torch = fake_torch(cuda=None, gpu=False)
    assert ic.check_bitsandbytes(torch, roundtrip=lambda t, d: 0.03)[2] is None
    assert "max error 0.030" in ic.check_bitsandbytes(torch, roundtrip=lambda t, d: 0.03)[1]

    def broken(torch, device):
        raise RuntimeError("no kernel for cpu")
    assert "cannot quantize to 4-bit on cpu" in ic.check_bitsandbytes(torch, roundtrip=broken)[2]
    assert "is off by 0.900" in ic.check_bitsandbytes(torch, roundtrip=lambda t, d: 0.9)[2]
    assert "is off by nan" in ic.check_bitsandbytes(torch, roundtrip=lambda t, d: float("nan"))[2]


def test_bitsandbytes_4bit_runs_on_this_cpu():
    """The lock's bitsandbytes with torch's CPU build: NF4 with double quantization and bf16 storage (QLoRA's
    settings) round-trips on CPU (measured: max error 0.035 on values in [-1, 1])."""
    name, found, problem = ic.check_bitsandbytes()
    assert problem is None, problem
    assert "on cpu" in found


def test_every_recipe_runs_in_the_default_image():
    """The default image has no flash-attn (FLASH_ATTN=1 builds it): every recipe asks for SDPA, which its data layout
    makes equal to FlashAttention 2 (the tests below), and the Ulysses recipes' Accelerate configs agree."""
    from launch.recipe.discovery import find_recipe

    settings = ic.recipe_attn_settings()
    assert set(settings.values()) == {"sdpa"}, settings
    for name in ("alst-ulysses-4gpu", "alst-ulysses-8gpu"):
        pc = find_recipe(name).accelerate["parallelism_config"]
        assert pc["parallelism_config_sp_attn_implementation"] == "sdpa", name


# --------------------------------------------------------------------------------------------------------
# the facts behind the attention recommendation (CPU, transformers' SDPA path)


@pytest.fixture(scope="module")
def tiny_models():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    models = {}
    for impl in ("sdpa", "eager"):
        torch.manual_seed(0)
        models[impl] = transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()
    return torch, models


def test_sdpa_keeps_packed_documents_apart(tiny_models):
    """TRL's padding-free rows (bfd packing): one row, position_ids restarting at each document, no attention
    mask. With use_cache=False (TRL's compute_loss sets it), transformers' masking_utils finds the documents
    from the position_ids (find_packed_sequence_indices) and SDPA gets a block-diagonal causal mask: each
    document's logits equal those of the document alone. With the cache on, the detection is skipped and the
    documents attend to each other: the control that shows the comparison can fail."""
    torch, models = tiny_models
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(1)
    docs = [torch.randint(1, 97, (n,)).tolist() for n in (5, 7, 3)]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": d} for d in docs])
    assert "attention_mask" not in batch and batch["input_ids"].shape == (1, 15)
    for impl, model in models.items():
        with torch.no_grad():
            alone = torch.cat([model(input_ids=torch.tensor([d]), use_cache=False).logits[0] for d in docs])
            packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
            leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=True).logits[0]
        assert (packed - alone).abs().max().item() < 1e-5, impl
        assert (leaky - alone).abs().max().item() > 1e-2, impl


def test_sdpa_on_padded_batches_equals_each_sequence_alone(tiny_models):
    """ddp and zero* (no packing): right-padded batches with a 2-D attention mask."""
    torch, models = tiny_models
    torch.manual_seed(2)
    seqs = [torch.randint(1, 97, (n,)) for n in (9, 4, 6)]
    width = max(len(s) for s in seqs)
    ids = torch.stack([torch.cat([s, torch.zeros(width - len(s), dtype=torch.long)]) for s in seqs])
    mask = torch.stack([torch.arange(width) < len(s) for s in seqs]).long()
    for impl, model in models.items():
        with torch.no_grad():
            batched = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            for row, s in enumerate(seqs):
                alone = model(input_ids=s[None], use_cache=False).logits[0]
                assert (batched[row, : len(s)] - alone).abs().max().item() < 1e-5, impl


def test_sdpa_without_document_boundaries_is_plain_causal(tiny_models):
    """ALST/Ulysses with wrapped packing: rows of exactly max_length, positions 0..L-1, no boundaries;
    DeepSpeed's Ulysses wrapper drops the mask, and SDPA then runs is_causal. Same logits as eager causal."""
    torch, models = tiny_models
    torch.manual_seed(3)
    ids = torch.randint(1, 97, (2, 16))
    positions = torch.arange(16)[None].expand(2, -1)
    with torch.no_grad():
        sdpa = models["sdpa"](input_ids=ids, position_ids=positions, use_cache=False).logits
        eager = models["eager"](input_ids=ids, position_ids=positions, use_cache=False).logits
    assert (sdpa - eager).abs().max().item() < 1e-5
