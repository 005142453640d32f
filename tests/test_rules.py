"""Every validity rule shows its message, and bad input stops before any process starts."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers.launcher import TESTED_RULES, explain, launch_cli, launch_in_process, shows
from helpers.rule_checks import PINNED, facts, make_recipe, messages
from launch.checks import rules
from launch.facts import hub
from launch.recipe.copies import sync_script
from launch.errors import LaunchError
from launch.memory.plan import Target, plan_memory
from launch.catalog.blocks import MODEL_CONFIGS
from launch.recipe.discovery import find_recipe
from launch.config.options import Options
from launch.run.resolve import resolve

def test_real_recipes_pass_every_rule_on_a_machine_with_8_gpus():
    for name in ("ddp", "zero1", "zero2", "zero3"):
        assert messages(resolve(Options(recipe=name))) == [], name


def test_unknown_recipe_suggests_the_nearest():
    with pytest.raises(LaunchError, match=r"Unknown recipe `zero4`\. Did you mean zero\d, zero\d, zero\d\?"):
        find_recipe("zero4")


def test_malformed_yaml_names_file_and_line(tmp_path):
    folder = make_recipe(tmp_path)
    text = (folder / "config.yaml").read_text().splitlines()
    text.insert(2, "learning_rate: [1e-5")  # an unclosed flow sequence on line 3
    (folder / "config.yaml").write_text("\n".join(text) + "\n")
    with pytest.raises(LaunchError, match=r"config\.yaml:\d+:\d+: malformed YAML"):
        find_recipe(str(folder))


def test_unknown_config_key_suggests_the_field(tmp_path):
    """Unknown keys are found by the recipe's own TrlParser (launch.config.training_args), before any rule runs."""
    with pytest.raises(LaunchError) as e:
        resolve(Options(recipe=str(make_recipe(tmp_path, config={"learning_rat": 1e-5}))))
    msg = str(e.value)
    assert "`learning_rat`" in msg and "did you mean learning_rate" in msg


def test_unknown_command_line_training_argument(tmp_path):
    with pytest.raises(LaunchError) as e:
        resolve(Options(recipe="ddp", extra=["--max_stepz", "3"]))
    assert "`max_stepz` in the training arguments after `--`" in str(e.value)


@shows(rules.config_keys_required)
def test_missing_required_keys(tmp_path):
    folder = make_recipe(tmp_path, config={"model_name_or_path": None, "dataset_name": None})
    setup = resolve(Options(recipe=str(folder)))
    [msg] = messages(setup)
    assert "missing required key(s): model_name_or_path, dataset_name" in msg


@shows(rules.processes_fit_layout)
def test_process_count_the_layout_cannot_use(tmp_path):
    folder = make_recipe(tmp_path, accelerate={"parallelism_config": {
        "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 2,
        "parallelism_config_sp_size": 2, "parallelism_config_sp_backend": "deepspeed"}})
    setup = resolve(Options(recipe=str(folder), num_processes=6))
    msg = rules.processes_fit_layout(setup, facts())
    assert "(dp_replicate=1 x dp_shard=2 x tp=1 x cp=1 x sp=2 = 4) does not use 6 processes" in msg
    assert rules.processes_fit_layout(resolve(Options(recipe=str(folder), num_processes=4)), facts()) is None


@shows(rules.processes_fit_layout)
def test_processes_must_spread_evenly_over_machines(tmp_path):
    folder = make_recipe(tmp_path, accelerate={"num_machines": 3})
    msg = rules.processes_fit_layout(resolve(Options(recipe=str(folder))), facts())
    assert "8 processes cannot be spread evenly over 3 machines" in msg


@shows(rules.enough_gpus)
def test_more_gpus_asked_than_present():
    setup = resolve(Options(recipe="zero3"))
    [msg] = messages(setup, facts(gpu_count=2))
    assert "asks for 8 GPU(s) on this machine but 2 GPU(s) are visible" in msg
    [msg] = messages(setup, facts(gpu_count=0))
    assert "no GPU is visible" in msg and "--smoke --cpu" in msg
    assert messages(resolve(Options(recipe="zero3", cpu=True)), facts(gpu_count=0)) == []


@shows(rules.version_floors)
def test_versions_below_a_features_floor():
    setup = resolve(Options(recipe="zero3"))
    [msg] = messages(setup, facts(versions={**PINNED, "deepspeed": "0.14.0"}))
    assert "deepspeed needs deepspeed>=0.15.0, found 0.14.0" in msg
    [msg] = messages(setup, facts(versions={**PINNED, "transformers": "5.1.0"}))
    assert "transformers 5.1.0 is broken with DeepSpeed" in msg
    [msg] = messages(setup, facts(versions={**PINNED, "deepspeed": None}))
    assert "which is not installed" in msg


def test_floors_cover_the_parallelism_features():
    problems = rules.floor_problems(["sequence_parallel", "context_parallel", "fsdp2"],
                                    {"accelerate": "1.10.0", "deepspeed": "0.18.1", "transformers": "4.57.0",
                                     "torch": "2.5.1"})
    assert "sequence parallel needs accelerate>=1.12.0, found 1.10.0" in problems
    assert "sequence parallel needs deepspeed>=0.18.2, found 0.18.1" in problems
    assert "sequence parallel needs transformers>=5.0.0, found 4.57.0" in problems
    assert "context parallel needs accelerate>=1.11.0, found 1.10.0" in problems
    assert "fsdp2 needs torch>=2.6.0, found 2.5.1" in problems


@shows(rules.precision_fits_device)
def test_fp16_on_cpu_is_refused_and_bf16_is_allowed():
    setup = resolve(Options(recipe="ddp", smoke=True, cpu=True, extra=["--fp16", "true", "--bf16", "false"]))
    [msg] = messages(setup)
    assert "fp16 mixed precision was asked for a CPU run" in msg and "`-- --bf16 true`" in msg
    # bf16 on CPU: torch's CPU autocast, the recipe's own load dtype (ddp: fp32 masters), the smoke model's bf16 copy
    setup = resolve(Options(recipe="ddp", smoke=True, cpu=True, extra=["--bf16", "true"]))
    assert messages(setup) == []
    assert setup.training["bf16"] is True and setup.training["dtype"] == "float32"
    assert setup.training["model_name_or_path"].endswith("model-bf16")
    assert setup.accelerate["mixed_precision"] == "bf16"
    assert (setup.precision.mixed, setup.precision.trainable_dtype) == ("bf16", "float32")
    # the default CPU profile stays fp32: the recorded smoke metrics are fp32
    setup = resolve(Options(recipe="ddp", smoke=True, cpu=True))
    assert (setup.training["bf16"], setup.training["dtype"], setup.precision.mixed) == (False, "float32", "no")
    assert not setup.training["model_name_or_path"].endswith("model-bf16")


