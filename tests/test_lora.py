"""recipes/lora on CPU: LoRA trains the same under DDP, ZeRO-3 and gradient accumulation; only the adapter trains; the
final adapter (with PEFT on its base) and the merged model (plain transformers) reproduce the trained model's eval
loss; a run stopped at step 7 and resumed equals the uninterrupted one.

Six smoke runs in all (each ~1 min on 2 loaded cores), shared: the judged 2-process DDP run (the session's
smoke_runs, also the reference of the parity and resume tests), 1 process x accumulation 2, ZeRO-3 and FSDP2 (copies
of the recipe folder naming another Accelerate config), and one folder for the stopped and resumed run, which also
evaluates at its last step and is what the reload, merge and frozen-base tests read.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from helpers.launcher import assert_parity, explain, launch_in_process
from launch.config import smoke
from launch.recipe.copies import sync_script
from launch.results.outdir import ADAPTER_CONFIG, ADAPTER_WEIGHTS, RunFolder
from launch.config.options import Options
from launch.recipe.discovery import RECIPES_DIR
from launch.run.resolve import resolve

EVAL_AT_THE_END = ["--eval_strategy", "steps", "--eval_steps", "12", "--per_device_eval_batch_size", "1"]


def _observed(smoke_runs, recipe, *args) -> dict:
    proc, summary = smoke_runs.run(recipe, *args)
    assert proc.returncode == 0, explain(proc)
    return summary["observed"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """A lora smoke run whose rank 1 dies at the end of step 7 (checkpoints every 3 steps: checkpoint-6 is the newest),
    resumed with --resume to step 12, evaluating on the test split at step 12."""
    out = tmp_path_factory.mktemp("lora-resumed") / "out"
    died = launch_in_process("lora", "--smoke", "--cpu", "--save-steps", "3", "--output-dir", out, fault="1:7:raise")
    assert died.returncode != 0 and "RuntimeError: injected failure" in died.stdout, explain(died)
    assert f"last complete checkpoint: {RunFolder(out).checkpoint(6)}" in died.stdout
    proc = launch_in_process("lora", "--smoke", "--cpu", "--save-steps", "3", "--output-dir", out, "--resume", "--",
                             *EVAL_AT_THE_END)
    assert proc.returncode == 0, explain(proc)
    return out


def _logged_eval_loss(out) -> float:
    return [h["eval_loss"] for h in json.loads(RunFolder(out).trainer_state.read_text())["log_history"]
            if "eval_loss" in h][-1]


def _eval_loss(model, tokenizer, tmp_path) -> float:
    """The smoke test split's loss of `model`, in one process (as tests/test_failures.py's reload check)."""
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    test = load_dataset(str(smoke.data_dir()), split="test")
    args = SFTConfig(output_dir=str(tmp_path / "eval"), use_cpu=True, bf16=False, per_device_eval_batch_size=1,
                     max_length=128, report_to="none", dataset_num_proc=1)
    return SFTTrainer(model=model, args=args, processing_class=tokenizer, train_dataset=test,
                      eval_dataset=test).evaluate()["eval_loss"]


@pytest.mark.slow


@pytest.mark.long
def test_one_process_with_accumulation_equals_two_processes(smoke_runs):
    """2 processes x 4 under DDP (the judged run) = 1 process x 4 x accumulation 2: 8 sequences per step."""
    ddp = _observed(smoke_runs, "lora")
    accumulated = _observed(smoke_runs, "lora", "--num-processes", "1", "--", "--gradient_accumulation_steps", "2")
    # measured (12 steps, torch 2.13.0 CPU): loss 0, grad_norm 0 (the same micro-batches, summed in the same order).
    # TRL's own invariant tests allow loss 1e-3; these are tests/test_parity.py's tolerances for batch layouts.
    assert_parity("lora-ddp-vs-accumulation", [("ddp 2x4x1", ddp), ("1x4x2", accumulated)],
                  {"loss": 1e-5, "grad_norm": 1e-5})


# The sharded layouts the adapter is checked under: (Accelerate config, its overrides). FSDP2 checkpoints through
# transformers (the recipe's `activation_checkpointing: true`), not FSDP's own wrapper: with
# `fsdp_activation_checkpointing: true` the layers' module names gain `._checkpoint_wrapped_module.`, which PEFT
# 0.21.2's adapter state dict (it strips only `_fsdp_wrapped_module.`) does not match against the clean names of
# Accelerate's full state dict, and final/ is saved with no tensor at all (measured). FSDP2 saves with
# SHARDED_STATE_DICT, whose final save transformers leaves to train.py (section sharded-final-save: only the trainable
# tensors gathered, launch/rank/consolidate.py); FULL_STATE_DICT's adapter is qlora-fsdp's (tests/test_qlora.py).
SHARDED = {
    "zero3": ("accelerate_configs/zero3.yaml", {}),
    "fsdp2": ("accelerate_configs/fsdp2.yaml", {"fsdp_config": {"fsdp_activation_checkpointing": False,
                                                                "fsdp_state_dict_type": "SHARDED_STATE_DICT"}}),
}


@pytest.mark.slow


@pytest.mark.long
@pytest.mark.parametrize("strategy", SHARDED)
def test_sharded_layouts_train_and_save_the_same_adapter(strategy, smoke_runs, resumed, tmp_path):
    """2 processes x 4 with the adapter and the frozen base sharded (ZeRO-3, FSDP2) = DDP: the same steps, and the
    adapter gathered from the shards into final/ equals DDP's (the resumed run's, equal to the uninterrupted run)."""
    from safetensors.torch import load_file

    source, overrides = SHARDED[strategy]
    copy = tmp_path / f"lora-{strategy}"
    shutil.copytree(RECIPES_DIR / "lora", copy)
    accelerate = yaml.safe_load((RECIPES_DIR.parent / source).read_text())
    for key, value in overrides.items():
        accelerate[key] = {**accelerate[key], **value}
    (copy / "accelerate.yaml").write_text(yaml.safe_dump(accelerate))
    config = yaml.safe_load((copy / "config.yaml").read_text())
    (copy / "config.yaml").write_text(yaml.safe_dump({**config, "accelerate_config": "accelerate.yaml"}))
    sync_script(copy / "train.py", out=lambda line: None)  # the sections its new Accelerate config turns on
    out = tmp_path / "out"
    proc = launch_in_process(copy, "--smoke", "--cpu", "--output-dir", out)
    assert proc.returncode == 0, explain(proc)
    assert strategy != "fsdp2" or "FSDP2 on CPU: parameters sharded over 2 process(es)" in proc.stdout
    # measured (12 steps): ZeRO-3 loss 0, grad_norm 3.9e-7; FSDP2 loss 0, grad_norm 6e-8. Tolerances: those of
    # tests/test_parity.py for ZeRO against DDP.
    assert_parity(f"lora-ddp-vs-{strategy}", [("ddp", _observed(smoke_runs, "lora")),
                                             (strategy, json.loads(RunFolder(out).summary.read_text())["observed"])],
                  {"loss": 1e-5, "grad_norm": 1e-4})
    gathered = load_file(RunFolder(out).final / ADAPTER_WEIGHTS)
    ddp = load_file(RunFolder(resumed).final / ADAPTER_WEIGHTS)
    assert set(gathered) == set(ddp)
    # measured: ZeRO-3 4.8e-6 (its fp32 Adam step over the flat partition rounds differently), FSDP2 0
    assert max((gathered[k] - ddp[k]).abs().max().item() for k in ddp) < 5e-5


@pytest.mark.slow


@pytest.mark.long
def test_resume_after_a_dying_rank_equals_the_uninterrupted_run(resumed, smoke_runs):
    whole = _observed(smoke_runs, "lora")
    observed = json.loads(RunFolder(resumed).summary.read_text())["observed"]
    assert observed["step"] == list(range(1, 13))
    # measured: identical (0 difference in loss and grad_norm over the 12 steps)
    assert observed["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert observed["grad_norm"] == pytest.approx(whole["grad_norm"], abs=1e-6)


@pytest.mark.slow


@pytest.mark.long
def test_final_holds_the_adapter_and_only_the_adapter_trains(resumed):
    """final/ holds PEFT's files and the tokenizer, no model weights; the adapter holds lora_A/lora_B of every linear
    layer but the output layer, and the newest checkpoint's optimizer state covers exactly those tensors (the base had
    none: it was frozen)."""
    import torch
    from safetensors.torch import load_file

    final = RunFolder(resumed).final
    names = {p.name for p in final.iterdir()}
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "tokenizer.json"} <= names
    assert not names & {"model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"}
    adapter = load_file(final / ADAPTER_WEIGHTS)
    layers = smoke.SMOKE_SPEC["model"]["num_hidden_layers"]
    linear = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert len(adapter) == layers * len(linear) * 2
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in adapter} == set(linear)
    # fp32, as launch.config.precision reads the run (PEFT's autocast_adapter_dtype; the memory model counts 4 bytes)
    precision = resolve(Options(recipe="lora", smoke=True, cpu=True)).precision
    assert {t.dtype for t in adapter.values()} == {getattr(torch, precision.trainable_dtype)} == {torch.float32}
    newest = RunFolder(resumed).checkpoints()[-1]  # checkpoint-12 (save_total_limit 2 rotated checkpoint-6 away)
    assert (newest / ADAPTER_WEIGHTS).is_file() and not (newest / "model.safetensors").exists()
    optimizer = torch.load(newest / "optimizer.pt", weights_only=False)
    assert len(optimizer["state"]) == len(adapter)


@pytest.mark.slow


@pytest.mark.long
def test_the_adapter_on_its_base_reproduces_the_eval_loss(resumed, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = RunFolder(resumed).final
    base = AutoModelForCausalLM.from_pretrained(smoke.model_dir(), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, final)
    # measured: equal (0 difference; fp32, the distributed run averages the same per-example losses)
    assert _eval_loss(model, AutoTokenizer.from_pretrained(final), tmp_path) == pytest.approx(
        _logged_eval_loss(resumed), abs=1e-5)


@pytest.mark.slow


@pytest.mark.long
def test_merged_model_loads_in_plain_transformers_and_differs_from_the_base_by_the_adapter(resumed, tmp_path):
    """`python -m launch merge RUN_DIR`: RUN_DIR/merged loads without PEFT and gives the trained model's eval loss; its
    weights are the base's (the smoke model folder, untouched by training) exactly where LoRA was not applied, and
    base + alpha / r x B @ A where it was."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    proc = launch_in_process("merge", resumed)
    assert proc.returncode == 0, explain(proc)
    merged_dir = RunFolder(resumed).merged
    assert not (merged_dir / ADAPTER_CONFIG).exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    # measured: 2.4e-7 (the merged weights round W + scale x B @ A once in fp32)
    assert _eval_loss(merged, AutoTokenizer.from_pretrained(merged_dir), tmp_path) == pytest.approx(
        _logged_eval_loss(resumed), abs=1e-5)

    base = load_file(smoke.model_dir() / "model.safetensors")
    adapter = load_file(RunFolder(resumed).final / ADAPTER_WEIGHTS)
    config = json.loads((RunFolder(resumed).final / ADAPTER_CONFIG).read_text())
    scale = config["lora_alpha"] / config["r"]
    state = merged.state_dict()
    assert set(state) == set(base)
    changed = 0
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        a = adapter.get(f"base_model.model.{module}.lora_A.weight")
        expected = weight if a is None else weight + scale * adapter[f"base_model.model.{module}.lora_B.weight"] @ a
        changed += a is not None
        # measured: bitwise equal (PEFT's merge computes the same fp32 sum)
        assert torch.allclose(state[name], expected, atol=1e-6, rtol=0), name
    assert changed == len(adapter) // 2
    # a second merge into the same folder is refused; --overwrite of the run deletes it with the run (manifest entry)
    again = launch_in_process("merge", resumed)
    assert again.returncode == 2 and "already exists and is not an empty folder" in again.stderr
    assert "merged" in json.loads(RunFolder(resumed).manifest.read_text())["entries"]


