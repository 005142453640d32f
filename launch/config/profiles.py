"""Profiles: what `--smoke`, `--cpu` and a measurement (`--bench`, `--synthetic`) change in a recipe's training
arguments.

The GPU path and the CPU path run the same train.py with the same configs; these overrides are the only
differences: device, precision, attention kernel and model size (plus the few steps of a smoke run). A measurement
saves nothing (`MEASURE_ONLY_TRAINING`).
"""

from __future__ import annotations

import json

from launch.config import smoke
from launch.config.adapter import Adapter
from launch.errors import LaunchError
from launch.constants import CUDA_ONLY_ATTENTION, SP_ATTENTION_KEY
from launch.switches import is_on
from launch.config.training_args import FSDP_CHECKPOINTING, checkpointing

# A smoke run: the tiny offline model and dataset, few steps, a loss and grad_norm logged at every step.
SMOKE_TRAINING = {
    "max_steps": 12,
    "logging_steps": 1,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "learning_rate": 3.0e-3,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "max_length": 128,
    "save_strategy": "no",
    "eval_strategy": "no",
    "report_to": "trackio",  # offline, into OUTPUT_DIR/trackio (launch.run.tracking)
    "seed": 42,
    "dataloader_num_workers": 0,
    "dataset_num_proc": 1,
}

# On CPU: PyTorch's SDPA kernel (FlashAttention is CUDA-only), no Triton kernels: Liger's kernels are Triton, GPU only,
# so the CPU profile turns off the `use_liger_kernel: true` of the recipes' GPU defaults; no fp16 (no CPU autocast for
# it in Accelerate), and fp32 (CPU_FP32) unless the run asks for bf16 after `--` (`-- --bf16 true`): then the recipe's
# own load dtype and bf16 autocast (torch's CPU autocast; DeepSpeed's bf16 module, FSDP2's param_dtype), as on a GPU.
CPU_TRAINING = {
    "use_cpu": True,
    "fp16": False,
    "use_liger_kernel": False,  # Liger's kernels are Triton kernels, GPU only (`cpu_notes` says so when it was on)
}
CPU_FP32 = {"bf16": False, "dtype": "float32"}

# A measurement (--bench, --synthetic) keeps nothing in its output folder but its logs, trainer_state.json and summary:
# no checkpoint (transformers saves one at the last step whenever save_strategy is `steps`, whatever save_steps: a
# Qwen3-4B ZeRO-3 row's is about 56 GB) and no final weights (train.py's `save_final`). The user's own choice wins:
# --save-steps N keeps both (`measure_only`), `-- --save_strategy steps` checkpoints, `-- --save_final true` the
# final weights (both layers come after this one).
MEASURE_ONLY_TRAINING = {"save_strategy": "no", "save_final": False}


# The ranks' environment on CPU: DeepSpeed told, not left to guess, that it runs on its CPU accelerator (the choice
# its auto-detection makes without a GPU, deepspeed 0.19.8 accelerator/real_accelerator.py, where it also prints
# "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." in every process).
CPU_ENV = {"DS_ACCELERATOR": "cpu"}


def cpu_env(training: dict) -> dict:
    """The ranks' environment on CPU for these training arguments: CPU_ENV, and for a bf16 run (QLoRA, or any run
    given `-- --bf16 true`) the pin of its arithmetic to one code path every x86-64-v3 CPU computes alike
    (launch/cpu/portable_bf16.py)."""
    from launch.cpu import portable_bf16

    return {**CPU_ENV, **portable_bf16.rank_env(training)}


