"""Activation checkpointing: one name for it, and not both FSDP's and the training arguments'.
"""

from __future__ import annotations

import json


from launch.checks.rules.registry import Facts, rule
from launch.config.adapter import Adapter
from launch.config.training_args import alias_ignored

@rule(doc=(
    "checkpointing under one name: `activation_checkpointing*`, or only the deprecated `gradient_checkpointing*`",
    "transformers ignores `gradient_checkpointing*` without a word when `activation_checkpointing*` is set"))
def checkpointing_one_name(setup, facts: Facts):
    # transformers 5.23 TrainingArguments.__post_init__: the deprecated name is used only when the new one is unset
    problems = []
    for old, new, where in alias_ignored(setup.training, setup.explicit):
        problems.append(
            f"`{old}` is given as {setup.training.get(old)!r} ({where}), but `{new}` is set to "
            f"{setup.training.get(new)!r} ({setup.explicit[new][1]}), and transformers ignores the "
            f"deprecated `{old}` whenever `{new}` is set: the run would use {setup.training.get(new)!r}. Give the "
            f"value under the current name instead, e.g. `-- --{new} "
            f"{_argv_value(setup.training.get(old))}`.")
    return "\n".join(problems) or None


def _argv_value(value) -> str:
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


@rule(feature="context_parallel", doc=(
    "`activation_checkpointing: false` when the FSDP config checkpoints (`fsdp_activation_checkpointing: true`)",
    "Trainer: \"`fsdp_config['activation_checkpointing']` (FSDP's own activation checkpointing) and the "
    "`activation_checkpointing` training argument can't both be set to True. ...\""))
def checkpointing_not_twice(setup, facts: Facts):
    ckpt = setup.checkpointing  # transformers' and FSDP's, read once (launch.config.training_args.checkpointing)
    if Adapter.from_training(setup.training) is not None:
        # an adapter cannot use FSDP's checkpointing at all, and keeps transformers': that refusal
        # (rules.adapter_with_fsdp_activation_checkpointing) says the one fix, not this one's two
        return None
    if ckpt.fsdp and ckpt.enabled:
        where = setup.explicit.get(ckpt.name, (0, "TRL's default"))[1]
        return (
            "FSDP activation checkpointing (fsdp_activation_checkpointing in the Accelerate config) and activation "
            f"checkpointing in the training arguments (`{ckpt.name}: true`, from {where}) cannot both be on "
            "(transformers refuses it; TRL's SFTConfig defaults gradient_checkpointing to true). Pass "
            "`-- --activation_checkpointing false` (or set `activation_checkpointing: false` in config.yaml; the "
            "current name wins over the deprecated `gradient_checkpointing`), or set "
            "`fsdp_activation_checkpointing: false` in the Accelerate config."
        )
    return None


@rule()
def checkpointing_layers_with_checkpointing(setup, facts: Facts):
    # `checkpointing_layers` (templates/train.py's RecipeArguments) limits whoever checkpoints to the first k layers
    # (launch/rank/partial_checkpointing.py): without checkpointing it would silently do nothing
    ckpt = setup.checkpointing
    if ckpt.layers is None:
        return None
    where = setup.explicit.get("checkpointing_layers", (0, "the training arguments"))[1]
    if ckpt.layers < 1:
        return (f"`checkpointing_layers: {ckpt.layers}` ({where}): the number of decoder layers to checkpoint is 1 "
                "or more (leave it unset to checkpoint all of them, or turn checkpointing off with "
                "`activation_checkpointing: false`).")
    if not ckpt.on and setup.explicit.get("checkpointing_layers", (0, ""))[0] >= setup.explicit.get(
            "activation_checkpointing", (0, ""))[0]:
        # k given where checkpointing is off already, or after it (`-- --checkpointing_layers 3`): it would do
        # nothing. A recipe's k (config.yaml) or a profile's that a later layer turned moot by turning checkpointing
        # off (`-- --activation_checkpointing false`) is what that layer asked for: no layer checkpointed.
        return (f"`checkpointing_layers: {ckpt.layers}` ({where}) limits checkpointing to the first "
                f"{ckpt.layers} decoder layers, but this run checkpoints none: turn it on (`-- "
                "--activation_checkpointing true`, or `fsdp_activation_checkpointing: true` in an FSDP2 config), or "
                "leave checkpointing_layers unset.")
    if ckpt.fsdp and int((setup.accelerate.get("fsdp_config") or {}).get("fsdp_version") or 1) != 2:
        return (f"`checkpointing_layers: {ckpt.layers}` ({where}) with FSDP1's own checkpointing "
                "(fsdp_activation_checkpointing): Accelerate wraps every layer inside `prepare_model` there, which "
                "the ranks cannot limit; use FSDP2 (fsdp_version: 2), or transformers' checkpointing "
                "(`activation_checkpointing: true`, `fsdp_activation_checkpointing: false`).")
    return None


@rule(needs_model=True, applies=lambda setup: (setup.checkpointing.layers or 0) > 0)
def checkpointing_layers_within_the_model(setup, facts: Facts):
    layers = int(getattr(facts.model_config, "num_hidden_layers", 0) or 0)
    k = setup.checkpointing.layers
    if layers and k > layers:
        where = setup.explicit.get("checkpointing_layers", (0, "the training arguments"))[1]
        return (f"`checkpointing_layers: {k}` ({where}) is more than the model's {layers} decoder layers "
                f"(num_hidden_layers in {setup.training.get('model_name_or_path')}'s config.json): give 1 to "
                f"{layers}, or leave it unset to checkpoint all of them.")
    return None
