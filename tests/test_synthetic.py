"""Synthetic runs (launch/rank/synthetic.py, `synthetic: true` in train.py): the architecture from config.json alone
with the run's config overrides, random rows of exactly max_length tokens made when read, the one-token tokenizer TRL
needs, and one real run of the recipe's train.py on CPU from a folder holding nothing but config.json. The launcher path
(ddp and ZeRO-3 through `python -m launch`) is exercised by tests/test_gpu_check.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.rank import synthetic

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "docs" / "model_configs"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TINY = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 4096, "vocab_size": 256, "tie_word_embeddings": True, "rope_theta": 1000000.0}


def test_the_config_carries_the_runs_overrides_not_its_loading_options():
    """The ring-cp recipes' YaRN reaches the architecture as it would through from_pretrained; loading options
    (dtype, attention kernel, revision) do not become config attributes."""
    yarn = {"rope_type": "yarn", "rope_theta": 1000000, "factor": 2.0, "original_max_position_embeddings": 32768}
    config = synthetic.load_config(str(CONFIGS / "Qwen--Qwen3-8B"),
                                   {"rope_parameters": yarn, "dtype": "bfloat16", "attn_implementation": "sdpa",
                                    "device_map": None})
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 2.0
    assert config.num_hidden_layers == 36 and config.vocab_size == 151936
    assert not hasattr(config, "device_map")


def test_rows_are_exactly_max_length_from_the_vocabulary_and_made_when_read():
    started = time.perf_counter()
    rows = synthetic.token_rows(1_000_000, 4096, 151936, seed=42)  # 4.1e9 tokens if they were stored
    assert time.perf_counter() - started < 5
    assert len(rows) == 1_000_000 and rows.column_names == ["input_ids"]
    first, again, other = rows[7]["input_ids"], rows[7]["input_ids"], rows[8]["input_ids"]
    assert len(first) == 4096 and 0 <= min(first) and max(first) < 151936
    assert list(first) == list(again) and list(first) != list(other)  # row i depends only on (seed, i)
    assert list(synthetic.token_rows(10, 4096, 151936, seed=42)[7]["input_ids"]) == list(first)
    # the rows survive the Trainer's column selection (remove_columns keeps the transform)
    assert len(rows.remove_columns([])[0]["input_ids"]) == 4096


def test_the_null_tokenizer_has_only_the_pad_token():
    from types import SimpleNamespace

    tokenizer = synthetic.null_tokenizer(151643)
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == 151643
    assert tokenizer.get_vocab() == {"<pad>": 151643}
    # its id: the config's pad id, else its (first) eos id, else 0; never outside the vocabulary
    config = lambda **ids: SimpleNamespace(vocab_size=100, **ids)  # noqa: E731
    assert synthetic.pad_id(config(pad_token_id=3, eos_token_id=7)) == 3
    assert synthetic.pad_id(config(pad_token_id=None, eos_token_id=[7, 8])) == 7
    assert synthetic.pad_id(config(pad_token_id=500, eos_token_id=None)) == 0


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """recipes/ddp/train.py, one CPU process, plain python (no launcher): a synthetic run of 3 steps from a folder
    holding only config.json, no dataset that exists, offline."""
    root = tmp_path_factory.mktemp("synthetic")
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    out = root / "out"
    cmd = [sys.executable, "recipes/ddp/train.py", "--config", "recipes/ddp/config.yaml", "--synthetic", "true",
           "--model_name_or_path", str(model), "--dataset_name", "no/such-dataset", "--max_length", "48",
           "--per_device_train_batch_size", "2", "--max_steps", "3", "--logging_steps", "1", "--use_cpu", "true",
           "--bf16", "false", "--dtype", "float32", "--attn_implementation", "sdpa", "--report_to", "none",
           "--use_liger_kernel", "false",  # as the CPU profile: the GPU default's Liger kernels are Triton, GPU only
           "--output_dir", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCH_")}
    proc = subprocess.run(cmd, cwd=REPO, env={**env, **OFFLINE}, capture_output=True, text=True, timeout=300)
    return proc, model, out


@pytest.mark.long
def test_a_synthetic_run_trains_from_config_json_alone(synthetic_run):
    proc, model, out = synthetic_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in model.iterdir()] == ["config.json"]  # nothing was downloaded or written next to it
    state = json.loads((out / "trainer_state.json").read_text())
    logs = [x for x in state["log_history"] if "loss" in x]
    assert len(logs) == 3
    # every row is exactly max_length tokens: 2 rows x 48 tokens per step
    assert [x["num_tokens"] for x in logs] == [96.0, 192.0, 288.0]
    # random weights, uniform random tokens: the first loss is about ln(vocab)
    assert abs(logs[0]["loss"] - math.log(TINY["vocab_size"])) < 0.1, logs[0]
    assert "synthetic: Qwen3ForCausalLM" in proc.stdout + proc.stderr
    assert not (out / "final").exists()  # random weights are not saved


@pytest.mark.parametrize("option", ["synthetic", "bench"])
def test_a_measurement_saves_nothing_unless_asked(option, tmp_path, capsys):
    """A --synthetic or --bench run keeps no checkpoint (transformers saves one at the last step whenever
    save_strategy is steps, as the GPU configs set it) and no final weights; the dry run says so in one line, the
    summary under `saves`. --save-steps asks for both, `-- --save_strategy steps` / `-- --save_final true` for one.
    (The bytes such a run leaves are counted on check.py's runs, tests/test_gpu_check.py.)"""
    from launch.__main__ import main
    from launch.config.options import Options
    from launch.run.resolve import resolve

    def setup(**kw):
        return resolve(Options(recipe="zero3", **{option: True}, **kw), progress=lambda *_: None)

    measured = setup()
    assert measured.training["save_strategy"] == "no" and measured.training["save_final"] is False
    assert measured.saves == "nothing"
    said = {"synthetic": "saves nothing: a --synthetic run keeps no checkpoint (--save-steps N keeps them) and never "
                         "its random weights",
            "bench": "saves nothing: a --bench run keeps no checkpoint and no final weights (--save-steps N keeps "
                     "both)"}
    assert measured.notes[-1] == said[option]
    final = "" if option == "synthetic" else "; the final model in final/"  # train.py never saves random weights
    assert setup(save_steps=50).saves == "checkpoints every 50 steps and at the last step (the last 2 kept)" + final
    assert setup(save_steps=50).notes[-1] == f"saves {setup(save_steps=50).saves} (asked for)"
    assert setup(extra=["--save_strategy", "steps"]).saves.startswith("checkpoints every 500 steps")
    assert setup(extra=["--save_final", "true"]).saves == ("nothing" if option == "synthetic" else
                                                           "the final model in final/")
    # the recipe's own settings where the run measures nothing
    assert resolve(Options(recipe="zero3"), progress=lambda *_: None).saves == (
        "checkpoints every 500 steps and at the last step (the last 2 kept); the final model in final/")
    rc = main(["ddp", "--smoke", "--cpu", f"--{option}", "--dry-run", "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0 and f"[launch] {said[option]}\n" in out, out[-3000:]
    assert "--save_strategy no" in out and "--save_final false" in out