def cpu_accelerate(accelerate: dict, bf16: bool = False) -> dict:
    """Accelerate overrides for CPU: fp32 (bf16 for a run that asks for it), and SDPA for Ulysses SP (it must equal
    the model's attention)."""
    out = {"mixed_precision": "bf16" if bf16 else "no"}
    fsdp = accelerate.get("fsdp_config") or {}
    if accelerate.get("distributed_type") == "FSDP" and int(fsdp.get("fsdp_version") or 1) == 1:
        # FSDP1's sync_module_states (which cpu_ram_efficient_loading turns on) broadcasts rank 0's weights from an
        # accelerator: Accelerate's FullyShardedDataParallelPlugin refuses it without one ("There are currently no
        # available devices found"). Every rank loads the same weights itself.
        out["fsdp_sync_module_states"] = False
        out["fsdp_cpu_ram_efficient_loading"] = False
    if (accelerate.get("parallelism_config") or {}).get(SP_ATTENTION_KEY) in CUDA_ONLY_ATTENTION:
        out[SP_ATTENTION_KEY] = "sdpa"
    return out


def measure_only(bench: bool, synthetic: bool, save_steps: int | None) -> dict:
    """The training arguments that make a --bench or --synthetic run keep nothing (unless --save-steps is given)."""
    return dict(MEASURE_ONLY_TRAINING) if (bench or synthetic) and save_steps is None else {}


def cpu_notes(config: dict, training: dict) -> list[str]:
    """What the CPU profile turned off that the recipe's config.yaml turned on, one line each."""
    if is_on(config.get("use_liger_kernel")) and not is_on(training.get("use_liger_kernel")):
        return ["the CPU profile turns use_liger_kernel off: Liger's kernels are Triton kernels, which need a GPU"]
    return []


def smoke_checkpointing(config: dict, accelerate: dict | None = None) -> tuple[dict, dict]:
    """(training overrides, Accelerate launch overrides) that keep a smoke run checkpointing every layer, as every
    recipe's smoke metrics were recorded, where its GPU default turns checkpointing off (the speed settings `plan
    --fastest` chose for the recipe's GPUs), by whoever checkpoints in that recipe (`Checkpointing.by`, launch.config.
    training_args: FSDP's own for fsdp2, as it recorded them; transformers' where `config` trains an adapter, which
    FSDP's would save empty). Nothing where the recipe checkpoints already. `config` is the recipe's config.yaml, with
    `use_peft: true` where the run turns an adapter on after `--` (launch.run.resolve)."""
    ckpt = checkpointing(config, accelerate)
    # A partial setting (`checkpointing_layers`: the first k of the GPU model's layers) counts that model's layers;
    # the smoke model checkpoints every one of its own, as recorded (the losses are the same either way).
    every = {"checkpointing_layers": smoke.SMOKE_SPEC["model"]["num_hidden_layers"]} if ckpt.layers else {}
    if ckpt.on:
        return every, {}
    if ckpt.by == "FSDP":
        return {}, {FSDP_CHECKPOINTING: True}
    return {"activation_checkpointing": True}, {}


def profile_name(smoke_run: bool, cpu: bool) -> str:
    return f"{'smoke' if smoke_run else 'full'}-{'cpu' if cpu else 'gpu'}"


