# Canonical recipe train script. Every recipes/*/train.py is a byte-identical copy of this file, checked by
# tests/test_recipe_layout.py; edit this one and run `python -m launch sync-scripts` to update the others.
"""Supervised fine-tuning with TRL's SFTTrainer, launched by `accelerate launch`.

Run it the way the recipe README shows, for example:

    accelerate launch --config_file accelerate_configs/zero3.yaml \
        recipes/zero3/train.py --config recipes/zero3/config.yaml

Everything distributed (DDP, DeepSpeed ZeRO, FSDP2, context or sequence parallelism) comes from the Accelerate
config; everything about training comes from the TRL `--config` YAML and the command line. The script itself
is the same for every recipe: it is adapted from TRL's `trl/scripts/sft.py`.
"""

from dataclasses import dataclass, field


@dataclass
class RecipeArguments:
    accelerate_config: str | None = field(
        default=None,
        metadata={"help": "Accelerate config this recipe is launched with (read by `python -m launch`)."},
    )


def main(script_args, training_args, model_args, recipe_args):
    from accelerate.logging import get_logger
    from datasets import load_dataset
    from trl import SFTTrainer, get_peft_config, get_quantization_config

    logger = get_logger(__name__)
    if training_args.use_cpu:
        # CPU-only workarounds (gloo collectives, attention for context parallelism on CPU), each documented in
        # launch/cpu/. Never imported on GPU; needs this repository installed (`pip install -e .`).
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

    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)

    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # trainer_state.json (the per-step log_history) next to the weights, not only inside checkpoints.
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    trainer.end()


def make_parser():
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    return TrlParser((ScriptArguments, SFTConfig, ModelConfig, RecipeArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
