# Copied from templates/train.py [sections: fsdp1-adapter, sharded-final-save]
# (`python -m launch sync-scripts` keeps it equal to the template; delete these two lines to fork it)
"""Supervised fine-tuning with TRL's SFTTrainer, launched by `accelerate launch`.

Run it the way the recipe README shows, for example:

    accelerate launch --config_file accelerate_configs/zero3.yaml \
        recipes/zero3/train.py --config recipes/zero3/config.yaml

Everything distributed (DDP, DeepSpeed ZeRO, FSDP2, context or sequence parallelism) comes from the Accelerate
config; everything about training comes from the TRL `--config` YAML and the command line. The script is adapted
from TRL's `trl/scripts/sft.py` and parses the same arguments, plus the recipe's own (RecipeArguments).

templates/train.py is the canonical script. Each recipe's train.py is a copy of it that holds only the optional
sections its configs turn on (ALST's tiled MLP, joined documents, exact resume under Ulysses SP, ...), written by
`python -m launch sync-scripts`: launch/recipe/sections.py says which config turns on which section. In the template
each section sits between `# begin section NAME` and `# end section NAME` lines; the copies leave those lines out.
"""

import os
from dataclasses import dataclass, field


@dataclass
class RecipeArguments:
    accelerate_config: str | None = field(default=None, metadata={
        "help": "Accelerate config this recipe is launched with (read by `python -m launch`)."})
    synthetic: bool = field(default=False, metadata={
        "help": "Benchmark without inputs (no weights, tokenizer or dataset read): config.json's architecture, "
        "random weights, rows of max_length random tokens, same SFTTrainer (launch/rank/synthetic.py); no final/."})
    synthetic_rows: int | None = field(default=None, metadata={
        "help": "Rows of a synthetic run (made when read). Default: enough for max_steps on every process."})
    save_final: bool = field(default=True, metadata={"help": "Save the final model in OUTPUT_DIR/final (--bench: no)."})
    checkpointing_layers: int | None = field(default=None, metadata={
        "help": "Checkpoint only the first k decoder layers (transformers' or FSDP2's checkpointing), the others keep "
        "their activations: less recomputation, more memory. Default: all. launch/rank/partial_checkpointing.py."})


