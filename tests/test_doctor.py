"""`launch doctor`: what the container checks at start, fed mismatched versions and too few GPUs."""

from __future__ import annotations

import pytest

from conftest import explain, launch_cli
from launch import doctor as doctor_module
from launch.doctor import GPU_ONLY, REPORTED, read_pins, run_doctor
from launch.resolve import Options, resolve

PINS = read_pins()


def pinned_versions(**changes):
    versions = {name: PINS[name] for name in REPORTED}
    versions.update({k.replace("_", "-"): v for k, v in changes.items()})
    return versions


def doctor(setup=None, versions=None, gpus=("NVIDIA H100 80GB HBM3",) * 8, strict=True):
    lines: list[str] = []
    n = run_doctor(setup, versions=versions or pinned_versions(), gpus=list(gpus), strict=strict, out=lines.append)
    return n, "\n".join(lines)


@pytest.fixture
def flash_attn_imports(monkeypatch):
    """For the tests about other checks: pretend flash-attn imports, as it does in a good image."""
    monkeypatch.setattr(doctor_module, "flash_attn_problem", lambda: None)


@pytest.mark.usefixtures("flash_attn_imports")
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
    assert n == len(GPU_ONLY) and "flash-attn is not installed" in out
    n, out = doctor(versions=versions, strict=False)
    assert n == 0, out


@pytest.mark.usefixtures("flash_attn_imports")
def test_too_few_gpus_for_the_recipe():
    n, out = doctor(resolve(Options(recipe="zero3")), gpus=["NVIDIA A100-SXM4-80GB"] * 4)
    assert n == 1
    assert "asks for 8 GPU(s) on this machine but 4 GPU(s) are visible" in out


@pytest.mark.usefixtures("flash_attn_imports")
def test_feature_floor_below_pin():
    n, out = doctor(resolve(Options(recipe="zero3")), versions=pinned_versions(deepspeed="0.14.0"))
    assert "deepspeed needs deepspeed>=0.15.0, found 0.14.0" in out
    assert n == 2  # the floor, and the mismatch with the pin


def test_flash_attention_recipe_needs_an_importable_flash_attn():
    """The CPU venv has no flash-attn, which is exactly what a broken image looks like."""
    n, out = doctor(resolve(Options(recipe="ddp")))  # config.yaml: attn_implementation flash_attention_2
    assert n == 1 and "flash-attn does not import" in out


def test_doctor_cli_on_this_venv_passes():
    proc = launch_cli("doctor", "zero3", "--cpu")
    assert proc.returncode == 0, explain(proc)
    assert "doctor: ok" in proc.stdout


def test_doctor_at_container_start_stops_before_training(tmp_path):
    """With LAUNCH_DOCTOR_AT_START=1 (set in the image) a failed check exits non-zero and starts nothing: here the
    GPU-only packages are absent, as in a broken image."""
    proc = launch_cli("ddp", "--smoke", "--cpu", "--output-dir", tmp_path / "out", env={"LAUNCH_DOCTOR_AT_START": "1"})
    assert proc.returncode == 2, explain(proc)
    assert "The environment check failed" in proc.stderr
    assert "flash-attn is not installed" in proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("flash_attn_imports")
def test_liger_recipe_needs_an_importable_liger_kernel():
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu")))  # config.yaml: use_liger_kernel true
    assert n == 1 and "liger-kernel does not import" in out
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu", cpu=True)))
    assert n == 0, out