@shows(rules.pure_16bit_update_rounds_away)
def test_pure_bf16_where_updates_round_away_is_refused(tmp_path):
    # the ddp recipe as it was before its fp32 masters: the model loaded in bf16 under DDP, `bf16: true` only autocasts
    old = make_recipe(tmp_path, base="ddp", config={"dtype": "bfloat16"})
    [msg] = messages(resolve(Options(recipe=str(old))))
    assert msg.startswith("This run trains pure bfloat16: `dtype: bfloat16` (")
    assert "at learning_rate 2e-05 every update of the weights near 1.0 (the RMSNorm scales) is lost" in msg
    assert "half a step there is 0.0039" in msg and "`dtype: float32` in config.yaml" in msg
    assert msg.endswith("To train pure bfloat16 on purpose, pass --pure-bf16.")
    # the opt-in; a learning rate whose updates do not round away at 1.0 (>= 2^-8); the recipe as shipped (fp32)
    assert messages(resolve(Options(recipe=str(old), pure_bf16=True))) == []
    assert messages(resolve(Options(recipe=str(old), extra=["--learning_rate", "0.004"]))) == []
    assert messages(resolve(Options(recipe="ddp"))) == []
    # the strategies that keep fp32 masters of a bf16 load are not concerned
    for name in ("zero1", "zero3", "fsdp2"):
        assert not resolve(Options(recipe=name)).precision.pure_16bit, name
    # fp16 has 3 more significand bits: half a step at 1.0 is 2^-11
    fp16 = make_recipe(tmp_path, base="ddp", config={"dtype": "float16", "bf16": False, "fp16": True}, name="fp16")
    [msg] = messages(resolve(Options(recipe=str(fp16))))
    assert "pure float16" in msg and "half a step there is 0.00049" in msg
    assert messages(resolve(Options(recipe=str(fp16), extra=["--learning_rate", "0.0005"]))) == []


def test_pure_bf16_adapters_are_checked_at_their_own_size(tmp_path):
    """A QLoRA adapter under DDP stays bf16 (TRL's cast): its lora_A weights, ~1/(2 sqrt(hidden)) in size, round
    an update away only at a learning rate far below any LoRA one."""
    qlora = make_recipe(tmp_path, base="lora", config={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"})
    setup = resolve(Options(recipe=str(qlora)))
    assert setup.precision.pure_16bit and setup.precision.adapter
    hidden = facts({"hidden_size": 4096, "model_type": "qwen3"})
    assert messages(setup, hidden) == []  # lr 2e-4 > half a bf16 step at 1/128 = 2^-7 (2^-15 = 3.1e-5)
    [msg] = messages(resolve(Options(recipe=str(qlora), extra=["--learning_rate", "1e-5"])), hidden)
    assert "of the LoRA A weights at their typical size (0.0078 at initialisation)" in msg
    assert "half a step there is 3.1e-05" in msg and msg.endswith("pass --pure-bf16.")


@shows(rules.checkpointing_not_twice)
def test_fsdp_activation_checkpointing_and_gradient_checkpointing(tmp_path):
    folder = make_recipe(tmp_path, base="ddp", config={"activation_checkpointing": True}, accelerate={
        "distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_activation_checkpointing": True}})
    sync_script(folder / "train.py", out=lambda line: None)  # an FSDP recipe's script holds sharded-final-save
    [msg] = messages(resolve(Options(recipe=str(folder))))
    assert "cannot both be on" in msg and "`-- --activation_checkpointing false`" in msg
    # the advice works, and so does the deprecated name when the config does not set the current one
    assert messages(resolve(Options(recipe=str(folder), extra=["--activation_checkpointing", "false"]))) == []
    unset = make_recipe(tmp_path / "unset", base="ddp", config={"activation_checkpointing": None}, accelerate={
        "distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_activation_checkpointing": True}})
    sync_script(unset / "train.py", out=lambda line: None)
    assert any("cannot both be on" in m for m in messages(resolve(Options(recipe=str(unset)))))  # TRL's default: on
    assert messages(resolve(Options(recipe=str(unset), extra=["--gradient_checkpointing", "false"]))) == []
    # through the deprecated name in config.yaml, the conflict is refused as well
    folder2 = make_recipe(tmp_path / "two", base="ring-cp-2gpu", config={"activation_checkpointing": None,
                                                                          "gradient_checkpointing": True},
                          accelerate={"fsdp_config": {"fsdp_version": 2, "fsdp_activation_checkpointing": True}})
    assert any("cannot both be on" in m for m in messages(resolve(Options(recipe=str(folder2)))))


@shows(rules.checkpointing_one_name)
def test_the_deprecated_checkpointing_name_is_refused_where_transformers_would_ignore_it(tmp_path):
    # every shipped recipe sets activation_checkpointing; transformers would ignore --gradient_checkpointing false
    for recipe in ("ring-cp-2gpu", "zero3"):
        [msg] = messages(resolve(Options(recipe=recipe, smoke=True, cpu=True,
                                         extra=["--gradient_checkpointing", "false"])))
        assert "`gradient_checkpointing` is given as False" in msg and "`-- --activation_checkpointing false`" in msg
    # the current name works, also where the recipe checkpoints only its first k layers (ring-cp-2gpu's
    # checkpointing_layers, and the smoke profile's): turning checkpointing off makes k moot, not wrong
    assert messages(resolve(Options(recipe="ring-cp-2gpu", smoke=True, cpu=True,
                                    extra=["--activation_checkpointing", "false"]))) == []
    assert messages(resolve(Options(recipe="ring-cp-2gpu", extra=["--activation_checkpointing", "false"]))) == []
    # k given with checkpointing off at the same place is refused: it would do nothing
    [msg] = messages(resolve(Options(recipe="ring-cp-2gpu", smoke=True, cpu=True, extra=[
        "--activation_checkpointing", "false", "--checkpointing_layers", "1"])))
    assert "this run checkpoints none" in msg
    assert resolve(Options(recipe="zero3", smoke=True, cpu=True,
                           extra=["--activation_checkpointing", "false"])).checkpointing.enabled is False
    # the old name in a (forked) config.yaml under the new one on the command line is fine: the new one wins
    old = make_recipe(tmp_path, config={"activation_checkpointing": None, "gradient_checkpointing": True})
    setup = resolve(Options(recipe=str(old), smoke=True, cpu=True, extra=["--activation_checkpointing", "false"]))
    assert messages(setup) == [] and setup.checkpointing.enabled is False


