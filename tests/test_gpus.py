"""The GPU table (`launch.facts.gpus`): `plan --gpu NAME` for every row, names refused with suggestions, `--gpu-memory`
over the GPU's own, the throughput model's rates carried to another GPU (`launch.speed.model.rates_for`), and the
detection of a GPU from torch's device name."""

from __future__ import annotations

import json

import pytest

from launch.__main__ import main
from launch.facts import calibration, gpus
from launch.speed import model as throughput_model


def plan(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("gpu", [g.name for g in gpus.GPUS])
def test_plan_fastest_json_for_every_gpu_of_the_table(capsys, gpu):
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu", gpu.lower(), "--fastest", "--json")
    data = json.loads(out)
    row = gpus.by_name(gpu)
    assert data["gpu"]["name"] == gpu and data["gpu"]["memory_gib"] == row.memory_gib
    assert data["gpu"]["peak_bf16_tflops"] == round(row.peak_bf16 / 1e12, 1)
    assert data["gpu"]["memory_bandwidth_tb_s"] > 0 and data["gpu"]["source"].startswith("https://")
    assert data["target"]["gpu_memory_gib"] == row.memory_gib
    assert rc == (0 if data["fastest"] else 1), err
    for candidate in data["candidates"]:
        assert candidate["predicted_tokens_per_s_per_gpu"] > 0


def test_every_row_has_its_figures():
    for gpu in gpus.GPUS:
        assert 0 < gpu.memory_gib <= gpu.memory_gb and gpu.peak_bf16 > 1e13 and gpu.memory_bytes_per_s > 1e11
        assert gpu.link and gpu.link_bytes_per_s > 0 and gpu.source.startswith("https://")
    for name in ("H100 SXM", "H100 PCIe", "H100 NVL", "H200", "B200", "A100 40GB", "A100 80GB", "L40S", "L4", "A10G",
                 "RTX 4090"):
        assert gpus.by_name(name)


@pytest.mark.parametrize("name, suggested", [("h10", "H100 SXM"), ("a100", "A100 40GB"), ("L40X", "L40S"),
                                             ("rtx4080", "RTX 4090")])
def test_an_unknown_gpu_is_refused_with_suggestions(capsys, name, suggested):
    rc, out, err = plan(capsys, "lora", "--gpu", name, "--fastest")
    assert rc == 2 and out == ""
    assert f"--gpu {name}: not a GPU of the table" in err and "Did you mean" in err and suggested in err


def test_gpu_names_are_case_insensitive():
    assert gpus.lookup("h200").name == "H200"
    assert gpus.lookup("a100-40gb").name == "A100 40GB"
    assert gpus.lookup("RTX_4090").name == "RTX 4090"
    assert gpus.lookup("NVIDIA A100-SXM4-40GB").name == "A100 40GB"


def test_gpu_memory_overrides_the_gpus_own(capsys):
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu", "L4", "--json")
    assert json.loads(out)["target"]["gpu_memory_gib"] == gpus.by_name("L4").memory_gib, err
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu", "L4", "--gpu-memory", "40", "--json")
    data = json.loads(out)
    assert data["target"]["gpu_memory_gib"] == 40 and data["gpu"]["name"] == "L4", err


def test_an_h200_predicts_more_tokens_per_s_than_an_a10g(capsys):
    def fastest(gpu):
        _, out, _ = plan(capsys, "lora", "--gpus", "1", "--gpu", gpu, "--gpu-memory", "24", "--fastest", "--json")
        data = json.loads(out)
        return {json.dumps({k: c[k] for k in ("activation_checkpointing", "per_device_train_batch_size",
                                               "use_liger_kernel", "activation_checkpointing_offload")}):
                c["predicted_tokens_per_s_per_gpu"] for c in data["candidates"]}

    h200, a10g = fastest("H200"), fastest("A10G")
    assert set(h200) == set(a10g)
    assert all(h200[k] > a10g[k] for k in h200)  # the same settings, on the same memory: the GPU alone differs


def test_rates_carry_to_another_gpu_by_the_stated_rule():
    h100, a10g = throughput_model.rates_for(None), throughput_model.rates_for(gpus.by_name("A10G"))
    assert h100 == throughput_model.Rates()  # the calibration GPU: its own measured rates
    assert a10g.matmul == h100.matmul and a10g.attention == h100.attention and a10g.issue_s == h100.issue_s
    assert a10g.bandwidth == pytest.approx(h100.bandwidth * 600e9 / 3.35e12)
    assert a10g.host_link == 32e9  # PCIe Gen4 x16, per direction


def test_a_gpu_with_measured_rates_uses_its_own(monkeypatch):
    own = {"matmul": 0.5, "attention": 0.3, "bandwidth": 1e12, "issue_s": 1e-5}
    monkeypatch.setitem(calibration.MEASURED_RATES, "L4", own)
    rates = throughput_model.rates_for(gpus.by_name("L4"))
    assert (rates.matmul, rates.attention, rates.bandwidth, rates.issue_s) == (0.5, 0.3, 1e12, 1e-5)


@pytest.mark.parametrize("device, name", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA B200", "B200"),
])
def test_the_gpu_is_detected_from_its_device_name(device, name):
    assert gpus.detect(device).name == name
    assert gpus.peak_bf16(device) == gpus.by_name(name).peak_bf16


def test_no_gpu_is_detected_from_a_cpu_or_an_unknown_name():
    assert gpus.detect("cpu") is None and gpus.detect(None) is None and gpus.detect("Tesla K80") is None



def test_a_run_plans_and_ranks_for_the_gpu_it_runs_on(monkeypatch):
    """On a GPU machine the run's own plan (its preflight, --fastest, the bench report's prediction) is for the GPU
    torch names, at that GPU's peak and rates, not the calibration H100's."""
    from launch.config.options import Options
    from launch.facts import hub
    from launch.run import resolve, runner

    setup = resolve.resolve(Options(recipe="lora"), progress=lambda *_: None)
    model = hub.read_model_config("docs/model_configs/Qwen--Qwen3-8B")
    monkeypatch.setattr(runner, "gpu_memory_gib", lambda: 139.8)
    plan_ = runner.memory_plan(setup, model, 1, "NVIDIA H200")
    assert plan_.target.gpu.name == "H200" and plan_.target.gpu_memory_gib == 139.8
    h200 = throughput_model.predict(plan_.arch, plan_.run, gpu=plan_.target.gpu)
    h100 = throughput_model.predict(plan_.arch, plan_.run)
    assert h200.tokens_per_s_per_gpu > h100.tokens_per_s_per_gpu  # HBM3e's bandwidth; the same matmul peak
    assert runner.memory_plan(setup, model, 1, "NVIDIA Some Future GPU").target.gpu is None


def test_a_run_takes_gpu_too(capsys, tmp_path):
    """`python -m launch RECIPE --gpu NAME`: the run's plan (here its dry run, on a machine without that GPU) is for
    that GPU; a name of no row is refused while parsing, with the rows that come close."""
    rc = main(["lora", "--gpu", "h200", "--dry-run", "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and "GPU: H200 (141 GB HBM3e" in out and "GPU(s) of 139.4 GiB" in out
    rc = main(["lora", "--gpu", "h2000", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: argument --gpu: --gpu h2000: not a GPU of the table") and "H200" in err
    assert ".." not in err and len(err.splitlines()) == 1
