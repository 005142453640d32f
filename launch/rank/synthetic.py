"""Synthetic runs (`synthetic: true` in train.py's RecipeArguments): the recipe's real architecture with random
weights, fed random token rows of exactly `max_length` tokens, through the recipe's real SFTTrainer and distributed
setup. Nothing is downloaded or read but the model's `config.json`: no weights, no tokenizer, no dataset. For
throughput and memory benchmarks (`--bench`), and to try a layout on a machine that has none of the inputs.

Imported by train.py only when `synthetic` is set (as it imports `launch.cpu` only on CPU); no import of the
launcher's other modules.

- Model: `AutoConfig.from_pretrained(model_name_or_path)` (a folder holding only config.json is enough), with the
  run's `model_init_kwargs` that are config attributes applied as `from_pretrained` would (e.g. the recipe's RoPE
  scaling), then `AutoModelForCausalLM.from_config` in the training dtype and attention kernel. The weights are
  created and initialised directly on the rank's GPU (a `torch.device` context: no host copy, initialisation at
  GPU speed); under DeepSpeed ZeRO-3 transformers builds the model inside `deepspeed.zero.Init`, each rank
  creating only its shard. On CPU (`use_cpu`) on the CPU. Seeded with the run's seed. The ranks' initial weights
  agree as the strategy makes them (DDP, DeepSpeed and Accelerate's FSDP2 loading broadcast rank 0's). Under FSDP2
  every rank holds the whole model on its GPU until Accelerate shards it (after its fp32 upcast of bf16 weights:
  4 bytes per parameter, 32 GB for an 8B model, briefly), where a real checkpoint is read by rank 0 only.
- Data: a `datasets.Dataset` whose rows are generated when read (`set_transform`): row i is `max_length` token ids
  drawn uniformly from the model's vocabulary by a generator seeded with (seed, i). So it costs no memory whatever
  its length (a 3.7M-token ALST row is made when the sampler asks for it), and every rank reading row i sees the
  same tokens. The column is `input_ids` (TRL's tokenized format), stored as the row index until read.
- No tokenizer: TRL 1.16's SFTTrainer refuses `processing_class=None` for a model instance (it would load one with
  `AutoProcessor.from_pretrained`, which needs tokenizer files) and reads the pad token from it, so
  `null_tokenizer` builds a one-token tokenizer in memory (`<pad>`, the config's pad id, else its eos id, else 0),
  and `dataset_kwargs.skip_prepare_dataset` tells TRL the rows are already tokenized (no chat template, no
  truncation, no packing: rows are already exactly max_length; labels = input_ids, every token trained).

Loss at the first step: about ln(vocab_size) (random weights, uniform tokens: 11.93 for Qwen3's 151,936).
"""

from __future__ import annotations

import math
import os
import time

# model_init_kwargs that tell `from_pretrained` how to load, not what the model is; every other key is a config
# attribute (e.g. rope_parameters), which from_pretrained would set on the config.
LOADING_KEYS = frozenset({
    "dtype", "torch_dtype", "attn_implementation", "device_map", "revision", "trust_remote_code",
    "quantization_config", "low_cpu_mem_usage", "use_kernels", "experts_implementation", "max_memory",
    "offload_folder", "offload_state_dict", "use_safetensors", "cache_dir", "local_files_only", "token",
    "subfolder", "variant", "key_mapping", "tp_plan", "tp_size", "allow_all_kernels",
})
DEFAULT_STEPS = 100  # rows for this many optimizer steps when the run sets no max_steps
PAD_TOKEN = "<pad>"


def load_config(model_name_or_path: str, model_init_kwargs: dict | None = None, trust_remote_code: bool = False,
                revision: str | None = None):
    """The model's config from its config.json, with the run's config overrides applied (as from_pretrained)."""
    from transformers import AutoConfig

    overrides = {k: v for k, v in (model_init_kwargs or {}).items() if k not in LOADING_KEYS}
    kwargs = {"trust_remote_code": trust_remote_code}
    if revision:
        kwargs["revision"] = revision
    return AutoConfig.from_pretrained(model_name_or_path, **kwargs, **overrides)