def test_shipped_recipes_name_checkpointing_as_transformers_does_now():
    """transformers 5.23 warns (FutureWarning, in every rank) when a run reaches it through the deprecated
    `gradient_checkpointing*`; the shipped configs use `activation_checkpointing*`, so a first run prints no such
    warning."""
    from launch.recipe.discovery import recipe_names

    for name in recipe_names():
        config = yaml.safe_load(find_recipe(name).config_path.read_text())
        assert "activation_checkpointing" in config, name
        assert not {"gradient_checkpointing", "gradient_checkpointing_kwargs"} & set(config), name


def test_every_rule_has_a_test_showing_its_message():
    import importlib

    for module in ("test_bad_input",):  # other files whose tests show rule messages (when run alone, import them)
        importlib.import_module(module)
    assert {r.name for r in rules.RULES} <= TESTED_RULES


def test_bad_input_fails_before_any_process_starts(tmp_path):
    """Refused before the launch step: the runner prints the `accelerate launch` command just before it spawns it, so
    its absence (not a wall-time bound, which would include start-up and machine load) shows nothing was started."""
    proc = launch_cli("zero4", "--smoke", "--cpu")
    assert proc.returncode == 2, explain(proc)
    assert "error: Unknown recipe `zero4`. Did you mean" in proc.stderr
    proc = launch_cli("zero3", "--smoke", "--cpu", "--output-dir", tmp_path / "out", "--", "--learning_rat", "1")
    assert proc.returncode == 2, explain(proc)
    assert "Unknown training argument(s)" in proc.stderr
    assert not (tmp_path / "out").exists(), "nothing may be started or written before validation passes"
    assert "accelerate launch" not in proc.stdout + proc.stderr, "the launch step was reached"