def main(script_args, training_args, model_args, dataset_args, recipe_args):
    from accelerate.logging import get_logger
    from datasets import load_dataset
    from trl import SFTTrainer, get_dataset, get_peft_config, get_quantization_config

    logger = get_logger(__name__)
    if training_args.use_cpu:
        # CPU-only workarounds (gloo collectives, attention for context parallelism on CPU), each documented in
        # launch/cpu/. Never imported on GPU; needs this repository importable (`python -m launch` puts its checkout
        # on the ranks' PYTHONPATH; under plain `accelerate launch`: `pip install -e .` or PYTHONPATH).
        from launch.cpu import enable_cpu_path

        enable_cpu_path(training_args)
    logger.info(f"recipe launched with accelerate config {recipe_args.accelerate_config}", main_process_only=True)

    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs

    if recipe_args.synthetic:
        # Random weights for the model's architecture and random rows of exactly max_length tokens; only the model's
        # config.json is read (launch/rank/synthetic.py). Needs this repository importable, as launch.cpu does.
        from launch.rank.synthetic import prepare

        model, dataset, processing_class = prepare(model_args, training_args, script_args, recipe_args.synthetic_rows)
    else:
        model, processing_class = model_args.model_name_or_path, None  # SFTTrainer loads both
        # As TRL's sft.py: a `datasets:` mixture (DatasetMixtureConfig) wins over dataset_name.
        if dataset_args.datasets:
            if script_args.dataset_name:
                logger.warning("Both `datasets` and `dataset_name` are provided. The `datasets` argument will be used "
                               "to load the dataset and `dataset_name` will be ignored.")
            dataset = get_dataset(dataset_args)
        else:
            dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                                   streaming=script_args.dataset_streaming)

    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        processing_class=processing_class,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )

    if recipe_args.checkpointing_layers is not None:  # needs this repository importable, as launch.cpu does
        from launch.rank.partial_checkpointing import checkpoint_first_layers
        checkpoint_first_layers(trainer, recipe_args.checkpointing_layers)  # what upstream lacks: its docstring

    # `python -m launch` watches the ranks from outside: per-rank heartbeats (a rank that stops making progress is
    # named and the job stopped) and, with --bench, step times, tokens and memory. It asks through LAUNCH_MONITOR_DIR;
    # under plain `accelerate launch` nothing is added.
    if os.environ.get("LAUNCH_MONITOR_DIR"):
        from launch.rank.monitor import add_callbacks

        add_callbacks(trainer)

    if model_args.use_peft and getattr(trainer.accelerator.state.fsdp_plugin, "fsdp_version", None) == 1:
        find_adapter_under_fsdp1_wrappers()  # the adapter files written (checkpoints, final/) hold its tensors
        load_adapter_under_fsdp1_wrappers()  # and a resumed run loads them back

    # FSDP with SHARDED_STATE_DICT: the final save is launch/rank/consolidate.py's (transformers' writes no weights)
    save_sharded = sharded_final_save(trainer)

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # trainer_state.json (the per-step log_history) next to the weights, not only inside checkpoints.
    trainer.save_state()
    if recipe_args.save_final and not recipe_args.synthetic:  # random weights are not worth saving
        # The tokenizer and, gathered from ZeRO-3 / FSDP shards (or consolidated from them): the full weights, loadable
        # by plain transformers; or, for a LoRA / QLoRA run (`use_peft`), only the adapter in PEFT's files
        # (adapter_config.json, which names the base, and adapter_model.safetensors): load it with PEFT on its base, or
        # merge it into the base's weights with `python -m launch merge OUTPUT_DIR`.
        final_dir = os.path.join(training_args.output_dir, "final")
        if save_sharded:
            save_sharded(trainer, final_dir, adapter_only=model_args.use_peft)
        trainer.save_model(final_dir)  # under FSDP it writes weights only with FULL_STATE_DICT
        if trainer.accelerator.is_main_process:  # never "saved" without a tensor written (safetensors: all we write)
            from safetensors import safe_open
            names = [n for n in os.listdir(final_dir) if n.endswith(".safetensors")] if os.path.isdir(final_dir) else []
            if not any(safe_open(os.path.join(final_dir, n), framework="pt").keys() for n in names):
                raise RuntimeError(f"No weights in {final_dir}: transformers writes them under FSDP only with "
                                   "FULL_STATE_DICT (else: sharded-final-save), ZeRO-3 with zero3_save_16bit_model.")
        saved = "Adapter" if model_args.use_peft else "Model"
        trainer.accelerator.print(f"{saved} saved to {final_dir}.")
    # Every rank has finished saving before the process group goes away.
    trainer.accelerator.wait_for_everyone()
    trainer.end()


# ---- PEFT's adapter files under FSDP1 (used by main for a LoRA / QLoRA run under FSDP1: recipes/qlora-fsdp) --------
def find_adapter_under_fsdp1_wrappers() -> None:
    """Let PEFT find the adapter's tensors in the state dict FSDP1 gathers, so that the adapter files it writes (the
    final one and each checkpoint's) are not empty.

    PEFT 0.21.2 picks a state dict's adapter entries by the names of its LoRA layers (peft/tuners/tuners_utils.py
    `_get_tuner_state_dict_key_prefixes`, from `model.named_modules()`) and strips a leading `_fsdp_wrapped_module.`
    only. FSDP1 nests one wrapper per unit (every decoder layer, every LoRA layer), so those names carry it in the
    middle (`...layers.0._fsdp_wrapped_module.self_attn.q_proj.lora_A`) while the gathered state dict's keys do not:
    nothing matches, and adapter_model.safetensors is written without a tensor, silently. FSDP2 has no wrappers."""
    import peft.tuners.tuners_utils as tuners_utils

    prefixes = tuners_utils._get_tuner_state_dict_key_prefixes

    def without_wrappers(model, adapter_name=None):
        return {p.replace("_fsdp_wrapped_module.", "") for p in prefixes(model, adapter_name)}

    tuners_utils._get_tuner_state_dict_key_prefixes = without_wrappers


