"""`launch doctor`: what the container checks at start, fed mismatched versions and too few GPUs."""

from __future__ import annotations

import pytest

from helpers.launcher import explain, launch_cli
from launch import doctor as doctor_module
from launch import pins as pinfiles
from launch.doctor import GPU_ONLY, IMAGE_OPTIONAL, read_pins, run_doctor
from launch.machine import REPORTED
from launch.options import Options
from launch.resolve import resolve

PINS = read_pins()


def pinned_versions(**changes):
    versions = {name: PINS[name] for name in REPORTED}
    versions.update({k.replace("_", "-"): v for k, v in changes.items()})
    return versions


def doctor(setup=None, versions=None, gpus=("NVIDIA H100 80GB HBM3",) * 8, strict=True, installed=None):
    lines: list[str] = []
    n = run_doctor(setup, versions=versions or pinned_versions(), gpus=list(gpus), strict=strict, out=lines.append,
                   installed=installed)
    return n, "\n".join(lines)


def test_pinned_versions_and_enough_gpus_pass():
    n, out = doctor(resolve(Options(recipe="zero3")))
    assert n == 0, out
    assert "doctor: ok" in out


def test_a_version_that_differs_from_the_pin_is_a_problem():
    n, out = doctor(versions=pinned_versions(transformers="5.22.0"))
    assert n == 1
    assert f"PROBLEM: transformers 5.22.0 is installed but {PINS['transformers']} is pinned" in out


def test_torch_local_build_label_matches_its_pin():
    n, out = doctor(versions=pinned_versions(torch=PINS["torch"] + "+cu130"))
    assert n == 0, out


def test_gpu_only_packages_are_required_in_the_image_only():
    versions = pinned_versions(**{name: None for name in GPU_ONLY})
    n, out = doctor(versions=versions, strict=True)
    # flash-attn is opt-in in the image too (FLASH_ATTN=1): liger-kernel and flash-attn-4 are required there
    assert GPU_ONLY - IMAGE_OPTIONAL == {"liger-kernel", "flash-attn-4"}
    assert n == 2 and "liger-kernel is not installed" in out and "flash-attn-4 is not installed" in out
    assert "flash-attn is not installed" not in out
    n, out = doctor(versions=versions, strict=False)
    assert n == 0, out


def test_too_few_gpus_for_the_recipe():
    n, out = doctor(resolve(Options(recipe="zero3")), gpus=["NVIDIA A100-SXM4-80GB"] * 4)
    assert n == 1
    assert "asks for 8 GPU(s) on this machine but 4 GPU(s) are visible" in out


def test_feature_floor_below_pin():
    n, out = doctor(resolve(Options(recipe="zero3")), versions=pinned_versions(deepspeed="0.14.0"))
    assert "deepspeed needs deepspeed>=0.15.0, found 0.14.0" in out
    assert n == 2  # the floor, and the mismatch with the pin


def test_the_performance_traps_are_reported_and_a_trap_is_a_problem(monkeypatch):
    """doctor prints launch.image_checks' lines (cuDNN, SDPA backend, driver, flash-attn, the attention each recipe
    gets) and counts a trap as a problem; on this CPU venv every one says it was not checked."""
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu")))
    assert n == 0, out
    for name in ("cuDNN", "SDPA backend", "driver", "flash-attn", "flash-attn-4", "kernels hub", "attention ring-cp-8gpu"):
        assert f"\n{name:<14} " in f"\n{out}", name
    from launch import image_checks

    monkeypatch.setattr(image_checks, "trap_checks", lambda recipe_attn, **kwargs: [
        ("cuDNN", "90100 from /usr/lib/libcudnn.so.9", "cuDNN 90100 is loaded, the lock has 9.20.0.48")])
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu")))
    assert n == 1 and "PROBLEM: cuDNN 90100 is loaded, the lock has 9.20.0.48" in out


def test_doctor_cli_on_this_venv_passes():
    """This venv is built from requirements/cpu.lock (ci/setup.sh), so doctor compares it with that lock."""
    proc = launch_cli("doctor", "zero3", "--cpu")
    assert proc.returncode == 0, explain(proc)
    assert "doctor: ok" in proc.stdout
    assert "lock           cpu.lock: the installed versions match" in proc.stdout