def test_dry_run_prints_command_and_effective_setup():
    proc = launch_in_process("zero3", "--smoke", "--cpu", "--num-processes", "4", "--dry-run", "--",
                      "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "3")
    assert proc.returncode == 0, explain(proc)
    out = proc.stdout
    assert "DeepSpeed ZeRO-3" in out
    assert "world size               4 process(es)" in out
    assert "data-parallel size       4" in out
    assert "effective global batch   24 sequences" in out  # 2 x 4 x 3
    assert "tokens per step          at most 3072" in out  # 24 x 128
    assert "accelerate launch" in out and "--num_processes 4" in out and "recipes/zero3/train.py" in out


# ---- sequence parallelism (ALST/Ulysses) ------------------------------------------------------------------------
QWEN2_05B = {"num_attention_heads": 14, "num_key_value_heads": 2}  # the alst-ulysses-4gpu GPU default


def sp_setup(**kw):
    return resolve(Options(recipe="alst-ulysses-4gpu", **kw))


def test_sp_recipes_pass_every_rule_on_a_machine_with_8_gpus():
    assert messages(sp_setup(), facts(model_config=QWEN2_05B)) == []
    assert messages(resolve(Options(recipe="alst-ulysses-8gpu")),
                    facts(model_config={"num_attention_heads": 32, "num_key_value_heads": 8})) == []


@shows(rules.processes_fit_layout)
def test_sp_world_size_is_checked_although_accelerate_skips_it():
    [msg] = messages(sp_setup(num_processes=8), facts(model_config=QWEN2_05B))
    assert "x sp=2 = 4) does not use 8 processes" in msg


@shows(rules.sp_heads_divisible)
def test_sp_query_heads_must_divide():
    [msg] = messages(sp_setup(num_processes=4, mesh={"sp": 4, "dp_shard": 1}, extra=["--pad_to_multiple_of", "4"]),
                     facts(model_config=QWEN2_05B))
    assert "its 14 query heads are not divisible by sp_size=4" in msg


@shows(rules.sp_heads_divisible)
def test_sp_kv_heads_must_divide_or_be_divided():
    cfg = {"num_attention_heads": 12, "num_key_value_heads": 4}
    [msg] = messages(sp_setup(num_processes=6, mesh={"sp": 6, "dp_shard": 1}, extra=["--pad_to_multiple_of", "6"]),
                     facts(model_config=cfg))
    assert "its 4 KV heads neither divide sp_size=6 nor are divisible by it" in msg
    # KV heads fewer than sp but dividing it are replicated: fine
    ok = {"num_attention_heads": 8, "num_key_value_heads": 2}
    assert messages(sp_setup(num_processes=4, mesh={"sp": 4, "dp_shard": 1}, extra=["--pad_to_multiple_of", "4"]),
                    facts(model_config=ok)) == []


@shows(rules.sp_sequence_divisible)
def test_sp_sequence_length_divisible():
    [msg] = messages(sp_setup(extra=["--pad_to_multiple_of", "3"]), facts(model_config=QWEN2_05B))
    assert "set pad_to_multiple_of to a multiple of 2 (it is 3)" in msg


@shows(rules.sp_sequence_divisible)
def test_sp_on_cpu_needs_equal_lengths():
    [msg] = messages(sp_setup(smoke=True, cpu=True, num_processes=4, extra=["--pad_to_multiple_of", "2"]))
    assert "gloo all-gathers only equal shapes" in msg and "set pad_to_multiple_of equal to max_length (128)" in msg


def test_sp_on_cpu_synthetic_rows_are_equal_lengths_already():
    """Synthetic rows are exactly max_length tokens (launch.rank.synthetic): `alst-ulysses-4gpu --synthetic --cpu`
    is not refused by the equal-shapes rule."""
    setup = sp_setup(synthetic=True, cpu=True)
    assert not [m for m in messages(setup, facts(model_config=QWEN2_05B)) if "gloo all-gathers" in m]


@shows(rules.sp_attention_supported)
def test_sp_refuses_eager_attention():
    [msg] = messages(sp_setup(extra=["--attn_implementation", "eager"]), facts(model_config=QWEN2_05B))
    assert "Eager and flex attention are refused" in msg


@shows(rules.sp_attention_supported)
def test_sp_attention_must_match_the_models():
    # the recipe's config says sdpa on both sides; the model's alone changed to flash_attention_2 is refused
    [msg] = messages(sp_setup(extra=["--attn_implementation", "flash_attention_2"]), facts(model_config=QWEN2_05B))
    assert "attn_implementation (flash_attention_2) and parallelism_config_sp_attn_implementation (sdpa)" in msg
    # on CPU the launcher switches both sides to SDPA
    assert sp_setup(smoke=True, cpu=True).accelerate["parallelism_config"][
        "parallelism_config_sp_attn_implementation"] == "sdpa"


@shows(rules.sp_packing_safe)
def test_sp_packing_strategy():
    [msg] = messages(sp_setup(extra=["--packing_strategy", "bfd"]), facts(model_config=QWEN2_05B))
    assert "use `packing_strategy: wrapped`" in msg and "documents that share a row attend to each other" in msg


@shows(rules.sp_zero_stage)
def test_sp_needs_zero_stage_1_to_3(tmp_path):
    acc = yaml.safe_load(find_recipe("alst-ulysses-4gpu").accelerate_config_path.read_text())
    acc["deepspeed_config"]["zero_stage"] = 0
    folder = make_recipe(tmp_path, base="alst-ulysses-4gpu", accelerate=acc)
    [msg] = messages(resolve(Options(recipe=str(folder))), facts(model_config=QWEN2_05B))
    assert "ZeRO stage 1, 2 or 3 (stage 0 crashes" in msg


@shows(rules.tiled_mlp_needs_deepspeed)
def test_tiled_mlp_needs_deepspeed(tmp_path):
    from launch.recipe import copies

    folder = make_recipe(tmp_path, base="ddp", config={"tiled_mlp": True})
    copies.sync_script(folder / "train.py", out=lambda *_: None)  # its copy now holds the tiled-MLP section
    [msg] = messages(resolve(Options(recipe=str(folder))))
    assert "`tiled_mlp` needs DeepSpeed" in msg


# ---- ring-attention context parallelism --------------------------------------------------------------------------
QWEN3_8B = {"num_attention_heads": 32, "num_key_value_heads": 8, "use_sliding_window": False,
            "layer_types": ["full_attention"] * 36}


def cp_setup(recipe="ring-cp-2gpu", **kw):
    return resolve(Options(recipe=recipe, **kw))


def test_cp_recipes_pass_every_rule():
    for name in ("ring-cp-2gpu", "ring-cp-4gpu", "ring-cp-8gpu"):
        assert messages(cp_setup(name), facts(model_config=QWEN3_8B)) == [], name


def test_ring_cp_8gpu_dry_run_shows_its_8_way_mesh_and_per_rank_length():
    proc = launch_in_process("ring-cp-8gpu", "--dry-run")
    # no GPU here: the plan is valid (exit 0), and the output says clearly that this machine could not run it
    assert proc.returncode == 0, explain(proc)
    assert "this machine could not run it" in proc.stdout and "asks for 8 GPU(s)" in proc.stdout
    assert "x cp=8 x sp=1" in proc.stdout and "data-parallel size       1" in proc.stdout
    assert "per-rank sequence length 131072 tokens" in proc.stdout  # 1,048,576 / 8
    assert "sequence length          1048576 tokens (global)" in proc.stdout
    assert "positions                1,048,576 covered by the run's yarn RoPE scaling (x32 over 32,768 positions)" \
        in proc.stdout


@shows(rules.processes_fit_layout)
def test_cp_process_count():
    [msg] = messages(cp_setup(num_processes=3), facts(model_config=QWEN3_8B))
    assert "x cp=2 x sp=1 = 2) does not use 3 processes" in msg


@shows(rules.cp_sequence_divisible)
def test_cp_sequence_divisible_by_twice_cp():
    [msg] = messages(cp_setup("ring-cp-4gpu", extra=["--pad_to_multiple_of", "4"]), facts(model_config=QWEN3_8B))
    assert "divisible by 2 x cp_size = 8" in msg and "(it is 4)" in msg


@shows(rules.cp_attention_sdpa)
def test_cp_sdpa_only():
    [msg] = messages(cp_setup(extra=["--attn_implementation", "flash_attention_2"]), facts(model_config=QWEN3_8B))
    assert "supports SDPA attention only, not flash_attention_2" in msg


@shows(rules.cp_causal_only)
def test_cp_refuses_sliding_window_models():
    cfg = {**QWEN3_8B, "layer_types": ["sliding_attention", "full_attention"]}
    [msg] = messages(cp_setup(), facts(model_config=cfg))
    assert "uses sliding-window attention" in msg


@shows(rules.cp_no_packing)
def test_cp_refuses_packing():
    [msg] = messages(cp_setup(extra=["--packing", "true"]), facts(model_config=QWEN3_8B))
    assert "Packing is not compatible with context parallelism" in msg


@shows(rules.cp_needs_fsdp2)
def test_cp_needs_fsdp2_and_excludes_sp(tmp_path):
    acc = yaml.safe_load(find_recipe("ring-cp-2gpu").accelerate_config_path.read_text())
    acc["fsdp_config"]["fsdp_version"] = 1
    folder = make_recipe(tmp_path, base="ring-cp-2gpu", accelerate=acc)
    msgs = messages(resolve(Options(recipe=str(folder))), facts(model_config=QWEN3_8B))
    assert any("runs on FSDP2 only" in m for m in msgs)
    # CP and SP together: refused by Accelerate's own ParallelismConfig, before any rule runs
    with pytest.raises(LaunchError, match="mutually exclusive"):
        resolve(Options(recipe="ring-cp-2gpu", num_processes=4, mesh={"sp": 2}))


@shows(rules.checkpointing_not_twice)
def test_fsdp_activation_checkpointing_excludes_the_training_argument_under_either_name(tmp_path):
    acc = yaml.safe_load(find_recipe("ring-cp-2gpu").accelerate_config_path.read_text())
    acc["fsdp_config"]["fsdp_activation_checkpointing"] = True
    folder = make_recipe(tmp_path, base="ring-cp-2gpu", accelerate=acc)
    for extra in (["--activation_checkpointing", "true"], ["--gradient_checkpointing", "true"]):
        [msg] = messages(resolve(Options(recipe=str(folder), extra=extra)), facts(model_config=QWEN3_8B))
        assert "cannot both be on" in msg
    extra = ["--no_gradient_checkpointing", "--activation_checkpointing", "false"]
    assert messages(resolve(Options(recipe=str(folder), extra=extra)), facts(model_config=QWEN3_8B)) == []


@shows(rules.fsdp_param_offload_not_on_cpu)
def test_cp_param_offload_refused_on_cpu(tmp_path):
    acc = yaml.safe_load(find_recipe("ring-cp-2gpu").accelerate_config_path.read_text())
    acc["fsdp_config"]["fsdp_offload_params"] = True
    folder = make_recipe(tmp_path, base="ring-cp-2gpu", accelerate=acc)
    [msg] = messages(resolve(Options(recipe=str(folder), smoke=True, cpu=True)))
    assert "fsdp_offload_params" in msg


@shows(rules.activation_offloading_without_zero3)
def test_activation_offloading_with_zero3_is_refused():
    [msg] = messages(resolve(Options(recipe="zero3", extra=["--activation_offloading", "true"])))
    assert "'Tensor' object has no attribute 'ds_status'" in msg and "activation_offloading: false" in msg
    assert messages(resolve(Options(recipe="zero2", extra=["--activation_offloading", "true"]))) == []


def test_why_offloading_breaks_zero3_saved_tensor_hooks_return_a_new_object_for_a_saved_parameter():
    """The PyTorch behaviour behind activation_offloading_without_zero3 (device-independent). If this starts to fail,
    PyTorch keeps the parameter object and the rule can probably go."""
    import torch

    weight = torch.nn.Parameter(torch.randn(4, 4))
    weight.ds_status = "available"  # as DeepSpeed ZeRO-3 marks its parameters
    seen = {}

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            seen["has_ds_status"] = hasattr(w, "ds_status")
            return grad @ w, grad.t() @ x

    x = torch.randn(2, 4, requires_grad=True)
    Linear.apply(x, weight).sum().backward()
    assert seen["has_ds_status"] is True
    store = {}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: store.setdefault(id(t), t) is t and id(t),
                                                  lambda i: store[i]):
        y = Linear.apply(x, weight)
    y.sum().backward()
    assert seen["has_ds_status"] is False


