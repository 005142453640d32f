"""`python -m launch plan`: answers offline from a folder holding only a config.json, prints the JSON the issue asks
for, finds the longest length, exits 0 / 1 / 2; the README "fits on" lines equal the planner's output. The memory
model's terms and its calibration against published runs are in tests/test_memory.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from launch.__main__ import main
from launch.catalog.blocks import MODEL_CONFIGS

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
    rc, out, _ = plan(capsys, "ring-cp-2gpu", "--model", QWEN3_8B, "--max-length", "400000", "--host-memory", "512",
                      "--", "--activation_checkpointing_kwargs", '{"offload": true}')
    assert rc == 1
    for fragment in ("optimizer states", "one layer's recompute + backward", "loss (LM head", "CUDA context",
                     "offloaded checkpoints", "total per node", "budget 512.0 GiB", "Verdict: does NOT fit.",
                     "The largest term is", "to shrink it, change", "not measured"):
        assert fragment in out, fragment


def test_offline_without_the_config_says_which_file_and_how_in_one_line(capsys):
    rc, out, err = plan(capsys, "ring-cp-8gpu", "--model", "Qwen/Qwen3-32B")  # no copy in docs/model_configs
    assert rc == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line]
    assert "config.json of Qwen/Qwen3-32B" in line and "hf download Qwen/Qwen3-32B config.json" in line


def test_offline_fresh_clone_plans_from_the_shipped_model_config(capsys):
    """The README's first planner command, offline with an empty hub cache: the recipe's model config is the copy
    docs/model_configs/ ships (it used to fail like the test above)."""
    from launch.facts import hub

    hub.read_model_config.cache_clear()
    model = hub.read_model_config("Qwen/Qwen3-8B")
    assert model.source == "shipped copy (docs/model_configs)" and model.config.num_hidden_layers == 36
    rc, out, err = plan(capsys, "ring-cp-8gpu")
    assert rc in (0, 1) and "Traceback" not in err and "Memory per GPU" in out


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


def test_lora_fits_one_24_gib_gpu_where_the_full_fine_tune_of_the_same_model_does_not(capsys, only_config):
    """The planner knows adapters (a frozen bf16 base, gradients and Adam on the adapter only), so the LoRA
    recipe's Qwen3-8B fits one 24 GiB GPU while zero3's full fine-tune of the same model does not."""
    model = only_config(QWEN3_8B)
    # with activation checkpointing, as on a 24 GB GPU (the recipe's 80 GB default does without: `--fastest` says so)
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "24", "--model", model, "--",
                        "--activation_checkpointing", "true", "--per_device_train_batch_size", "2")
    assert rc == 0, err
    for fragment in ("frozen base parameters (no gradients)", "adapter parameters (LoRA A, B)", "Verdict: fits."):
        assert fragment in out, fragment
    rc, out, err = plan(capsys, "zero3", "--gpus", "1", "--gpu-memory", "24", "--model", model)
    assert rc == 1 and "Verdict: does NOT fit." in out, err


def test_fsdp2_plan_prints_its_sharded_terms(capsys, only_config):
    rc, out, err = plan(capsys, "fsdp2", "--model", only_config(QWEN3_8B))
    assert rc in (0, 1), err
    for fragment in ("FSDP2 sharding (dp_shard x cp)", "gathered parameters", "optimizer states (Adam)", "Verdict:"):
        assert fragment in out, fragment


def test_qlora_fsdp_plan_prints_the_four_bit_base_and_fits_two_gpus(capsys, only_config):
    rc, out, err = plan(capsys, "qlora-fsdp", "--model", only_config(MODEL_CONFIGS / "Qwen--Qwen2.5-72B-Instruct"))
    assert rc == 0, err
    for fragment in ("frozen base parameters (no gradients)", "4-bit nf4 base", "adapter parameters (LoRA A, B)",
                     "FSDP1 sharding (dp_shard x cp)", "model loading, per node (1 whole copy; transient)",
                     "Verdict: fits."):
        assert fragment in out, fragment


def test_offline_dry_run_says_the_rules_and_the_memory_table_it_skipped(capsys):
    """A model whose config.json is neither cached nor shipped: the dry run's summary line names the rules it could
    not check and that the memory table was skipped."""
    main(["ddp", "--dry-run", "--", "--model_name_or_path", "Qwen/Qwen3-32B"])  # exit status: other problems too
    out = capsys.readouterr()
    text = out.out + out.err
    [line] = [line for line in text.splitlines() if "not read" in line and "not checked" in line]
    assert "the memory table (and the fit check) skipped" in line, line