def test_pins_and_locks_are_read_by_one_parser():
    """launch/pins.py (packaging) reads pins.txt and the locks for doctor, ci/setup.sh, lock.sh and the tests."""
    assert doctor_module.read_pins is pinfiles.read_pins
    assert pinfiles.parse_pins("PyYAML==6.0.3  # comment\n\ntorch==2.13.0+cpu\n    # via\n    #   trl\n") == {
        "pyyaml": "6.0.3", "torch": "2.13.0+cpu"}
    for bad in ("torch>=2.0", "torch", "torch==2.*", "-c pins.txt", "torch==2.13.0; sys_platform == 'linux'",
                "torch @ https://example.invalid/torch.whl", "torch==2.13.0\nTorch==2.13.0", "torch==2.13.0 extra"):
        with pytest.raises(pinfiles.PinError):
            pinfiles.parse_pins(bad)
    assert pinfiles.parse_names("-c pins.txt\ntorch\nPyYAML  # comment\n") == ["torch", "pyyaml"]
    with pytest.raises(pinfiles.PinError):
        pinfiles.parse_names("torch==2.13.0")
    # a lock entry with a local label wants that build; one without accepts any build of the release
    assert pinfiles.satisfies("2.13.0+cpu", "2.13.0+cpu") and pinfiles.satisfies("2.13.0+cu130", "2.13.0")
    assert not pinfiles.satisfies("2.13.0+cu130", "2.13.0+cpu") and not pinfiles.satisfies("2.13.1", "2.13.0")


def test_installed_packages_against_the_image_lock():
    """In the image (strict) every package of image.lock is installed at its version, and nothing else is."""
    image = pinfiles.read_lock(pinfiles.IMAGE_LOCK)
    n, out = doctor(installed=dict(image))
    assert n == 0 and "lock           image.lock: the installed versions match" in out, out
    numpy = image["numpy"]
    n, out = doctor(installed={**image, "numpy": "1.0.0"})
    assert n == 1 and f"PROBLEM: numpy 1.0.0 is installed but image.lock locks {numpy}" in out, out
    n, out = doctor(installed={k: v for k, v in image.items() if k != "cuda-bindings"})
    assert n == 1 and f"PROBLEM: cuda-bindings is not installed (image.lock locks {image['cuda-bindings']})" in out
    n, out = doctor(installed={**image, "vllm": "0.1.0", "pip": "24.0", "llm-recipes": "0.1.0"})
    assert n == 1 and "PROBLEM: vllm 0.1.0 is installed but not pinned in image.lock" in out, out


def test_installed_packages_against_the_cpu_lock_outside_the_image():
    """Elsewhere the CPU lock: installed packages at other versions are problems, missing or extra ones not."""
    cpu = pinfiles.read_lock(pinfiles.CPU_LOCK)
    versions = pinned_versions(**{name: None for name in GPU_ONLY})
    n, out = doctor(versions=versions, strict=False, installed={**{k: v for k, v in cpu.items() if k != "uv"},
                                                                "ipython": "9.0.0"})
    assert n == 0 and "lock           cpu.lock: the installed versions match" in out, out
    n, out = doctor(versions=versions, strict=False, installed={**cpu, "numpy": "1.0.0"})
    assert n == 1 and f"PROBLEM: numpy 1.0.0 is installed but cpu.lock locks {cpu['numpy']}" in out, out


def test_doctor_at_container_start_stops_before_training(tmp_path):
    """With LAUNCH_DOCTOR_AT_START=1 (set in the image) a failed check exits non-zero and starts nothing: here the
    GPU-only packages are absent, as in a broken image."""
    proc = launch_cli("ddp", "--smoke", "--cpu", "--output-dir", tmp_path / "out", env={"LAUNCH_DOCTOR_AT_START": "1"})
    assert proc.returncode == 2, explain(proc)
    assert "The environment check failed" in proc.stderr
    assert "liger-kernel is not installed" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_liger_recipe_needs_an_importable_liger_kernel():
    liger = ["--use_liger_kernel", "true"]
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu", extra=liger)))
    assert n == 1 and "liger-kernel does not import" in out
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu", cpu=True, extra=liger)))
    assert n == 0, out


def test_doctor_checks_the_adapter_packages_and_their_4bit_path(monkeypatch):
    """peft and bitsandbytes are reported against their pins on both platforms; bitsandbytes' 4-bit round trip runs
    for doctor without a recipe and for a recipe that loads its base model in 4 or 8 bits, not at every start."""
    n, out = doctor(versions=pinned_versions(peft="0.20.0"))
    assert n == 1 and f"PROBLEM: peft 0.20.0 is installed but {PINS['peft']} is pinned" in out
    n, out = doctor(versions=pinned_versions(bitsandbytes=None), strict=False)
    assert n == 1 and "bitsandbytes is not installed" in out
    from launch import image_checks

    asked = []
    real = image_checks.trap_checks
    monkeypatch.setattr(image_checks, "trap_checks", lambda recipe_attn, **kw: asked.append(kw["quantized"]) or
                        real(recipe_attn, paths=kw.get("paths")))
    doctor(resolve(Options(recipe="zero3")))
    doctor(resolve(Options(recipe="zero3", extra=["--load_in_4bit", "true"])))
    doctor()
    assert asked == [False, True, True]