# ---- long context: RoPE coverage, host and GPU memory -------------------------------------------------------------
QWEN3_8B_POSITIONS = {**QWEN3_8B, "max_position_embeddings": 40960,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}


@shows(rules.rope_covers_length)
def test_rope_rule_refuses_an_unscaled_long_run_with_the_fix():
    unscaled = resolve(Options(recipe="ring-cp-8gpu", extra=["--model_init_kwargs", "{}"]))
    [msg] = messages(unscaled, facts(model_config=QWEN3_8B_POSITIONS))
    assert "max_length 1,048,576 is beyond the 40,960 positions the model's max_position_embeddings covers" in msg
    assert "rope_type: yarn" in msg and "factor: 32" in msg and "original_max_position_embeddings: 40960" in msg
    # the recipe's own YaRN (x32 over 32,768) covers 1,048,576 exactly; a longer run needs more
    assert messages(resolve(Options(recipe="ring-cp-8gpu")), facts(model_config=QWEN3_8B_POSITIONS)) == []
    [msg] = messages(resolve(Options(recipe="ring-cp-8gpu", extra=["--max_length", "2097152"])),
                     facts(model_config=QWEN3_8B_POSITIONS))
    assert "beyond the 1,048,576 positions the run's yarn RoPE scaling (x32 over 32,768 positions) covers" in msg


def test_rope_rule_counts_the_models_own_scaling():
    """Llama-3.1's config already scales RoPE (llama3, 131,072 positions): 100K needs nothing more; the recipe's
    3.7M sets llama3 x512 over 8,192 = 4,194,304."""
    llama = {"num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
             "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
                                 "rope_theta": 500000.0}}
    assert messages(resolve(Options(recipe="alst-ulysses-8gpu")), facts(model_config=llama)) == []
    short = resolve(Options(recipe="alst-ulysses-8gpu", extra=["--model_init_kwargs", "{}", "--max_length", "131072"]))
    assert messages(short, facts(model_config=llama)) == []


def _memory(setup, config_dir, host=None, gpu=79.1):
    model = hub.read_model_config(str(MODEL_CONFIGS / config_dir))
    return plan_memory(setup, Target(setup.layout.processes_per_machine, 1, gpu, host), model=model)


@shows(rules.host_memory_fits)
def test_offloaded_activations_need_host_memory():
    setup = resolve(Options(recipe="alst-ulysses-8gpu"))
    llama = {"num_attention_heads": 32, "num_key_value_heads": 8}
    plan = _memory(setup, "meta-llama--Llama-3.1-8B-Instruct", host=512)
    [msg] = messages(setup, facts(model_config=llama, memory=plan))
    assert "needs 1162.1 GiB of host memory per node (8 processes" in msg and "this machine has 512.0 GiB" in msg
    assert "offloaded checkpoints (pinned, power-of-two blocks) 128.0 GiB" in msg and "--force" in msg
    assert messages(setup, facts(model_config=llama, memory=_memory(setup, "meta-llama--Llama-3.1-8B-Instruct",
                                                                     host=2048))) == []


@shows(rules.gpu_memory_fits)
def test_a_run_predicted_not_to_fit_the_gpus_is_refused_with_the_way_out():
    setup = resolve(Options(recipe="ring-cp-8gpu", extra=["--max_length", "4194304", "--model_init_kwargs", "{}"]))
    plan = _memory(setup, "Qwen--Qwen3-8B", host=4096)
    msgs = messages(setup, facts(model_config=QWEN3_8B, memory=plan))
    [msg] = [m for m in msgs if "The planner predicts" in m]
    assert "GiB per GPU and the GPUs here have 79.1 GiB" in msg and "--force starts it anyway" in msg
    assert "--max-length auto" in msg


# ---- FSDP2 and adapters --------------------------------------------------------------------------------------------
@shows(rules.fsdp2_without_fsdp1_settings)
def test_fsdp1_settings_under_fsdp2_are_refused(tmp_path):
    acc = yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())
    acc["fsdp_config"].update(fsdp_sharding_strategy="HYBRID_SHARD", fsdp_forward_prefetch=True)
    setup = resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", accelerate=acc))))
    msg = rules.fsdp2_without_fsdp1_settings(setup, facts())
    assert "fsdp_sharding_strategy: HYBRID_SHARD (HSDP in FSDP2 is parallelism_config" in msg
    assert "fsdp_forward_prefetch: true" in msg
    assert rules.fsdp2_without_fsdp1_settings(resolve(Options(recipe="fsdp2")), facts()) is None


@shows(rules.lora_rank_positive)
def test_lora_rank_must_be_positive(tmp_path):
    folder = make_recipe(tmp_path, base="ddp", config={"use_peft": True, "lora_r": 0})
    msg = rules.lora_rank_positive(resolve(Options(recipe=str(folder))), facts())
    assert "lora_r is 0" in msg and "positive integer" in msg
    folder = make_recipe(tmp_path, base="ddp", config={"use_peft": True, "lora_r": 8}, name="ok")
    assert rules.lora_rank_positive(resolve(Options(recipe=str(folder))), facts()) is None


