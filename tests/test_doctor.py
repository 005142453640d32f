"""`launch doctor`: what the container checks at start, fed mismatched versions and too few GPUs."""

from __future__ import annotations

import pytest

from helpers.launcher import explain, launch_cli
from launch.checks import doctor as doctor_module
from launch.facts import bundle as bundlefiles
from launch.facts import pins as pinfiles
from launch.checks.doctor import GPU_ONLY, IMAGE_OPTIONAL, read_pins, run_doctor
from launch.facts.machine import REPORTED
from launch.config.options import Options
from launch.run.resolve import resolve

PINS = read_pins()


def pinned_versions(**changes):
    versions = {name: PINS[name] for name in REPORTED}
    versions.update({k.replace("_", "-"): v for k, v in changes.items()})
    return versions


def doctor(setup=None, versions=None, gpus=("NVIDIA H100 80GB HBM3",) * 8, strict=True, installed=None, host=None):
    lines: list[str] = []
    n = run_doctor(setup, versions=versions or pinned_versions(), gpus=list(gpus), strict=strict, out=lines.append,
                   installed=installed, host=host)
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
    """doctor prints launch.checks.image' lines (cuDNN, SDPA backend, driver, flash-attn, the attention each recipe
    gets) and counts a trap as a problem; on this CPU venv every one says it was not checked."""
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu")))
    assert n == 0, out
    for name in ("cuDNN", "SDPA backend", "driver", "flash-attn", "flash-attn-4", "kernels hub",
                 "attention ring-cp-8gpu"):
        assert f"\n{name:<14} " in f"\n{out}", name
    from launch.checks import image as image_checks

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
    """launch/facts/pins.py (packaging) reads pins.txt and the locks for doctor, ci/setup.sh, lock.sh and the tests."""
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


def test_liger_recipe_needs_liger_kernel_installed():
    """doctor checks Liger with the run's own rule (rules.liger_kernel_installed), once."""
    liger = ["--use_liger_kernel", "true"]
    without = {k: v for k, v in pinned_versions().items() if k != "liger-kernel"}
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu", extra=liger)), versions=without)
    assert n == 1 and out.count("needs liger-kernel, which is not installed here") == 1, out
    n, out = doctor(resolve(Options(recipe="ring-cp-8gpu", extra=liger)))
    assert n == 0, out



def test_doctor_checks_the_adapter_packages_and_their_4bit_path(monkeypatch):
    """peft and bitsandbytes are reported against their pins on both platforms; bitsandbytes' 4-bit round trip runs
    for doctor without a recipe and for a recipe that loads its base model in 4 or 8 bits, not at every start."""
    n, out = doctor(versions=pinned_versions(peft="0.20.0"))
    assert n == 1 and f"PROBLEM: peft 0.20.0 is installed but {PINS['peft']} is pinned" in out
    n, out = doctor(versions=pinned_versions(bitsandbytes=None), strict=False)
    assert n == 1 and "bitsandbytes is not installed" in out
    from launch.checks import image as image_checks

    asked = []
    real = image_checks.trap_checks
    monkeypatch.setattr(image_checks, "trap_checks", lambda recipe_attn, **kw: asked.append(kw["quantized"]) or
                        real(recipe_attn, paths=kw.get("paths")))
    doctor(resolve(Options(recipe="zero3")))
    doctor(resolve(Options(recipe="zero3", extra=["--load_in_4bit", "true"])))
    doctor()
    assert asked == [False, True, True]


# ---- a virtualenv judged against the lock it was set up from (its setup marker: ci/setup.sh --gpu / --from)
# ------------

def test_a_venv_is_judged_against_the_lock_its_setup_marker_names(tmp_path):
    """`ci/setup.sh --gpu` writes a marker naming image.lock: doctor reads it (from sys.prefix; here a folder) and
    requires the whole lock (its GPU-only packages included), extra packages allowed; no marker: the CPU lock."""
    image = pinfiles.read_lock(pinfiles.IMAGE_LOCK)
    assert pinfiles.host_lock(False, prefix=tmp_path).path == pinfiles.CPU_LOCK  # no marker: today's choice
    assert pinfiles.host_lock(True, prefix=tmp_path).path == pinfiles.IMAGE_LOCK
    pinfiles.write_marker(tmp_path, pinfiles.IMAGE_LOCK, "ci/setup.sh --gpu")
    host = pinfiles.host_lock(False, prefix=tmp_path)
    assert (host.path, host.require_all, host.exact, host.machine) == (pinfiles.IMAGE_LOCK, True, False, frozenset())
    n, out = doctor(installed={**image, "ipython": "9.0.0"}, strict=False, host=host)
    assert n == 0 and ("lock           image.lock: the installed versions match (set up by `ci/setup.sh --gpu`, "
                       f"{tmp_path.name}/llm-recipes-setup.json)") in out, out
    n, out = doctor(installed={k: v for k, v in image.items() if k != "xxhash"}, strict=False, host=host)
    assert n == 1 and f"PROBLEM: xxhash is not installed (image.lock locks {image['xxhash']})" in out, out
    n, out = doctor(versions=pinned_versions(**{"liger-kernel": None}), installed=image, strict=False, host=host)
    assert n == 1 and "PROBLEM: liger-kernel is not installed" in out, out
    # the same venv without its marker is judged as the CPU venv: GPU-only packages may be missing there
    n, out = doctor(versions=pinned_versions(**{"liger-kernel": None}), strict=False,
                    host=pinfiles.host_lock(False, prefix=tmp_path / "other"))
    assert n == 0, out
    # a broken marker is named
    (tmp_path / pinfiles.MARKER).write_text("{")
    with pytest.raises(pinfiles.PinError, match="is not a setup marker"):
        pinfiles.host_lock(False, prefix=tmp_path)


