# Copied from templates/train.py [sections: none]
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

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # trainer_state.json (the per-step log_history) next to the weights, not only inside checkpoints.
    trainer.save_state()
    if recipe_args.save_final and not recipe_args.synthetic:  # random weights are not worth saving
        # The tokenizer and, gathered from ZeRO-3 / FSDP shards (or consolidated from them): the full weights, loadable
        # by plain transformers; or, for a LoRA / QLoRA run (`use_peft`), only the adapter in PEFT's files
        # (adapter_config.json, which names the base, and adapter_model.safetensors): load it with PEFT on its base, or
        # merge it into the base's weights with `python -m launch merge OUTPUT_DIR`.
        final_dir = os.path.join(training_args.output_dir, "final")
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
