"""A model's modules as the model itself names them: built from its config on the meta device (transformers'
`AutoModelForCausalLM.from_config` under `torch.device("meta")`: shapes only, no memory), so that what LoRA's
`target_modules` match (`launch.checks.rules.lora_targets_match`) and what the planner's Llama-style layer is checked
against (`launch.memory.plan`) are the real module names of any model type, not a table of known ones.

Cost: a fraction of a second per config (measured on this repository's CPU runner: 0.06-0.2 s for the Llama-3.1-8B,
Qwen3-8B and Qwen2.5-72B configs, 0.8 s for GPT-2 including its modelling module's first import), paid once per
config: `modules()` caches by the config's JSON. A config whose model cannot be built here (custom code, a missing
optional package) gives None: the callers then skip what they would check, and say so where it matters.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from launch.facts import hub

# PEFT's "all-linear" takes these (peft/tuners/tuners_utils.py `_maybe_include_all_linear_layers`: torch.nn.Linear and
# transformers' Conv1D); LoRA can also wrap these other layer kinds (peft/tuners/lora/model.py dispatchers).
LINEAR_KINDS = ("Linear", "Conv1D")
WRAPPABLE_KINDS = LINEAR_KINDS + ("Embedding", "Conv1d", "Conv2d", "Conv3d", "MultiheadAttention")
_LAYER_INDEX = re.compile(r"^.*?\.\d+\.")  # "model.layers.3." or "transformer.h.3.": the repeated block's prefix


@dataclass(frozen=True)
class Modules:
    """Every named module of a causal LM built from its config: name -> class name, in the model's order."""

    model_type: str
    kinds: dict  # full module name -> its class name (e.g. "model.layers.0.self_attn.q_proj" -> "Linear")
    output_layer: str | None  # the output embeddings' name (`get_output_embeddings()`), e.g. "lm_head"

    @property
    def linear(self) -> list[str]:
        """nn.Linear and Conv1D modules: what PEFT's "all-linear" chooses from (all but the output layer)."""
        return [name for name, kind in self.kinds.items() if kind in LINEAR_KINDS]

    def wrappable(self, name: str) -> bool:
        return self.kinds.get(name) in WRAPPABLE_KINDS

    def layer_linears(self) -> list[str]:
        """The linear modules of one repeated block, without its prefix ("self_attn.q_proj"), plus the linear modules
        outside the blocks under their full name ("lm_head"), in the model's order."""
        return list(dict.fromkeys(_LAYER_INDEX.sub("", name, count=1) for name in self.linear))


def modules(config) -> Modules | None:
    """The modules of the causal LM `config` describes (a transformers PretrainedConfig, or its config.json's fields as
    a dict or namespace), or None when it cannot be built here."""
    if not hasattr(config, "to_json_string"):
        config = _as_config(config)
        if config is None:
            return None
    if hub.architecture_problem(config):  # refused by its own rule (rules.model_architecture_valid); not built here:
        return None                       # 1000 layers of hidden size 10^6 take seconds even on the meta device
    try:
        key = config.to_json_string(use_diff=False)
    except Exception:  # noqa: BLE001 - a config that cannot be serialized is not cached, and not built
        return None
    if key not in _BUILT:
        _BUILT[key] = _build(config)
    return _BUILT[key]


_BUILT: dict[str, Modules | None] = {}  # config JSON -> its modules (a config object is not hashable)


def _as_config(fields):
    """config.json's fields (a dict or a namespace) as transformers' config of their model type."""
    from transformers import AutoConfig

    data = dict(fields) if isinstance(fields, dict) else dict(vars(fields))
    try:
        return AutoConfig.for_model(data.pop("model_type", None), **data)
    except Exception:  # noqa: BLE001 - no or an unknown model_type, a field the config class refuses
        return None


def _build(config) -> Modules | None:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            # a copy: from_config records the attention implementation in the config it is given
            model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    except Exception:  # noqa: BLE001 - custom code, a missing optional package, an architecture with no causal LM
        return None
    output = model.get_output_embeddings()
    kinds = {name: type(module).__name__ for name, module in model.named_modules() if name}
    output_name = next((name for name, module in model.named_modules() if module is output), None) if output else None
    return Modules(str(getattr(config, "model_type", "") or ""), kinds, output_name)


def default_targets(model_type: str) -> tuple[str, ...] | None:
    """PEFT's default LoRA targets for a model type (peft/utils/constants.py
    `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`: what LoraConfig uses when `target_modules` is unset), None
    when PEFT has none (it then refuses the config: "Please specify `target_modules` in `peft_config`")."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping

    found = mapping.get(model_type)
    return tuple(found) if found else None