def test_a_bundle_venv_reports_the_machines_torch_build_without_failing_on_it(tmp_path, monkeypatch):
    """`ci/setup.sh --from DIR` (the bundle on top of the machine's own torch): torch, triton and the CUDA wheels
    differ from image.lock by choice; doctor names each difference in one line and counts none of them, while any
    other package that differs is a problem. The loaded cuDNN is held to the machine's own cuDNN wheel."""
    image = pinfiles.read_lock(pinfiles.IMAGE_LOCK)
    manifest = bundlefiles.write_bundle(tmp_path / "bundle", "3.12", "manylinux_2_28_x86_64")
    pinfiles.write_marker(tmp_path, pinfiles.IMAGE_LOCK, "ci/setup.sh --from bundle", tmp_path / "bundle")
    host = pinfiles.host_lock(False, prefix=tmp_path)
    assert host.machine == frozenset(manifest["machine_packages"])
    assert {"torch", "triton", "nvidia-cudnn-cu13"} <= host.machine
    machine = {"torch": "2.11.0+cu130", "triton": "3.5.1", "nvidia-cudnn-cu13": "9.19.0.56"}
    installed = {**image, **machine}
    del installed["cuda-toolkit"]
    kwargs = []
    from launch.checks import image as image_checks

    real = image_checks.trap_checks
    monkeypatch.setattr(image_checks, "trap_checks", lambda recipe_attn, **kw: kwargs.append(kw) or real(
        recipe_attn, paths=kw.get("paths")))
    n, out = doctor(versions=pinned_versions(torch="2.11.0+cu130"), installed=installed, strict=False, host=host)
    assert n == 0, out
    left = len(host.machine)
    assert ("machine torch  the machine's own, not judged against image.lock: 3 differ: nvidia-cudnn-cu13 9.19.0.56 "
            f"(image.lock: {image['nvidia-cudnn-cu13']}), torch 2.11.0+cu130 (image.lock: {image['torch']}), triton "
            f"3.5.1 (image.lock: {image['triton']}); {left - 4} as locked; not installed: cuda-toolkit") in out, out
    assert "torch          2.11.0+cu130   2.13.0" in out  # still shown beside its pin
    assert kwargs[-1]["lock"] is installed and kwargs[-1]["lock_source"] == "the machine's installed wheels"
    # a package of the bundle that differs is a problem as anywhere
    n, out = doctor(versions=pinned_versions(torch="2.11.0+cu130", transformers="5.22.0"),
                    installed={**installed, "transformers": "5.22.0", "numpy": "1.26.4"}, strict=False, host=host)
    assert n == 2 and f"PROBLEM: numpy 1.26.4 is installed but image.lock locks {image['numpy']}" in out, out
    assert "PROBLEM: transformers 5.22.0 is installed but 5.23.0 is pinned" in out
    # without the marker the same machine's torch is a problem (it differs from the pin)
    n, out = doctor(versions=pinned_versions(torch="2.11.0+cu130"), strict=False)
    assert n == 1 and "PROBLEM: torch 2.11.0+cu130 is installed but 2.13.0 is pinned" in out


def test_a_broken_setup_marker_is_a_problem(tmp_path, monkeypatch):
    (tmp_path / pinfiles.MARKER).write_text('{"lock": 3}')
    monkeypatch.setattr(pinfiles.sys, "prefix", str(tmp_path))
    n, out = doctor(installed=pinfiles.read_lock(pinfiles.CPU_LOCK), strict=False)
    assert n == 1 and f"PROBLEM: {tmp_path / pinfiles.MARKER} is not a setup marker" in out, out
    assert "lock           cpu.lock: the installed versions match" in out