def training_overrides(config: dict, smoke_run: bool, cpu: bool, progress=print, accelerate: dict | None = None,
                       bf16: bool = False) -> dict:
    """The profile's training arguments. `accelerate`: the recipe's Accelerate config (who checkpoints, for
    `smoke_checkpointing`; None: not FSDP). `bf16`: the run computes in bf16 (a GPU run's default; on CPU only when
    asked for with `-- --bf16 true`): a smoke run then loads the smoke model's bf16 copy (`smoke.ensure_bf16_model`),
    as a real run loads a bf16 checkpoint, so that a recipe loading it in fp32 and one loading it in bf16 start
    equal."""
    out: dict = {}
    if smoke_run:
        try:
            assets = smoke.ensure_smoke_assets(progress=progress)
        except OSError as e:
            raise LaunchError(
                f"The smoke model and data cannot be built in {smoke.smoke_dir()} ({e.strerror or e}): that folder "
                f"is under RECIPES_CACHE ({smoke.cache_root()}, default ~/.cache/llm-recipes). Set RECIPES_CACHE to "
                "a folder you can write to, e.g. `RECIPES_CACHE=/tmp/llm-recipes`.") from None
        out.update(SMOKE_TRAINING)
        out["model_name_or_path"] = smoke.ensure_bf16_model(progress=progress) if bf16 else assets["model"]
        out["dataset_name"] = assets["data"]
        # the recipe's own load dtype (its precision: fp32 masters or not, launch.config.precision), fp32 on CPU
        # (CPU_FP32)
        if config.get("join_documents_min_chars"):  # the smoke data are chats, not documents to join
            out["join_documents_min_chars"] = 0
        if is_on(config.get("packing")) and config.get("packing_strategy", "bfd") != "wrapped":
            # The smoke metrics were recorded on padded batches, before the recipes packed (bfd): packed, the same
            # 12 steps would see other rows. Packing itself is proven by tests/test_packing.py (conversations kept
            # apart, the loss of padded batches); the ALST recipes' wrapped packing stays, as recorded.
            out["packing"] = False
        out.update(smoke_checkpointing(config, accelerate)[0])
        if Adapter.from_training(config) is not None:
            # LoRA dropout draws a random mask per rank and micro-batch, so layouts with equal tokens per step (2
            # processes, 1 process x accumulation 2, ZeRO-3) would train differently; the smoke run is deterministic.
            out["lora_dropout"] = 0.0
    if cpu:
        out.update(CPU_TRAINING)
        if not bf16:
            out.update(CPU_FP32)
        if config.get("load_in_4bit"):
            # QLoRA's base stays in bf16 on CPU: FSDP1 flattens one dtype per unit, so the 4-bit storage and the
            # base's other weights (norms, embeddings) share one dtype, the recipe's (bf16 without autocast unless
            # the run asks for it).
            out["dtype"] = "bfloat16"
            if config.get("bnb_4bit_quant_storage"):
                out["bnb_4bit_quant_storage"] = "bfloat16"
        if config.get("attn_implementation") in CUDA_ONLY_ATTENTION:
            out["attn_implementation"] = "sdpa"
    return out


def as_argv(values: dict) -> list[str]:
    """`--key value` pairs as the ranks' parser reads them (booleans as true/false, a dict as JSON, which transformers
    reads for its dict fields): the one writer of training argv (the profiles, the launcher's options, `--fastest`)."""
    argv: list[str] = []
    for key, value in values.items():
        if value is not None:
            argv += [f"--{key}", json.dumps(value) if isinstance(value, dict) else
                     ("true" if value else "false") if isinstance(value, bool) else str(value)]
    return argv


# Reading training argv back (the arguments after `--`, a recorded invocation's), as TRL's parser reads them.
def argument_pairs(argv: list[str]) -> list[tuple[str, list[str]]]:
    """Training arguments as (key, the tokens that give it), in order: `--key value ...`, `--key=value` and a bare
    `--flag` (its tokens include the key itself)."""
    pairs: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            pairs.append((token[2:].split("=", 1)[0], [token]))
        elif pairs:
            pairs[-1][1].append(token)
    return pairs


def argument_values(tokens: list[str]) -> list[str]:
    """The values of one argument's tokens (`argument_pairs`): `--key=v` gives [v], `--key a b` gives [a, b]."""
    first, rest = tokens[0], tokens[1:]
    return ([first.split("=", 1)[1]] if "=" in first else []) + rest


def flag_on(tokens: list[str]) -> bool:
    """Whether a boolean argument's tokens turn it on, as TRL's parser reads them: a bare `--flag` is true."""
    values = argument_values(tokens)
    return is_on(values[-1]) if values else True


def shown(value) -> str:
    """A value as training argv writes it (`as_argv`: booleans as true/false)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def same_values(given: list[str], recorded: list) -> bool:
    """Whether argument values are the same (numbers compared as numbers, switches as switches): `4` and `4.0`,
    `true` and True."""
    def norm(value):
        text = shown(value).strip().lower()
        try:
            return float(text)
        except ValueError:
            return is_on(text) if text in ("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n") else text
    return [norm(v) for v in given] == [norm(v) for v in recorded]