# ---- merge refusals (fast: nothing is loaded) -----------------------------------------------------------------------
def _finished_run(tmp_path, adapter: dict | None):
    """A run folder as the launcher leaves it, with the identity it records and, for an adapter, PEFT's config."""
    from launch.results import outdir

    out = tmp_path / "run"
    claim = outdir.claim(outdir.check(out, resume=False, overwrite=False), command="earlier run",
                         run={"recipe": "lora", "adapter": adapter})
    RunFolder(out).final.mkdir()
    if adapter:
        (RunFolder(out).final / ADAPTER_CONFIG).write_text("{}")
    outdir.release(claim)
    return out


@pytest.mark.parametrize("adapter,fragment", [
    (None, "This run trained the whole model"),
    ({"method": "qlora", "quantization": {"bits": 4}}, "trained on a 4-bit base (qlora)"),
])
def test_merge_refuses_a_full_fine_tune_and_a_quantized_base_before_loading_anything(adapter, fragment, tmp_path):
    out = _finished_run(tmp_path, adapter)
    proc = launch_in_process("merge", out)
    assert proc.returncode == 2 and fragment in proc.stderr and "Traceback" not in proc.stderr, explain(proc)
    assert not RunFolder(out).merged.exists()


def test_merge_refuses_a_folder_without_final(tmp_path):
    proc = launch_in_process("merge", tmp_path)
    assert proc.returncode == 2 and f"{RunFolder(tmp_path).final} does not exist" in proc.stderr, explain(proc)