@shows(rules.lora_targets_match)
def test_lora_targets_that_match_no_linear_layer_are_refused(tmp_path):
    qwen3 = json.loads((MODEL_CONFIGS / "Qwen--Qwen3-8B" / "config.json").read_text())
    folder = make_recipe(tmp_path, base="ddp",
                         config={"use_peft": True, "lora_target_modules": ["query_key_value", "dense"]})
    msg = rules.lora_targets_match(resolve(Options(recipe=str(folder))), facts(qwen3))
    assert "lora_target_modules ['query_key_value', 'dense'] match none of the linear layers" in msg
    assert ("self_attn.q_proj, self_attn.k_proj, self_attn.v_proj, self_attn.o_proj, mlp.gate_proj, mlp.up_proj, "
            "mlp.down_proj, lm_head") in msg  # the model's own modules, built on the meta device
    for targets in (["all-linear"], ["q_proj", "v_proj"], [r".*\.mlp\..*_proj"]):
        folder = make_recipe(tmp_path, base="ddp", config={"use_peft": True, "lora_target_modules": targets},
                             name="ok-" + str(len(targets)) + targets[0][:3].replace("\\", "").replace("*", ""))
        assert rules.lora_targets_match(resolve(Options(recipe=str(folder))), facts(qwen3)) is None, targets


@shows(rules.quantized_base_shardable)
def test_four_bit_base_under_fsdp_needs_a_float_storage_equal_to_the_load_dtype(tmp_path):
    qlora = {"use_peft": True, "load_in_4bit": True, "use_bnb_nested_quant": True, "dtype": "bfloat16"}
    setup = resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", config=qlora))))
    msg = rules.quantized_base_shardable(setup, facts())
    assert "bnb_4bit_quant_storage equal to the model's dtype (now uint8 and bfloat16)" in msg
    ok = make_recipe(tmp_path, base="fsdp2", config={**qlora, "bnb_4bit_quant_storage": "bfloat16"}, name="ok")
    assert rules.quantized_base_shardable(resolve(Options(recipe=str(ok))), facts()) is None
    ddp = make_recipe(tmp_path, base="ddp", config=qlora, name="ddp")  # DDP keeps the base whole: any storage
    assert rules.quantized_base_shardable(resolve(Options(recipe=str(ddp))), facts()) is None


@shows(rules.quantized_base_on_cpu)
def test_qlora_on_cpu_asks_the_one_answer(tmp_path, monkeypatch):
    folder = make_recipe(tmp_path, base="ddp", config={"use_peft": True, "load_in_4bit": True})
    setup = resolve(Options(recipe=str(folder), smoke=True, cpu=True))
    monkeypatch.setattr(rules, "quantization_on_cpu_supported", lambda: False)
    assert "bitsandbytes' quantized training does not run" in rules.quantized_base_on_cpu(setup, facts())
    monkeypatch.setattr(rules, "quantization_on_cpu_supported", lambda: True)
    assert rules.quantized_base_on_cpu(setup, facts()) is None


def test_merge_problems_read_the_recorded_adapter():
    """`launch merge` asks rules.merge_problems before loading anything (one function, shared with its tests)."""
    from launch.config.adapter import Adapter

    [msg] = rules.merge_problems({"adapter": None})
    assert "trained the whole model" in msg and "nothing to merge" in msg
    lora = Adapter.from_training({"use_peft": True}).identity()
    assert rules.merge_problems({"adapter": lora}) == []
    qlora = Adapter.from_training({"use_peft": True, "load_in_4bit": True}).identity()
    [msg] = rules.merge_problems({"adapter": qlora})
    assert "trained on a 4-bit base (qlora)" in msg
    assert rules.merge_problems({"adapter": qlora}, allow_quantized=True) == []


@shows(rules.qlora_fsdp_optimizer)
def test_paged_adamw_8bit_with_qlora_under_fsdp_is_refused(tmp_path):
    qlora = {"use_peft": True, "load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16", "dtype": "bfloat16",
             "optim": "paged_adamw_8bit"}
    setup = resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", config=qlora))))
    assert "fails when the first checkpoint is saved" in rules.qlora_fsdp_optimizer(setup, facts())
    ddp = make_recipe(tmp_path, base="ddp", config=qlora, name="ddp")
    assert rules.qlora_fsdp_optimizer(resolve(Options(recipe=str(ddp))), facts()) is None


def test_the_preflight_passes_a_lora_run_that_fits_and_stops_the_full_fine_tune_that_does_not(tmp_path):
    """The memory rule reads the planner, which knows adapters: Qwen3-8B LoRA (2 x 4096 tokens per step and
    GPU) fits one 24 GiB GPU, the same run as a full fine-tune does not."""
    lora = {"use_peft": True, "lora_target_modules": ["all-linear"], "model_name_or_path": "Qwen/Qwen3-8B",
            "dtype": "bfloat16", "max_length": 4096, "per_device_train_batch_size": 2, "attn_implementation": "sdpa",
            "activation_checkpointing": True}  # what a 24 GB GPU needs (ddp's GPU default does without)
    model = hub.read_model_config(str(MODEL_CONFIGS / "Qwen--Qwen3-8B"))
    one_gpu = Target(1, 1, 24.0)
    setup = resolve(Options(recipe=str(make_recipe(tmp_path, base="ddp", config=lora)), num_processes=1))
    plan = plan_memory(setup, one_gpu, model=model)
    assert rules.gpu_memory_fits(setup, facts(memory=plan, gpu_count=1)) is None
    full_recipe = make_recipe(tmp_path, base="ddp", config={**lora, "use_peft": False}, name="full")
    full = resolve(Options(recipe=str(full_recipe),
                           num_processes=1))
    msg = rules.gpu_memory_fits(full, facts(memory=plan_memory(full, one_gpu, model=model), gpu_count=1))
    assert msg.startswith("The planner predicts") and "the GPUs here have 24.0 GiB" in msg


