"""Partial activation checkpointing: the first k of a model's L decoder layers checkpointed, the other L - k keep
their activations (`checkpointing_layers: k`, a field of templates/train.py's RecipeArguments; not set: all L).

Each layer left out trades its recomputation (about a third of its forward and backward time) for its full saved
activations instead of its input alone: the fastest setting that fits is the fewest checkpointed layers that fit
(`python -m launch plan RECIPE --fastest` searches k; launch/memory/estimate.py plans it).

Which k: the FIRST k (layers 0 .. k-1). Every kept activation, checkpointed inputs and full ones alike, is alive at
the end of the forward, so which layers are chosen does not change what is held there; it changes the backward. The
backward runs from the last layer down: with the first k checkpointed it goes through the L - k full layers first,
freeing their activations as it goes, and recomputes a layer only once they are all gone, so a recomputation never
sits on top of the full activations. With a later layer checkpointed (the last, say), its recomputation would come
first, on top of all of them: one layer's activations more at the peak.

Upstream, what it does not do:
- transformers 5.23 checkpoints every n-th layer (`activation_checkpointing_kwargs: {every_n_layers: n}`,
  `_set_gradient_checkpointing`): k = ceil(L / n) only, spread over the model, so a checkpointed layer near the end
  recomputes on top of the full activations. Here: the Trainer enables checkpointing on every layer when `train()`
  starts, and a callback then turns the flag (`GradientCheckpointingLayer.gradient_checkpointing`) off on the last
  L - k, before the first step.
- Accelerate 1.15 wraps every layer of the FSDP wrap policy in torch's `checkpoint_wrapper` (FSDP2:
  `fsdp2_apply_ac`, called from `Accelerator.prepare`), with no way to wrap fewer. Here: its function runs as it is
  and the wrappers (and `offload_wrapper`s) of all but the first k are taken off again, before `fully_shard`. FSDP1
  applies its wrapper inline in `prepare_model`: not supported (the launcher refuses it before the start).

Needs this repository importable on the ranks, as launch.cpu and launch.rank.synthetic do (imports nothing else of the
launcher).
"""

from __future__ import annotations


def checkpointed(layers: int, count: int) -> list[bool]:
    """Which of `layers` decoder layers are checkpointed when `count` of them are: the first `count` (see above)."""
    if not 0 < count <= layers:
        raise ValueError(f"`checkpointing_layers` is {count}; the model has {layers} decoder layers: give 1 to "
                         f"{layers} (or leave it unset: all of them)")
    return [i < count for i in range(layers)]


def decoder_layers(model) -> list:
    """The model's decoder layers in order: transformers' `GradientCheckpointingLayer` modules (a PEFT-wrapped model's
    too), which its checkpointing flags."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def keep_first(model, count: int) -> None:
    """After transformers' `activation_checkpointing_enable` (every layer flagged): only the first `count` layers
    stay checkpointed."""
    layers = decoder_layers(model)
    for layer, on in zip(layers, checkpointed(len(layers), count)):
        layer.gradient_checkpointing = layer.gradient_checkpointing and on


def _unwrap_all_but_first(model, count: int):
    """Take torch's checkpoint (and offload) wrappers off every wrapped layer after the first `count`."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    outermost: list[tuple[str, object]] = []
    for name, module in model.named_modules():  # in model order; an offload wrapper holds a checkpoint wrapper
        if isinstance(module, ActivationWrapper) and not any(name.startswith(f"{n}.") for n, _ in outermost):
            outermost.append((name, module))
    for (name, wrapper), on in zip(outermost, checkpointed(len(outermost), count)):
        if not on:
            inner = wrapper
            while isinstance(inner, ActivationWrapper):
                inner = inner._checkpoint_wrapped_module
            model.set_submodule(name, inner)
    return model


def checkpoint_first_layers(trainer, count: int) -> None:
    """Checkpoint only the first `count` decoder layers of `trainer`'s model, by whoever checkpoints in this run:
    transformers (`activation_checkpointing`) or FSDP2's own (`fsdp_activation_checkpointing`). Call it before
    `trainer.train()`."""
    from transformers import TrainerCallback

    checkpointed(len(decoder_layers(trainer.model)), count)  # refuse a count the model does not have, now
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    fsdp = plugin is not None and bool(plugin.activation_checkpointing)
    if fsdp:
        if int(getattr(plugin, "fsdp_version", 1) or 1) != 2:
            raise ValueError("`checkpointing_layers` with FSDP's own checkpointing needs FSDP2 (fsdp_version: 2)")
        import accelerate.accelerator as accelerator_module

        upstream = accelerator_module.fsdp2_apply_ac

        def first_layers_only(accelerator, model):
            return _unwrap_all_but_first(upstream(accelerator, model), count)

        accelerator_module.fsdp2_apply_ac = first_layers_only
    elif not trainer.args.activation_checkpointing:
        # k limits whoever checkpoints; with checkpointing turned off (a recipe's k, then `--activation_checkpointing
        # false` on the command line) there is nothing to limit. `python -m launch` refuses k given where checkpointing
        # is off already (launch/checks/rules/checkpointing.py); here it is only said.
        import warnings

        warnings.warn(f"checkpointing_layers {count} ignored: this run checkpoints no layer", stacklevel=2)
        return

    class FirstLayers(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            # after `train()` flagged every layer, before the first step
            if args.activation_checkpointing and model is not None:
                keep_first(model, count)

    trainer.add_callback(FirstLayers())