def load_adapter_under_fsdp1_wrappers() -> None:
    """Load a checkpoint's adapter into the FSDP1-wrapped model when a run resumes (and at load_best_model_at_end),
    or stop: without this, a resumed run trains on from the adapter's initial weights with the restored optimizer
    state, silently (recipes/qlora-fsdp's CPU smoke model stopped at step 3: 0.28 off in loss at step 4).

    transformers 5.23's Trainer loads an FSDP checkpoint with accelerate 1.15's `load_fsdp_model(...,
    adapter_only=True)`, which reads the adapter's tensors (keys without the adapter's name) on every rank and hands
    them, with the FSDP1-wrapped model, to PEFT 0.21.2's `set_peft_model_state_dict`
    (accelerate/utils/fsdp_utils.py `_set_model_state_dict`). PEFT maps the keys to the model's for an unwrapped
    model only: it adds the adapter's name from the names of `model.state_dict()`, which FSDP1 returns empty on every
    rank but the first under the FULL_STATE_DICT config's rank0_only, and it drops the leading `base_model.model.`
    because the wrapper's own parameter names (`_fsdp_wrapped_module...._flat_param`) do not start with it. No key
    then names a parameter of the model, and its `load_state_dict(strict=False)` loads nothing; neither PEFT,
    accelerate nor transformers looks at the missing and unexpected keys. (accelerate PR #4206 mended the FSDP2 path
    of the same load; FSDP1's goes to PEFT as before. No upstream report of the FSDP1 case found.)

    Here: the same `load_state_dict` on the wrapped model, inside the same FSDP state-dict context (FSDP1 gathers
    each unit, copies in what the dict holds and shards it again), with the keys the model has: the adapter's name
    put back before each key's last part, as PEFT names a LoRA layer's tensors (`...q_proj.lora_A.weight` ->
    `...q_proj.lora_A.default.weight`). A key that names nothing in the model, or an adapter tensor the checkpoint
    lacks, stops the run. Any other load (not adapter-only, not FSDP1, not PEFT) is accelerate's own."""
    import accelerate.utils.fsdp_utils as fsdp_utils
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    upstream = fsdp_utils._set_model_state_dict

    def set_model_state_dict(model, state_dict, adapter_only=False, sd_options=None):
        if not (adapter_only and isinstance(model, FSDP) and fsdp_utils.is_peft_model(model)):
            return upstream(model, state_dict, adapter_only=adapter_only, sd_options=sd_options)
        adapter = model.active_adapter

        def model_key(key):
            module, _, tensor = key.rpartition(".")
            return f"{module}.{adapter}.{tensor}"

        result = model.load_state_dict({model_key(k): v for k, v in state_dict.items()}, strict=False)
        not_loaded = [k for k in result.missing_keys if f".{adapter}." in k]
        if result.unexpected_keys or not_loaded or not state_dict:
            raise RuntimeError(
                f"The checkpoint's adapter ({len(state_dict)} tensors) does not fit the FSDP1-wrapped model: keys "
                f"naming nothing in it {sorted(result.unexpected_keys)[:3]}, adapter tensors not in the checkpoint "
                f"{sorted(not_loaded)[:3]}.")
        return result

    fsdp_utils._set_model_state_dict = set_model_state_dict


# ---- FSDP's sharded final save (used by main when the FSDP plugin saves SHARDED_STATE_DICT) --------------------------
def sharded_final_save(trainer):
    """launch/rank/consolidate.py's `save_final` when the run's FSDP plugin saves SHARDED_STATE_DICT, else None.

    transformers 5.23's save_model writes weights under FSDP only with FULL_STATE_DICT, which gathers the whole model
    on the first process; with SHARDED_STATE_DICT it writes none. save_final has every rank write its shard, then the
    ranks consolidate the shards into safetensors files (a few GB per process at a time) that from_pretrained loads;
    a LoRA run's adapter is gathered alone. Imported here, before training: a run without this repository installed
    (`pip install -e .`) stops now rather than after training."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if plugin is None or "SHARDED_STATE_DICT" not in str(plugin.state_dict_type):  # transformers' own test
        return None
    from launch.rank.consolidate import save_final

    return save_final


def make_parser():
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser

    # TRL's sft.py parses the first four; RecipeArguments are this script's own
    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig, RecipeArguments))


if __name__ == "__main__":
    if os.environ.get("LAUNCH_MONITOR_DIR"):  # started by `python -m launch`, whose checkout is on PYTHONPATH
        # peft's unused eager import of bitsandbytes skipped while TRL's classes import (0.8 s per rank, and a
        # message asking for a package nothing needs): launch/rank/upstream_imports.py
        from launch.rank.upstream_imports import kept_out

        with kept_out():
            parser = make_parser()
    else:
        parser = make_parser()
    main(*parser.parse_args_and_config())