@shows(rules.fsdp_state_dict_type_saves_weights)
def test_an_fsdp_state_dict_type_that_writes_no_weights_is_refused(tmp_path):
    """LOCAL_STATE_DICT (FSDP1's per-rank flat shards: no final weights) and a name Accelerate does not know are
    refused; FULL, SHARDED (by name, any case, or torch's StateDictType value 3) and FSDP2's default pass."""
    fsdp = yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())["fsdp_config"]

    def check(name, **changes):
        acc = {"fsdp_config": {k: v for k, v in {**fsdp, **changes}.items() if v is not None}}
        return rules.fsdp_state_dict_type_saves_weights(
            resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", accelerate=acc, name=name)))), facts())

    msg = check("local", fsdp_version=1, fsdp_reshard_after_forward=None, fsdp_state_dict_type="LOCAL_STATE_DICT")
    assert msg.startswith("fsdp_state_dict_type LOCAL_STATE_DICT in ") and "no weights in final/" in msg
    assert "Use SHARDED_STATE_DICT" in msg
    # a name Accelerate does not know is refused earlier, with the Accelerate config's other enum values (
    # launch.config.accelerate_config.ENUMS), while the recipe resolves
    with pytest.raises(LaunchError, match=r"'SHARDED' is not a valid FSDP_STATE_DICT_TYPE; expected one of "):
        check("typo", fsdp_state_dict_type="SHARDED")
    for name, value in (("sharded", "sharded_state_dict"), ("number", 3), ("absent", None)):
        assert check(name, fsdp_state_dict_type=value) is None, name
    assert rules.fsdp_state_dict_type(yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())) \
        == "FULL_STATE_DICT"
    assert rules.fsdp_state_dict_type({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}}) \
        == "SHARDED_STATE_DICT"  # Accelerate's FSDP2 default
    assert rules.fsdp_state_dict_type({"distributed_type": "FSDP", "fsdp_config": {}}) == "FULL_STATE_DICT"
    assert rules.fsdp_state_dict_type_saves_weights(resolve(Options(recipe="zero3")), facts()) is None


@shows(rules.adapter_with_fsdp_activation_checkpointing)
def test_an_adapter_under_fsdp_activation_checkpointing_is_refused(tmp_path):
    """An Accelerate config that checkpoints the FSDP way (fsdp2's, where memory needs it): with an adapter the saved
    adapter would be empty."""
    fsdp = {**find_recipe("fsdp2").accelerate["fsdp_config"], "fsdp_activation_checkpointing": True}
    folder = make_recipe(tmp_path, base="fsdp2", config={"use_peft": True}, accelerate={"fsdp_config": fsdp})
    msg = rules.adapter_with_fsdp_activation_checkpointing(resolve(Options(recipe=str(folder))), facts())
    assert "would hold 0 tensors, silently" in msg and "fsdp_activation_checkpointing: false" in msg
    assert rules.adapter_with_fsdp_activation_checkpointing(resolve(Options(recipe="fsdp2")), facts()) is None


def test_an_hsdp_mesh_that_does_not_use_the_processes_is_refused(tmp_path):
    """FSDP2's HSDP mesh (dp_replicate x dp_shard) is checked by the one process-count rule, as every mesh is."""
    acc = yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())
    acc["parallelism_config"] = {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 3}
    setup = resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", accelerate=acc))))
    msg = rules.processes_fit_layout(setup, facts())
    assert "(dp_replicate=2 x dp_shard=3 x tp=1 x cp=1 x sp=1 = 6) does not use 8 processes" in msg
    assert rules.processes_fit_layout(resolve(Options(recipe=str(make_recipe(tmp_path, base="fsdp2", accelerate={
        **acc, "parallelism_config": {"parallelism_config_dp_replicate_size": 2,
                                      "parallelism_config_dp_shard_size": 4}}, name="hsdp")))), facts()) is None


@pytest.mark.parametrize("name,model", [("lora", "Qwen--Qwen3-8B"), ("qlora-fsdp", "Qwen--Qwen2.5-72B-Instruct"),
                                        ("fsdp2", "Qwen--Qwen3-8B"), ("fsdp2-70b", "Qwen--Qwen2.5-72B-Instruct")])
def test_the_fsdp2_and_adapter_recipes_pass_their_rules(name, model):
    """The issue-25/26 recipes' GPU defaults pass every rule about the run, their models' configs read (fsdp2-70b's
    multi-node layout needs only its rendezvous address, which a real launch passes)."""
    config = json.loads((MODEL_CONFIGS / model / "config.json").read_text())
    report = rules.check(resolve(Options(recipe=name, main_process_ip="10.0.0.1" if name == "fsdp2-70b" else None)),
                         facts(config))
    assert report.problems == [] and report.skipped == [], (report.problems, report.skipped)


# ---- a setting whose package this machine lacks is refused before start -------------------------------------------
def _lacking(*packages, **kw):
    """The fake 8-GPU machine (every package at its pin) without `packages`."""
    return facts(versions={**PINNED, **{p: None for p in packages}}, **kw)


def _pin(name: str) -> str:
    """The version requirements/pins.txt chooses (the locks the messages read agree with it: `doctor` checks)."""
    from launch.facts.pins import read_pins

    return read_pins()[name]


@shows(rules.liger_kernel_installed)
def test_liger_without_liger_kernel_is_refused_and_the_cpu_profile_says_it_turns_liger_off(tmp_path):
    setup = resolve(Options(recipe="ddp", extra=["--use_liger_kernel", "true"]))
    msg = rules.liger_kernel_installed(setup, _lacking("liger-kernel"))
    assert msg.startswith("`use_liger_kernel: true` (the training arguments after `--`) needs liger-kernel, which is "
                          "not installed here: every rank would load the model and then stop with an ImportError")
    assert f"`pip install liger-kernel=={_pin('liger-kernel')}`" in msg and "`-- --use_liger_kernel false`" in msg
    assert rules.liger_kernel_installed(setup, facts()) is None
    off = resolve(Options(recipe="ddp", extra=["--use_liger_kernel", "false"]))
    assert rules.liger_kernel_installed(off, _lacking("liger-kernel")) is None
    # the recipes' GPU defaults turn Liger on (`plan --fastest`): a GPU machine without it is told so
    assert rules.liger_kernel_installed(resolve(Options(recipe="ddp")), _lacking("liger-kernel")).startswith(
        "`use_liger_kernel: true` (")
    # a recipe that turns Liger on: on CPU the profile turns it off, says so in one line, and nothing is refused
    folder = make_recipe(tmp_path, base="ddp", config={"use_liger_kernel": True})
    cpu = resolve(Options(recipe=str(folder), smoke=True, cpu=True), progress=lambda *_: None)
    assert cpu.training["use_liger_kernel"] is False
    assert rules.liger_kernel_installed(cpu, _lacking("liger-kernel")) is None
    assert cpu.notes == ["the CPU profile turns use_liger_kernel off: Liger's kernels are Triton kernels, which need "
                         "a GPU"]
    assert resolve(Options(recipe="ddp", smoke=True, cpu=True), progress=lambda *_: None).notes == cpu.notes
    assert resolve(Options(recipe="alst-ulysses-8gpu", smoke=True, cpu=True), progress=lambda *_: None).notes == []


