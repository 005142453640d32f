"""Validity rules, checked before any process starts. Each rule is written once, here, and used by the
preflight (`python -m launch`), by `doctor`, and by the tests (tests/test_rules.py shows every message).

A rule takes the resolved `Setup` and the `Facts` of this machine and returns None when satisfied, or one
paragraph saying what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import Version


# Version floors per feature (sources in ../shared/REFERENCE.md; also read by `launch doctor`).
FLOORS = {
    "deepspeed": {"deepspeed": "0.15.0"},
    "fsdp2": {"torch": "2.6.0", "accelerate": "1.7.0"},
    "context_parallel": {"torch": "2.6.0", "accelerate": "1.11.0"},
    "sequence_parallel": {"accelerate": "1.12.0", "deepspeed": "0.18.2", "transformers": "5.0.0"},
}
# Releases known to be broken for a feature, with why.
BROKEN = {
    "deepspeed": {("transformers", "5.1.0"): "transformers 5.1.0 is broken with DeepSpeed (TRL excludes it)"},
}
# Keys every recipe config must set (the GPU defaults a user runs).
REQUIRED_KEYS = ("accelerate_config", "model_name_or_path", "output_dir")


@dataclass
class Facts:
    """What this machine has, gathered once (tests pass their own)."""

    versions: dict = field(default_factory=dict)  # distribution name -> version string, or None if absent
    gpu_count: int = 0
    model_config: dict | None = None  # the model's config.json, when it can be read locally
    training_fields: frozenset = frozenset()  # every key the recipe's TRL parser accepts


RULES: list[Callable] = []


def rule(fn):
    RULES.append(fn)
    return fn


def features(setup) -> list[str]:
    acc = setup.accelerate
    out = []
    if acc.get("distributed_type") == "DEEPSPEED":
        out.append("deepspeed")
    if acc.get("distributed_type") == "FSDP" and int((acc.get("fsdp_config") or {}).get("fsdp_version", 1)) == 2:
        out.append("fsdp2")
    if setup.plan.mesh.get("cp", 1) > 1:
        out.append("context_parallel")
    if setup.plan.mesh.get("sp", 1) > 1:
        out.append("sequence_parallel")
    return out


def _public(version: str) -> Version:
    return Version(Version(version).public)


@rule
def config_keys_known(setup, facts: Facts):
    if not facts.training_fields:
        return None
    allowed = set(facts.training_fields) | {"env"}
    problems = []
    for source, keys in (
        (str(setup.recipe.config_path), setup.recipe.config.keys()),
        ("the training arguments after `--`", [k for k in setup.training_overrides if k not in setup.recipe.config]),
    ):
        for key in keys:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=2)
                hint = f" (did you mean {' or '.join(close)}?)" if close else ""
                problems.append(f"`{key}` in {source}{hint}")
    if problems:
        return (
            "Unknown training argument(s): " + "; ".join(problems) + ". Keys must be fields of TRL's SFTConfig, "
            "ModelConfig, ScriptArguments or the recipe's RecipeArguments (see its train.py)."
        )
    return None


@rule
def config_keys_required(setup, facts: Facts):
    missing = [k for k in REQUIRED_KEYS if setup.recipe.config.get(k) in (None, "")]
    if not (setup.training.get("dataset_name") or setup.training.get("datasets")):
        missing.append("dataset_name")
    if missing:
        return (
            f"{setup.recipe.config_path} is missing required key(s): {', '.join(missing)}. A recipe's config.yaml "
            "holds the GPU defaults a user runs: the Accelerate config, the model, the dataset and the output folder."
        )
    return None


@rule
def processes_fit_layout(setup, facts: Facts):
    plan = setup.plan
    if plan.world_size < 1:
        return f"num_processes is {plan.world_size}; it must be at least 1."
    if plan.world_size % plan.num_machines:
        return (
            f"{plan.world_size} processes cannot be spread evenly over {plan.num_machines} machines; "
            "num_processes counts processes on all machines together."
        )
    if setup.accelerate.get("parallelism_config"):
        m = plan.mesh
        product = m["dp_replicate"] * m["dp_shard"] * m["tp"] * m["cp"] * m["sp"]
        if product != plan.world_size:
            dims = " x ".join(f"{k}={v}" for k, v in m.items())
            return (
                f"The recipe's parallel layout ({dims} = {product}) does not use {plan.world_size} processes: "
                "dp_replicate x dp_shard x tp x cp x sp must equal the number of processes. Pass a matching "
                "--num-processes, or change the mesh sizes (--dp-shard-size, --sp-size, --cp-size ...)."
            )
    return None


@rule
def enough_gpus(setup, facts: Facts):
    if setup.options.cpu:
        return None
    needed = setup.plan.processes_per_machine
    if facts.gpu_count < needed:
        seen = f"{facts.gpu_count} GPU(s) are visible" if facts.gpu_count else "no GPU is visible"
        return (
            f"The recipe asks for {needed} GPU(s) on this machine but {seen}. Use --num-processes "
            f"{facts.gpu_count or 1} with a matching layout, check CUDA_VISIBLE_DEVICES and the container's GPU "
            "reservation, or run the smoke profile on CPU with --smoke --cpu."
        )
    return None


def floor_problems(feature_names, versions: dict) -> list[str]:
    problems = []
    for feature in feature_names:
        for package, floor in FLOORS.get(feature, {}).items():
            have = versions.get(package)
            if have is None:
                problems.append(f"{feature.replace('_', ' ')} needs {package}>={floor}, which is not installed")
            elif _public(have) < Version(floor):
                problems.append(f"{feature.replace('_', ' ')} needs {package}>={floor}, found {have}")
        for (package, bad), why in BROKEN.get(feature, {}).items():
            if versions.get(package) and _public(versions[package]) == Version(bad):
                problems.append(why)
    return problems


@rule
def version_floors(setup, facts: Facts):
    problems = floor_problems(features(setup), facts.versions)
    if problems:
        return "Installed versions are below what this recipe needs: " + "; ".join(problems) + (
            ". Install the pinned versions (requirements/pins.txt; `bash ci/test.sh` or the container does)."
        )
    return None


@rule
def precision_fits_device(setup, facts: Facts):
    if setup.options.cpu and (setup.training.get("bf16") or setup.training.get("fp16")):
        return (
            "bf16/fp16 mixed precision was asked for a CPU run; the CPU path trains in fp32 "
            "(transformers would stop with \"Your setup doesn't support bf16/gpu\"). Drop --bf16/--fp16."
        )
    return None


@rule
def checkpointing_not_twice(setup, facts: Facts):
    fsdp = setup.accelerate.get("fsdp_config") or {}
    # SFTConfig defaults gradient_checkpointing to True, so an unset key counts as on.
    if fsdp.get("fsdp_activation_checkpointing") and setup.training.get("gradient_checkpointing", True):
        return (
            "FSDP activation checkpointing (fsdp_activation_checkpointing in the Accelerate config) and "
            "gradient_checkpointing in the training arguments cannot both be on (transformers refuses it; TRL's "
            "SFTConfig defaults gradient_checkpointing to true). Set `gradient_checkpointing: false` in config.yaml."
        )
    return None


# ---- Sequence parallelism (ALST/Ulysses, DeepSpeed) -----------------------------------------------------------
SP_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


def _sp(setup) -> int:
    return setup.plan.mesh.get("sp", 1)


def _pc(setup) -> dict:
    return setup.accelerate.get("parallelism_config") or {}


@rule
def sp_heads_divisible(setup, facts: Facts):
    sp, cfg = _sp(setup), facts.model_config
    if sp <= 1 or not cfg:
        return None
    q = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or q
    problems = []
    if q and q % sp:
        # DeepSpeed: "Attention head count {q} is not divisible by SP size {sp}"
        problems.append(f"its {q} query heads are not divisible by sp_size={sp}")
    if kv and kv % sp and sp % kv:
        # DeepSpeed: "KV attention head count {kv} is not divisible by SP size {sp} or vice versa"
        problems.append(f"its {kv} KV heads neither divide sp_size={sp} nor are divisible by it")
    if problems:
        return (f"Ulysses sequence parallelism splits attention heads across the sp group, and the model "
                f"({setup.training.get('model_name_or_path')}) does not allow sp_size={sp}: {'; '.join(problems)}. "
                "Choose an sp_size that divides the query heads (--sp-size).")
    return None


@rule
def sp_sequence_divisible(setup, facts: Facts):
    sp = _sp(setup)
    if sp <= 1:
        return None
    multiple = setup.training.get("pad_to_multiple_of")
    if not multiple or int(multiple) % sp:
        return (f"With sp_size={sp} every batch's sequence length must be divisible by {sp} (DeepSpeed: \"batch's "
                f"seqlen=L isn't divisible by sp-size={sp}\"); set pad_to_multiple_of to a multiple of {sp} "
                f"(it is {multiple}).")
    if setup.options.cpu and int(multiple) != int(setup.training.get("max_length") or 0):
        return ("On CPU, gloo all-gathers only equal shapes (\"ProcessGroupGloo::allgather: invalid tensor size\"), so "
                "every SP batch must have the same length: set pad_to_multiple_of equal to max_length "
                f"({setup.training.get('max_length')}).")
    return None


@rule
def sp_attention_supported(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    model_attn = setup.training.get("attn_implementation")
    sp_attn = _pc(setup).get("parallelism_config_sp_attn_implementation", model_attn)
    if model_attn not in SP_ATTENTION or sp_attn not in SP_ATTENTION:
        return (f"Ulysses sequence parallelism needs FlashAttention 2/3 or SDPA; got attn_implementation="
                f"{model_attn}, parallelism_config_sp_attn_implementation={sp_attn}. Eager and flex attention are "
                "refused (their 4D attention mask is dropped).")
    if model_attn != sp_attn:
        return (f"attn_implementation ({model_attn}) and parallelism_config_sp_attn_implementation ({sp_attn}) must be "
                "the same (DeepSpeed: \"core_attn_implementation ... does not match model config attn_implementation\").")
    return None


@rule
def sp_packing_safe(setup, facts: Facts):
    if _sp(setup) <= 1:
        return None
    t = setup.training
    if t.get("padding_free") or (t.get("packing") and t.get("packing_strategy", "bfd") != "wrapped"):
        return ("With sequence parallelism, use `packing_strategy: wrapped` (or no packing) and padding_free off: TRL's "
                "bfd packing and padding-free batches carry 1-D cu_seq_lens that DeepSpeed's SP data loader cannot "
                "shard (IndexError in UlyssesSPDataLoaderAdapter.refill). Wrapped rows are plain fixed-length token "
                "windows; with SDPA, documents that share a row attend to each other, as in any wrapped packing.")
    return None


@rule
def sp_zero_stage(setup, facts: Facts):
    if _sp(setup) > 1 and setup.plan.zero_stage not in (1, 2, 3):
        return (f"Ulysses sequence parallelism runs on DeepSpeed ZeRO stage 1, 2 or 3 (stage {setup.plan.zero_stage} "
                "crashes, DeepSpeed #7833): use distributed_type DEEPSPEED with zero_stage 1-3.")
    return None


@rule
def tiled_mlp_needs_deepspeed(setup, facts: Facts):
    if setup.training.get("tiled_mlp") and setup.accelerate.get("distributed_type") != "DEEPSPEED":
        return ("`tiled_mlp` needs DeepSpeed (ZeRO stage 1-3): DeepSpeed's TiledMLP accumulates each weight's gradient "
                "over the tiles and hands it to ZeRO only after the last tile; DDP and FSDP would reduce a partial one.")
    return None


@rule
def activation_offloading_without_zero3(setup, facts: Facts):
    if setup.training.get("activation_offloading") and setup.plan.zero_stage == 3:
        return ("activation_offloading cannot be combined with DeepSpeed ZeRO-3 here: TRL's offloader works through "
                "PyTorch saved-tensor hooks, which hand a saved parameter back to the backward as a new tensor object; "
                "TRL's fused loss saves the lm_head weight and, under ZeRO-3, reads DeepSpeed's `ds_status` from it in "
                "the backward (\"AttributeError: 'Tensor' object has no attribute 'ds_status'\" in "
                "trl/kernels/chunked_logprob.py). Set `activation_offloading: false` (gradient checkpointing stays), or "
                "use ZeRO stage 1/2.")
    return None


@rule
def sp_resume_needs_data_skip(setup, facts: Facts):
    t = setup.training
    if _sp(setup) > 1 and t.get("resume_from_checkpoint") and not t.get("ignore_data_skip"):
        return ("Resuming a sequence-parallel run fails upstream: the Trainer skips the batches already seen with "
                "accelerate's skip_first_batches, which does not know DeepSpeed's UlyssesSPDataLoaderAdapter "
                "(\"'UlyssesSPDataLoaderAdapter' object has no attribute 'dataset'\"). Resume with "
                "`-- --ignore_data_skip true`: weights, optimizer and step count are restored, but the current epoch's "
                "data starts again from its first batch.")
    return None


# ---- Ring-attention context parallelism (FSDP2) ------------------------------------------------------------------
def _cp(setup) -> int:
    return setup.plan.mesh.get("cp", 1)


@rule
def cp_and_sp_exclusive(setup, facts: Facts):
    if _cp(setup) > 1 and _sp(setup) > 1:
        return ("Context parallelism (cp_size) and sequence parallelism (sp_size) cannot be combined (Accelerate: "
                "\"Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive\"). Pick one.")
    return None


@rule
def cp_needs_fsdp2(setup, facts: Facts):
    acc = setup.accelerate
    if _cp(setup) > 1 and not (acc.get("distributed_type") == "FSDP"
                               and int((acc.get("fsdp_config") or {}).get("fsdp_version", 1)) == 2):
        return ("Ring-attention context parallelism runs on FSDP2 only: set distributed_type: FSDP and "
                "fsdp_config.fsdp_version: 2 in the Accelerate config (Accelerate: \"Using `cp_size>1` requires FSDP2\").")
    return None


@rule
def cp_sequence_divisible(setup, facts: Facts):
    cp = _cp(setup)
    if cp <= 1:
        return None
    multiple = setup.training.get("pad_to_multiple_of")
    if not multiple or int(multiple) % (2 * cp):
        return (f"With cp_size={cp} every sequence length must be divisible by 2 x cp_size = {2 * cp}: torch's "
                "head-tail load balancing cuts it into 2 x cp chunks (a length not divisible by cp makes the "
                "collectives fail; one divisible by cp only silently unbalances the work). Set pad_to_multiple_of "
                f"to a multiple of {2 * cp} (it is {multiple}).")
    return None


@rule
def cp_attention_sdpa(setup, facts: Facts):
    attn = setup.training.get("attn_implementation")
    if _cp(setup) > 1 and attn != "sdpa":
        return (f"Ring-attention context parallelism supports SDPA attention only, not {attn} (transformers: "
                "\"Context parallelism is supported only with SDPA attention\"). Set attn_implementation: sdpa.")
    return None


@rule
def cp_causal_only(setup, facts: Facts):
    cfg = facts.model_config or {}
    if _cp(setup) <= 1:
        return None
    layer_types = cfg.get("layer_types") or []
    sliding = cfg.get("use_sliding_window") or any("sliding" in str(t) for t in layer_types)
    if sliding:
        return (f"The model ({setup.training.get('model_name_or_path')}) uses sliding-window attention; context "
                "parallelism only computes full causal attention and would silently widen the window (accelerate PR "
                "#4177 refuses it). Use a model without sliding-window layers, or Ulysses SP.")
    return None


@rule
def cp_no_packing(setup, facts: Facts):
    if _cp(setup) > 1 and (setup.training.get("packing") or setup.training.get("padding_free")):
        return ("Packing is not compatible with context parallelism (TRL: \"Packing is not compatible with context "
                "parallelism (`cp_size > 1`)\"): CP drops the per-layer attention mask, so packed documents would "
                "attend to each other. Set packing: false and use samples as long as the sequence length.")
    return None


@rule
def cp_no_param_offload_on_cpu(setup, facts: Facts):
    if _cp(setup) > 1 and setup.options.cpu and (setup.accelerate.get("fsdp_config") or {}).get("fsdp_offload_params"):
        return ("fsdp_offload_params moves parameters from the accelerator to host memory; on a CPU run it fails "
                "(\"Cannot access accelerator device when none is available\"). Set it false for CPU runs.")
    return None


def check(setup, facts: Facts) -> list[str]:
    """Every broken rule's message (empty when the setup is valid)."""
    return [msg for fn in RULES if (msg := fn(setup, facts))]


def read_model_config(name_or_path: str | None) -> dict | None:
    """The model's config.json from a local folder or the local Hugging Face cache; None if not available."""
    if not name_or_path:
        return None
    local = Path(name_or_path) / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text())
        if os.environ.get("HF_HUB_OFFLINE") != "1":
            from huggingface_hub import hf_hub_download

            return json.loads(Path(hf_hub_download(name_or_path, "config.json", etag_timeout=10)).read_text())
    except Exception:  # noqa: BLE001 - an unreachable config only skips the head-count rules
        pass
    return None
