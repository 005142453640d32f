"""launch/image_checks.py: the performance-trap checks doctor and the image's start run (cuDNN, SDPA backend,
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

from launch import image_checks as ic
from launch import pins as pinfiles

LOCKED_CUDNN = pinfiles.read_lock(pinfiles.IMAGE_LOCK)["nvidia-cudnn-cu13"]


def fake_torch(*, cuda="13.0", gpu=True, cudnn=ic.cudnn_number(LOCKED_CUDNN), capability=(9, 0), driver=13000):
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
    code = ("import sys, launch.image_checks; "
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'deepspeed') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_without_cuda_every_check_says_not_checked():
    """torch's CPU build: every check, the per-recipe ones too, says so and passes; with a CUDA build but no GPU
    only the library checks (cuDNN, flash-attn) run."""
    checks = ic.trap_checks({"ddp": "flash_attention_2", "ring-cp-8gpu": "sdpa"},
                            torch_module=fake_torch(cuda=None, gpu=False))
    assert len(checks) == 6
    for name, found, problem in checks:
        assert problem is None, (name, problem)
        assert found.startswith(ic.NOT_CHECKED), (name, found)
    no_gpu = {name: found for name, found, _ in ic.trap_checks({"ddp": "sdpa"}, torch_module=fake_torch(gpu=False))}
    assert no_gpu["SDPA backend"] == no_gpu["driver"] == ic.NOT_CHECKED
    assert not no_gpu["cuDNN"].startswith(ic.NOT_CHECKED) and not no_gpu["flash-attn"].startswith(ic.NOT_CHECKED)


def test_on_this_machine_the_checks_run_without_problems():
    """The CPU venv (torch's CPU build): nothing to check, nothing fails; every recipe is listed."""
    settings = ic.recipe_attn_settings()
    assert {"ddp", "zero3", "ring-cp-8gpu", "alst-ulysses-8gpu"} <= settings.keys()
    assert settings["ring-cp-8gpu"] == "sdpa"
    checks = ic.trap_checks(settings)
    assert [name for name, _, _ in checks][:4] == ["cuDNN", "SDPA backend", "driver", "flash-attn"]
    assert len(checks) == 4 + len(settings)
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


def test_recipe_attention_on_a_gpu():
    recipes = {"ddp": "flash_attention_2", "ring-cp-8gpu": "sdpa"}
    with_flash = dict((n, (f, p)) for n, f, p in
                      ic.check_recipes(recipes, fake_torch(), state=("2.8.3.post2", None, "/x.so")))
    assert with_flash["attention ddp"] == ("flash_attention_2 (flash-attn)", None)
    assert with_flash["attention ring-cp-8gpu"] == ("sdpa", None)
    without = dict((n, (f, p)) for n, f, p in ic.check_recipes(recipes, fake_torch(), state=(None, None, None)))
    found, problem = without["attention ddp"]
    assert problem and "FLASH_ATTN=1" in problem and "attn_implementation: sdpa" in problem
    assert without["attention ring-cp-8gpu"] == ("sdpa", None)
    broken = dict((n, (f, p)) for n, f, p in
                  ic.check_recipes(recipes, fake_torch(), state=("2.8.3.post2", "ImportError: x", None)))
    assert broken["attention ddp"][1]


def test_every_recipe_runs_in_the_default_image():
    """The default image has no flash-attn (FLASH_ATTN=1 builds it): every recipe asks for SDPA, which its data layout
    makes equal to FlashAttention 2 (the tests below), and the Ulysses recipes' Accelerate configs agree."""
    from launch.recipes import find_recipe

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