@shows(rules.trackio_installed)
def test_trackio_named_without_trackio_is_refused_and_report_to_none_tracks_nothing():
    from launch.run import tracking

    setup = resolve(Options(recipe="ddp"))
    msg = rules.trackio_installed(setup, _lacking("trackio"))
    assert msg.startswith(f"`report_to: trackio` ({setup.recipe.config_path}) needs trackio, which is not installed "
                          "here: every rank would stop when the Trainer is built")
    assert f"`pip install trackio=={_pin('trackio')}`" in msg and "`-- --report_to none`" in msg
    assert rules.trackio_installed(setup, facts()) is None
    for off in ("none", "all"):  # `all`: the trackers installed, whichever they are
        assert rules.trackio_installed(resolve(Options(recipe="ddp", extra=["--report_to", off])),
                                       _lacking("trackio")) is None
    # with report_to none the launcher tracks nothing: no store for the ranks, no tracking in the summary
    none = resolve(Options(recipe="ddp", synthetic=True, bench=True, extra=["--report_to", "none"]))
    assert tracking.env(none) == {} and tracking.summary(none) is None and tracking.dashboard_line(none) is None


@shows(rules.bitsandbytes_usable)
def test_a_quantized_base_needs_bitsandbytes_and_its_cuda_library(monkeypatch):
    qlora = resolve(Options(recipe="qlora-fsdp"))
    msg = rules.bitsandbytes_usable(qlora, _lacking("bitsandbytes"))
    assert msg.startswith(f"`load_in_4bit: true` ({qlora.recipe.config_path}) quantizes the base model with "
                          "bitsandbytes, which is not installed here")
    assert f"`pip install bitsandbytes=={_pin('bitsandbytes')}`" in msg and "`-- --load_in_4bit false`" in msg
    broken = "its CUDA library does not load (libnvJitLink.so.13: cannot open shared object file)"
    monkeypatch.setattr(rules, "bitsandbytes_cuda_problem", lambda: broken)
    msg = rules.bitsandbytes_usable(qlora, facts())
    assert f"bitsandbytes {_pin('bitsandbytes')}, and {broken}: every rank would stop" in msg
    assert f"`pip install --force-reinstall bitsandbytes=={_pin('bitsandbytes')}`" in msg
    assert rules.bitsandbytes_usable(qlora, facts(gpu_count=0)) is None  # no GPU here: enough_gpus says so
    # on CPU the CPU rule decides (launch.config.adapter.quantization_on_cpu_supported)
    assert rules.bitsandbytes_usable(resolve(Options(recipe="qlora-fsdp", smoke=True, cpu=True),
                                             progress=lambda *_: None), _lacking("bitsandbytes")) is None
    monkeypatch.setattr(rules, "bitsandbytes_cuda_problem", lambda: None)
    assert rules.bitsandbytes_usable(qlora, facts()) is None


@shows(rules.flash_attention_installed)
def test_flash_attention_needs_its_package_or_the_kernels_hub(monkeypatch):
    monkeypatch.setattr(rules, "kernels_route", lambda: (False, "not available: kernels is not installed"))

    def check(attn, *lacking, cpu=False):
        setup = resolve(Options(recipe="ddp", smoke=cpu, cpu=cpu, extra=["--attn_implementation", attn]),
                        progress=lambda *_: None)
        return rules.flash_attention_installed(setup, _lacking(*lacking))

    msg = check("flash_attention_2", "flash-attn")
    assert msg.startswith("`attn_implementation: flash_attention_2` (the training arguments after `--`) needs the "
                          "flash-attn package or, when it is missing, a build of the Hugging Face kernels hub (the "
                          "`kernels` package, not available: kernels is not installed); neither is here")
    assert f"`pip install --no-build-isolation flash-attn=={_pin('flash-attn')}`" in msg
    assert msg.endswith("SDPA, which every recipe runs: `-- --attn_implementation sdpa`.")
    assert f"`pip install flash-attn-4[cu13]=={_pin('flash-attn-4')}`" in check("flash_attention_4", "flash-attn-4")
    assert "needs a build of the Hugging Face kernels hub" in check("kernels-community/flash-attn3")
    assert check("flash_attention_2") is None and check("sdpa", "flash-attn") is None
    assert check("flash_attention_2", "flash-attn", cpu=True) is None  # the CPU profile runs it as sdpa
    monkeypatch.setattr(rules, "kernels_route", lambda: (True, "kernels 0.18.2"))
    assert check("flash_attention_2", "flash-attn") is None  # transformers falls back to the hub's build


@shows(rules.deepspeed_cpu_adam_buildable)
def test_an_offloaded_optimizer_needs_deepspeeds_cpu_adam_buildable(monkeypatch):
    setup = resolve(Options(recipe="zero3-offload"))
    # here (and in CI, whose zero3-offload smoke run compiles it) the tools are found
    assert rules.deepspeed_cpu_adam_buildable(setup, facts()) is None
    monkeypatch.setattr(rules, "jit_build_tools", lambda: {"ninja": None, "a C++ compiler": "/usr/bin/c++",
                                                           "Python's headers (Python.h)": "/usr/include/Python.h"})
    monkeypatch.setattr(rules, "deepspeed_prebuilt_ops", lambda: (set(), "cuda"))
    msg = rules.deepspeed_cpu_adam_buildable(setup, facts())
    assert msg.startswith(f"The Accelerate config offloads the optimizer to the CPU (offload_optimizer_device in "
                          f"{setup.recipe.accelerate_config_path}), so DeepSpeed runs Adam with its cpu_adam op")
    assert "the compile needs ninja, which this machine lacks" in msg
    assert f"(ninja: `pip install ninja=={_pin('ninja')}`)" in msg and "`offload_optimizer_device: none`" in msg
    assert rules.deepspeed_cpu_adam_buildable(resolve(Options(recipe="zero3")), facts()) is None  # no offload
    monkeypatch.setattr(rules, "deepspeed_prebuilt_ops", lambda: ({"cpu_adam"}, "cuda"))
    assert rules.deepspeed_cpu_adam_buildable(setup, facts()) is None  # built at install for this accelerator
    monkeypatch.setattr(rules, "deepspeed_prebuilt_ops", lambda: ({"cpu_adam"}, "cpu"))
    assert "which this machine lacks" in rules.deepspeed_cpu_adam_buildable(setup, facts())
