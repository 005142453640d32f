"""`python -m launch plan`: answers offline from a folder holding only a config.json, prints the JSON the issue asks
for, finds the longest length, exits 0 / 1 / 2; the README "fits on" lines equal the planner's output. The memory
model's terms and its calibration against published runs are in tests/test_memory.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from launch.__main__ import main
from launch.readme_blocks import MODEL_CONFIGS

QWEN3_8B = MODEL_CONFIGS / "Qwen--Qwen3-8B"
LLAMA_8B = MODEL_CONFIGS / "meta-llama--Llama-3.1-8B-Instruct"


@pytest.fixture
def only_config(tmp_path):
    """A folder holding nothing but a model's config.json (what a user downloads with `hf download X config.json`)."""
    def make(source):
        folder = tmp_path / source.name
        folder.mkdir(exist_ok=True)
        shutil.copy(source / "config.json", folder / "config.json")
        return folder

    return make


def plan(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_alst_ulysses_8gpu_json_offline_from_a_config_only_folder(capsys, only_config):
    rc, out, err = plan(capsys, "alst-ulysses-8gpu", "--model", only_config(LLAMA_8B), "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert {"fits", "gpu_peak_gib", "host_peak_gib", "max_length", "per_rank_length", "breakdown"} <= set(data)
    assert data["fits"] is True and data["max_length"] == 3_700_000 and data["per_rank_length"] == 462_500
    assert 0 < data["gpu_peak_gib"] <= 79.1
    assert data["breakdown"]["checkpointed activations (layer inputs)"] == 0.0  # offloaded to the host
    assert data["host_peak_gib"] > 1000  # 8 processes x 32 pinned 4 GiB blocks of layer inputs, and more


def test_ring_cp_8gpu_longest_length_offline(capsys, only_config):
    rc, out, err = plan(capsys, "ring-cp-8gpu", "--model", only_config(QWEN3_8B), "--max-length", "auto")
    assert rc == 0, err
    assert "Longest global max_length that fits:" in out and "(a multiple of 16)" in out
    # one length: the layout above the table is printed at the length found, as the table is
    found = int(re.search(r"fits: ([\d,]+) tokens", out).group(1).replace(",", ""))
    assert f"sequence length          {found} tokens (global)" in out
    assert f"per-rank sequence length {found // 8} tokens" in out and f"per-rank length {found // 8} tokens" in out
    rc, out, _ = plan(capsys, "ring-cp-8gpu", "--model", only_config(QWEN3_8B), "--max-length", "auto", "--json")
    longest = json.loads(out)["max_length"]
    assert longest % 16 == 0 and longest >= 1_048_576  # the recipe's own default fits
    # one multiple of 16 more does not fit
    rc, out, _ = plan(capsys, "ring-cp-8gpu", "--model", only_config(QWEN3_8B), "--max-length", longest + 16, "--json")
    assert rc == 1 and json.loads(out)["fits"] is False


def test_table_names_terms_settings_and_the_verdict(capsys):
    rc, out, _ = plan(capsys, "ring-cp-2gpu", "--model", QWEN3_8B, "--max-length", "400000", "--host-memory", "512")
    assert rc == 1
    for fragment in ("optimizer states", "one layer's recompute + backward", "loss (LM head", "CUDA context",
                     "offloaded checkpoints", "total per node", "budget 512.0 GiB", "Verdict: does NOT fit.",
                     "The largest term is", "to shrink it, change", "not measured"):
        assert fragment in out, fragment


def test_offline_without_the_config_says_which_file_and_how_in_one_line(capsys):
    rc, out, err = plan(capsys, "ring-cp-8gpu")
    assert rc == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line]
    assert "config.json of Qwen/Qwen3-8B" in line and "hf download Qwen/Qwen3-8B config.json" in line


@pytest.mark.parametrize("argv,fragment", [
    (["--gpus", "0"], "must be positive"),
    (["--max-length", "long"], "give a number of tokens or `auto`"),
    (["--sp-size", "-2"], "--sp-size -2"),
])
def test_invalid_input_exits_2(capsys, argv, fragment):
    rc, _out, err = plan(capsys, "ring-cp-8gpu", "--model", QWEN3_8B, *argv)
    assert rc == 2 and fragment in err


def test_target_machine_options_change_the_plan(capsys):
    _, out, _ = plan(capsys, "zero3", "--model", QWEN3_8B, "--json")
    eight = json.loads(out)
    _, out, _ = plan(capsys, "zero3", "--model", QWEN3_8B, "--gpus", "4", "--json")
    four = json.loads(out)
    assert eight["target"]["gpus_per_node"] == 8 and four["target"]["gpus_per_node"] == 4
    # ZeRO-3 shards the model states over the processes: fewer GPUs, more per GPU
    assert four["breakdown"]["optimizer states (Adam + fp32 master)"] == pytest.approx(
        2 * eight["breakdown"]["optimizer states (Adam + fp32 master)"], rel=1e-3)
