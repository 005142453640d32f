"""Long context: the positions the model covers (RoPE) and the memory the run needs on this machine.
"""

from __future__ import annotations

import math


from launch.checks.rules.registry import Facts, rule
from launch.facts import hub

def rope_coverage(setup, config) -> tuple[int | None, str]:
    """How many positions the run's model covers, and what says so: RoPE scaling the run sets through
    model_init_kwargs (factor x original positions), else the model's max_position_embeddings (which already
    includes the model's own scaling, e.g. Llama-3.1's 131,072)."""
    init = setup.training.get("model_init_kwargs") or {}
    run = init.get("rope_parameters") or init.get("rope_scaling") or {}
    positions = getattr(config, "max_position_embeddings", None) if config is not None else None
    if run.get("rope_type", "default") not in ("default", None) and run.get("factor"):
        original = run.get("original_max_position_embeddings") or positions
        over = f" over {original:,} positions" if original else ""
        return (int(float(run["factor"]) * original) if original else None,
                f"the run's {run['rope_type']} RoPE scaling (x{float(run['factor']):g}{over})")
    return positions, "the model's max_position_embeddings"


@rule(needs_model=True, feature="long_context", applies=lambda setup: bool(setup.training.get("max_length")), doc=(
    "`max_length` within the positions the model covers, or RoPE scaling in `model_init_kwargs.rope_parameters` "
    "that covers it",
    "the model sees positions it was never trained on; the loss starts far higher (TRL PR #6846: 10.6 instead of "
    "4.4 at 1M tokens without YaRN)"))
def rope_covers_length(setup, facts: Facts):
    length = int(setup.training["max_length"])
    covered, source = rope_coverage(setup, facts.model_config)
    if not covered or length <= covered:
        return None
    rope = hub.rope_parameters(facts.model_config)
    positions = getattr(facts.model_config, "max_position_embeddings", covered)
    factor = max(2, 1 << math.ceil(math.log2(length / positions)))  # the next power of two
    theta = rope.get("rope_theta")
    return (f"max_length {length:,} is beyond the {covered:,} positions {source} covers "
            f"({setup.training.get('model_name_or_path')}): the model would see positions it was never trained on "
            "(TRL PR #6846 measured a first loss of 10.6 instead of 4.4 at 1M tokens without RoPE scaling). Set RoPE "
            "scaling that covers it in config.yaml, for example YaRN:\n"
            "  model_init_kwargs:\n    rope_parameters:\n      rope_type: yarn\n"
            + (f"      rope_theta: {theta:g}\n" if theta else "")
            + f"      factor: {float(factor):g}\n      original_max_position_embeddings: {positions}\n"
            f"(x{factor} over {positions:,} positions covers {factor * positions:,}), or lower max_length.")


@rule(machine=True, feature="long_context", doc=(
    "offloaded activations and optimizer state fit the node's host memory",
    "the host runs out of (pinned) memory mid-run: the kernel kills a rank, or pinning fails"))
def host_memory_fits(setup, facts: Facts):
    plan = facts.memory
    if plan is None or plan.target.host_memory_gib is None or setup.options.cpu:
        return None
    need, have = plan.estimate.host_per_node_gib, plan.target.host_memory_gib
    if need <= have:
        return None
    terms = ", ".join(f"{t.name} {t.gib:.1f} GiB" for t in plan.estimate.host_terms if t.gib >= 0.05)
    return (f"This run needs {need:.1f} GiB of host memory per node ({plan.layout.processes_per_machine} processes, "
            f"each: {terms}; pinned blocks rounded up to powers of two) and this machine has {have:.1f} GiB. Lower "
            "max_length, turn off `offload` in activation_checkpointing_kwargs (if the GPUs can hold the "
            "checkpoints), or use a machine with more memory; `python -m launch plan RECIPE --host-memory GIB` "
            "shows the table. --force starts it anyway.")


@rule(machine=True, doc=("the planner's peak memory per GPU within the GPU's memory",
                         "CUDA out of memory, after the model has loaded"))
def gpu_memory_fits(setup, facts: Facts):
    plan = facts.memory
    if plan is None or setup.options.cpu or facts.gpu_count == 0:
        return None
    est, have = plan.estimate, plan.target.gpu_memory_gib
    if est.gpu_peak_gib <= have:
        return None
    return (f"The planner predicts {est.gpu_peak_gib:.1f} GiB per GPU and the GPUs here have {have:.1f} GiB: "
            f"{est.advice()} The table above has every term; `python -m launch plan {setup.recipe.name} "
            "--max-length auto` finds the longest length that fits. --force starts it anyway (the prediction is a "
            "model, checked against published runs within 15%).")
