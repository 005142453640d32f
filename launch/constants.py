"""Names shared by the launcher's modules: attention kernels, Accelerate config keys, mesh dimensions.

Each is written here once; rules, profiles, doctor, plan and the memory model import them.
"""

from __future__ import annotations

# Attention kernels (transformers' `attn_implementation` values).
FLASH_ATTENTION = ("flash_attention_2", "flash_attention_3", "kernels-community/vllm-flash-attn3")
# no CPU kernel: the CPU profile switches them to SDPA (flash_attention_4: transformers 5.23 runs it on compute
# capability >= 9 only)
CUDA_ONLY_ATTENTION = (*FLASH_ATTENTION, "flash_attention_4")
SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")  # what DeepSpeed's Ulysses attention accepts
CP_ATTENTION = "sdpa"  # torch's ring attention dispatches SDPA only

# Accelerate config keys.
SP_ATTENTION_KEY = "parallelism_config_sp_attn_implementation"
CP_COMM_KEY = "parallelism_config_cp_comm_strategy"
MESH_KEYS = {  # mesh dimension -> its size key in an Accelerate config's `parallelism_config`
    "dp_replicate": "parallelism_config_dp_replicate_size",
    "dp_shard": "parallelism_config_dp_shard_size",
    "tp": "parallelism_config_tp_size",
    "cp": "parallelism_config_cp_size",
    "sp": "parallelism_config_sp_size",
}

# Environment variables the launcher reads (each parsed in one place, `launch.config.envvars`).
ENV_MIN_FREE_MB = "LAUNCH_MIN_FREE_MB"
