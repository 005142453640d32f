"""Validity rules, checked before any process starts. Each rule is written once, in this package, and used by the
preflight (`python -m launch`), by `doctor`, by the README tables (`launch.catalog.blocks`) and by the tests
(tests/test_rules.py shows every message).

A rule takes the resolved `Setup` and the `Facts` of this machine and returns None when satisfied, or one paragraph
saying what is wrong and how to fix it. Rules only cover what upstream does not check before start: the merge of
config.yaml and the command line (types, unknown keys) is TRL's parser (`launch.config.training_args`), the Accelerate
config is Accelerate's classes (`launch.config.accelerate_config`), mesh sizes are Accelerate's `ParallelismConfig`.

Two kinds: rules about the run itself (a broken one stops even `--dry-run`), and rules about *this machine*
(`machine=True`: GPUs present, installed versions, files and hub access), which `--dry-run` reports without
failing, since a plan is often made on a machine that will not run it.

The rules live in one module per concern (every_run, packages, precision, checkpointing, sequence_parallel,
context_parallel, packing, fsdp, adapters, long_context), registered by `registry.rule`; this package is their one
face: `from launch.checks import rules` then `rules.check`, `rules.RULES`, `rules.NAME` for any rule.
"""

from __future__ import annotations

# The probes of this machine the rules call through this package (registry.probes), so that replacing one here
# reaches every rule that calls it.
from launch.config.adapter import quantization_on_cpu_supported
from launch.facts.machine import bitsandbytes_cuda_problem, deepspeed_prebuilt_ops, jit_build_tools, kernels_route
from launch.checks.rules.registry import RULES, Facts, Report, Rule, check, features, rule, skipped_line

# The rules are checked (and listed in the recipe READMEs) in the order their modules are imported here, and in
# each module in the order they are written.
from launch.checks.rules.every_run import (config_keys_required, script_holds_its_sections, numbers_positive,
                                           processes_fit_layout, rendezvous_port, multinode_rendezvous,
                                           rendezvous_address_resolves, enough_gpus, model_and_data_found,
                                           output_dir_outside_recipes, model_folder_loads, model_architecture_valid,
                                           missing_inputs, floor_problems, version_floors)
from launch.checks.rules.packages import (liger_kernel_installed, trackio_installed, bitsandbytes_usable,
                                          flash_attention_installed, deepspeed_cpu_adam_buildable)
from launch.checks.rules.precision import precision_fits_device, pure_16bit_update_rounds_away
from launch.checks.rules.checkpointing import (checkpointing_one_name, checkpointing_not_twice,
                                              checkpointing_layers_with_checkpointing,
                                              checkpointing_layers_within_the_model)
from launch.checks.rules.sequence_parallel import (sp_heads_divisible, sp_sequence_divisible, sp_attention_supported,
                                                   sp_packing_safe, sp_zero_stage, tiled_mlp_needs_deepspeed,
                                                   activation_offloading_without_zero3)
from launch.checks.rules.context_parallel import (cp_needs_fsdp2, cp_sequence_divisible, cp_attention_sdpa,
                                                  cp_causal_only, cp_no_packing)
from launch.checks.rules.packing import (packed_attention_keeps_conversations_apart,
                                         eval_packing_keeps_conversations_apart)
from launch.checks.rules.fsdp import (fsdp_param_offload_not_on_cpu, fsdp2_without_fsdp1_settings,
                                      fsdp2_has_a_shard_dimension, fsdp_state_dict_type,
                                      fsdp_state_dict_type_saves_weights)
from launch.checks.rules.adapters import (lora_rank_positive, lora_alpha_positive, lora_dropout_in_range,
                                          quantized_base_needs_adapter, quantization_one_kind, lora_targets_match,
                                          quantized_base_shardable, quantized_base_on_cpu,
                                          adapter_with_fsdp_activation_checkpointing, qlora_fsdp_optimizer,
                                          merge_problems)
from launch.checks.rules.long_context import rope_coverage, rope_covers_length, host_memory_fits, gpu_memory_fits

__all__ = ["RULES", "Facts", "Report", "Rule", "check", "features", "rule", "skipped_line", "config_keys_required",
           "script_holds_its_sections", "numbers_positive", "processes_fit_layout", "rendezvous_port",
           "multinode_rendezvous", "rendezvous_address_resolves", "enough_gpus", "model_and_data_found",
           "output_dir_outside_recipes", "model_folder_loads", "model_architecture_valid", "missing_inputs",
           "floor_problems", "version_floors", "liger_kernel_installed", "trackio_installed", "bitsandbytes_usable",
           "flash_attention_installed", "deepspeed_cpu_adam_buildable", "precision_fits_device",
           "pure_16bit_update_rounds_away", "checkpointing_one_name", "checkpointing_not_twice",
           "checkpointing_layers_with_checkpointing", "checkpointing_layers_within_the_model", "sp_heads_divisible",
           "sp_sequence_divisible", "sp_attention_supported", "sp_packing_safe", "sp_zero_stage",
           "tiled_mlp_needs_deepspeed", "activation_offloading_without_zero3", "cp_needs_fsdp2",
           "cp_sequence_divisible", "cp_attention_sdpa", "cp_causal_only", "cp_no_packing",
           "packed_attention_keeps_conversations_apart", "eval_packing_keeps_conversations_apart",
           "fsdp_param_offload_not_on_cpu", "fsdp2_without_fsdp1_settings", "fsdp2_has_a_shard_dimension",
           "fsdp_state_dict_type", "fsdp_state_dict_type_saves_weights", "lora_rank_positive", "lora_alpha_positive",
           "lora_dropout_in_range", "quantized_base_needs_adapter", "quantization_one_kind", "lora_targets_match",
           "quantized_base_shardable", "quantized_base_on_cpu", "adapter_with_fsdp_activation_checkpointing",
           "qlora_fsdp_optimizer", "merge_problems", "rope_coverage", "rope_covers_length", "host_memory_fits",
           "gpu_memory_fits", "bitsandbytes_cuda_problem", "deepspeed_prebuilt_ops", "jit_build_tools", "kernels_route",
           "quantization_on_cpu_supported"]
