# Copied from templates/train.py [sections: tiled-mlp, ulysses-resume]
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
    tiled_mlp: bool = field(
        default=False,
        metadata={
            "help": "ALST's tiled MLP: run every dense decoder MLP through DeepSpeed's `TiledMLP`, which computes it "
            "over the sequence in tiles and recomputes each tile in the backward, so the MLP's intermediate "
            "activations exist for one tile at a time. Needs DeepSpeed (ZeRO stage 1-3): TiledMLP accumulates each "
            "weight's gradient over the tiles and marks it ready for ZeRO after the last one; DDP and FSDP would "
            "reduce the first tile's partial gradient."
        },
    )
    tiled_mlp_shards: int | None = field(
        default=None,
        metadata={
            "help": "Tiles per MLP call with `tiled_mlp`. Default: ceil(local sequence length / hidden size), as in "
            "ALST, the largest value over all ranks."
        },
    )
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

    # ---- ALST (Arctic Long Sequence Training) memory features: recipes/alst-ulysses-* --------------------------
    # - Ulysses sequence parallelism: the Accelerate config (parallelism_config_sp_*), nothing here.
    # - Tiled loss: nothing here either. TRL's SFTTrainer computes the loss through a fused LM head, in tiles of
    #   tokens x vocabulary, without materialising the logits (also under sequence parallelism, which refuses the
    #   custom losses and label smoothing that would need full logits).
    # - Activation-checkpoint offload to CPU: nothing here either. transformers does it with
    #   `gradient_checkpointing_kwargs: {offload: true}`: each checkpointed layer's input waits in pinned host memory
    #   until the backward (only that input passes through its hook, so it works with ZeRO-3, unlike TRL's
    #   `activation_offloading`, whose global hooks break TRL's fused loss there).
    # - Tiled MLP: `tiled_mlp` below.
    if recipe_args.tiled_mlp:
        tile_mlps(trainer, recipe_args.tiled_mlp_shards)

    # `python -m launch` watches the ranks from outside: per-rank heartbeats (a rank that stops making progress is
    # named and the job stopped) and, with --bench, step times, tokens and memory. It asks through LAUNCH_MONITOR_DIR;
    # under plain `accelerate launch` nothing is added.
    if os.environ.get("LAUNCH_MONITOR_DIR"):
        from launch.rank.monitor import add_callbacks

        add_callbacks(trainer)

    pc = trainer.accelerator.parallelism_config
    if training_args.resume_from_checkpoint and pc is not None and pc.sp_enabled:
        resume_sequence_parallel_exactly()

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


# ---- ALST: tiled MLP (used by main when `tiled_mlp` is set) ----------------------------------------------------
def tile_mlps(trainer, shards: int | None) -> None:
    """Route every dense decoder MLP (`*.mlp` with gate_proj, up_proj, down_proj) through DeepSpeed's `TiledMLP`."""
    import math
    import types

    import torch
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    if not trainer.is_deepspeed_enabled:
        raise ValueError("`tiled_mlp` needs DeepSpeed (ZeRO stage 1-3); see the tiled_mlp help above.")

    def tiled_forward(mlp, x):
        n = shards
        if n is None:
            n = math.ceil(x.shape[-2] / x.shape[-1])
            if dist.is_initialized():
                # ZeRO-3 gathers the MLP weights on every call, so all ranks must make the same number of calls
                n_max = torch.tensor(n, device=x.device)
                dist.all_reduce(n_max, op=dist.ReduceOp.MAX)
                n = int(n_max.item())
        # The class's own forward, one tile at a time
        return TiledMLP.apply(type(mlp).forward, mlp, x, n, list(mlp.parameters()))

    mlps = [
        module
        for name, module in trainer.model.named_modules()
        if name.endswith(".mlp") and all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj"))
    ]
    if not mlps:
        model_class = type(trainer.model).__name__
        raise ValueError(f"`tiled_mlp`: no dense MLP (gate_proj, up_proj, down_proj) in {model_class}.")
    for mlp in mlps:
        mlp.forward = types.MethodType(tiled_forward, mlp)


# ---- Exact resume under Ulysses SP (used by main when a sequence-parallel run resumes) ----------------------------
def resume_sequence_parallel_exactly() -> None:
    """Let the Trainer skip the batches a resumed sequence-parallel run has already trained on.

    The Trainer skips them with accelerate's `skip_first_batches(dataloader, n)`, which reads `dataloader.dataset`;
    under Ulysses SP the dataloader is DeepSpeed's `UlyssesSPDataLoaderAdapter`, which has none ("object has no
    attribute 'dataset'"). The adapter turns one batch of its inner loader on each SP rank into sp micro-batches (the
    group's samples, one after the other, each sharded over the group), so n micro-batches are n // sp inner batches
    and n % sp micro-batches of the next refill: skip the former in the inner loader (accelerate's own skip), draw
    the latter, and every SP rank continues on the sample shard it would have seen.
    """
    import transformers.trainer as hf_trainer
    from accelerate import skip_first_batches
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    def skip(dataloader, num_batches):
        if not isinstance(dataloader, UlyssesSPDataLoaderAdapter):
            return skip_first_batches(dataloader, num_batches)
        inner, rest = divmod(num_batches, dataloader.sp_world_size)
        resumed = UlyssesSPDataLoaderAdapter(
            skip_first_batches(dataloader.dl, inner),
            sp_rank=dataloader.sp_rank,
            sp_group=dataloader.sp_group,
            sp_world_size=dataloader.sp_world_size,
            device=dataloader.device,
        )
        for _ in range(rest):
            next(resumed)
        return resumed

    hf_trainer.skip_first_batches = skip


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