def resolve_dtype(dtype, config):
    import torch

    if dtype in (None, "auto"):
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def build_model(config, dtype=None, attn_implementation: str | None = None, use_cpu: bool = False):
    """Random weights for `config`, built in `dtype` on this rank's GPU (ZeRO-3: partitioned by zero.Init; CPU runs:
    on the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    kwargs = {"dtype": resolve_dtype(dtype, config)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if use_cpu or not torch.cuda.is_available() or is_deepspeed_zero3_enabled():
        # ZeRO-3: transformers' from_config enters deepspeed.zero.Init, which places each rank's shard on its GPU
        return AutoModelForCausalLM.from_config(config, **kwargs)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    with device:
        return AutoModelForCausalLM.from_config(config, **kwargs)


def token_rows(num_rows: int, length: int, vocab_size: int, seed: int = 0):
    """A `datasets.Dataset` of `num_rows` rows of exactly `length` uniform random token ids in [0, vocab_size),
    generated when read: row i depends only on (seed, i)."""
    import numpy as np
    from datasets import Dataset

    def generate(batch):
        return {"input_ids": [np.random.default_rng((seed, int(i))).integers(0, vocab_size, length, dtype=np.int64)
                              for i in batch["input_ids"]]}

    rows = Dataset.from_dict({"input_ids": list(range(num_rows))})
    rows.set_transform(generate)
    return rows


def null_tokenizer(pad_token_id: int):
    """The smallest tokenizer TRL's SFTTrainer accepts: one token, `<pad>`, with id `pad_token_id`; it never
    tokenizes anything (the rows are token ids already)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab={PAD_TOKEN: int(pad_token_id)}, unk_token=PAD_TOKEN)),
        pad_token=PAD_TOKEN,
    )
    return tokenizer


def pad_id(config) -> int:
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None and 0 <= int(value) < config.vocab_size:
            return int(value)
    return 0


def default_rows(training_args) -> int:
    """Rows for max_steps optimizer steps of every process (or DEFAULT_STEPS without max_steps); an upper bound
    under CP/SP, where the processes of a group share rows. Rows cost nothing until read."""
    steps = training_args.max_steps if training_args.max_steps and training_args.max_steps > 0 else DEFAULT_STEPS
    per_step = (training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
                * int(os.environ.get("WORLD_SIZE", "1")))
    return steps * per_step


def prepare(model_args, training_args, script_args, rows: int | None = None, log=None):
    """What train.py hands SFTTrainer in a synthetic run: (model, {split: dataset}, tokenizer). Also tells TRL that
    the rows are tokenized (dataset_kwargs.skip_prepare_dataset) and drops model_init_kwargs, which were applied to
    the config here (TRL ignores them for a model instance, with a warning)."""
    if log is None:
        from accelerate import PartialState

        log = PartialState().print  # the main process only
    if not training_args.max_length:
        raise ValueError("synthetic rows are exactly max_length tokens: set max_length.")
    from transformers import set_seed

    set_seed(training_args.seed)  # the same random weights run after run (the Trainer seeds again afterwards)
    started = time.perf_counter()
    config = load_config(model_args.model_name_or_path, training_args.model_init_kwargs,
                         trust_remote_code=training_args.trust_remote_code, revision=model_args.model_revision)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    model = build_model(config, model_args.dtype, model_args.attn_implementation, use_cpu=training_args.use_cpu)
    built = time.perf_counter() - started
    training_args.model_init_kwargs = None
    training_args.dataset_kwargs = {**(training_args.dataset_kwargs or {}), "skip_prepare_dataset": True}
    rows = rows or default_rows(training_args)
    dataset = {
        script_args.dataset_train_split: token_rows(rows, training_args.max_length, text_config.vocab_size,
                                                    training_args.seed),
        script_args.dataset_test_split: token_rows(max(1, training_args.per_device_eval_batch_size),
                                                   training_args.max_length, text_config.vocab_size,
                                                   training_args.seed + 1_000_003),
    }
    first = next(model.parameters())
    partitioned = hasattr(first, "ds_numel")  # built inside deepspeed.zero.Init (ZeRO-3)
    n_params = sum(p.ds_numel if partitioned else p.numel() for p in model.parameters())
    where = "partitioned by ZeRO-3 as built" if partitioned else f"on {first.device}"
    vocab = text_config.vocab_size
    log(f"synthetic: {type(model).__name__} from {model_args.model_name_or_path}/config.json, "
        f"{n_params / 1e6:,.1f}M parameters, random weights in {first.dtype} {where}, {built:.1f} s; {rows} rows "
        f"of {training_args.max_length} random tokens (vocabulary {vocab}: first loss about {math.log(vocab):.2f})")
    return model, dataset, null_tokenizer(pad_id(text_config))
