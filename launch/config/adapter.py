"""The run's adapter (LoRA / QLoRA), read once from the merged training arguments.

Adapters are a property of the run like precision: `Adapter.from_training(training)` reads TRL's
`ModelConfig` fields (trl/trainer/model_config.py, TRL 1.16) into one frozen value; the memory model (through
`RunShape.adapter`), the resume identity, the final save and the rules read it from there and from nowhere else.

What TRL builds from the same fields, and we mirror (trl/trainer/utils.py):
- `get_peft_config`: nothing unless `use_peft`; else `LoraConfig(r=lora_r, lora_alpha, lora_dropout, target_modules=
  lora_target_modules, use_rslora, use_dora, modules_to_save=lora_modules_to_save, bias="none")`.
- `get_quantization_config`: `BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant=
  use_bnb_nested_quant, bnb_4bit_quant_storage, bnb_4bit_compute_dtype=dtype)` or `load_in_8bit`. A quantized base
  without `use_peft` is not an adapter run (TRL trains nothing useful on it; transformers refuses training a purely
  quantized model), so it is read as a quantized adapter only when `use_peft` is on.

Target-module matching is PEFT's (peft/tuners/tuners_utils.py `check_target_module_exists`): a string is a regex that
must match the whole module name; a list matches a module whose name equals an entry or ends with "." + entry;
"all-linear" is every `nn.Linear` but the output layer. `None` means PEFT's default for the model type
(`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`: q_proj and v_proj for the Llama / Qwen / Mistral families).
The names matched are the model's own (`launch.facts.meta_model`: the model built on the meta device), for the rule
`launch.checks.rules.lora_targets_match`; the planner matches its modelled Llama-style layer
(`launch.memory.architecture`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.switches import is_on

ALL_LINEAR = "all-linear"
# PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the dense decoder families the planner models
# (peft/utils/constants.py): the default when `lora_target_modules` is unset.
DEFAULT_TARGETS = ("q_proj", "v_proj")
# bitsandbytes' 4-bit block size (Params4bit blocksize=64) and the nested (double) quantization's block of absmax
# values (256 absmax per second-level block, bnb.functional.quantize_4bit with compress_statistics=True).
QUANT_BLOCK = 64
NESTED_BLOCK = 256


def _dtype(value, default: str) -> str:
    v = str(value or default).replace("torch.", "").lower()
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "auto": default}.get(v, v)


@dataclass(frozen=True)
class Quantization:
    """The quantized frozen base (bitsandbytes): 4-bit (NF4 / FP4, optional double quantization, packed into
    `storage_dtype` elements) or 8-bit (LLM.int8)."""

    bits: int  # 4 or 8
    quant_type: str = "nf4"  # "nf4" / "fp4" (4-bit only)
    double_quant: bool = False  # `use_bnb_nested_quant`: absmax stored as 8-bit blocks plus an fp32 per 256
    storage_dtype: str = "uint8"  # `bnb_4bit_quant_storage`; bitsandbytes' default is uint8

    @property
    def bytes_per_weight(self) -> float:
        """Bytes a base weight takes on the device, quantization state included: 4-bit packs two weights per byte
        and keeps one absmax per 64-weight block (fp32, or 8-bit plus an fp32 per 256 absmax with double quant);
        8-bit is one byte plus an fp32 scale per row (small: counted per weight as nothing here)."""
        if self.bits == 8:
            return 1.0
        absmax = (1 + 4 / NESTED_BLOCK) / QUANT_BLOCK if self.double_quant else 4 / QUANT_BLOCK
        return 0.5 + absmax


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter on a frozen base (QLoRA when the base is 4-bit)."""

    r: int
    alpha: int
    dropout: float
    # None: PEFT's default for the model type; "all-linear"; a regex string; or a tuple of module-name suffixes
    target_modules: str | tuple[str, ...] | None
    quantization: Quantization | None = None
    use_dora: bool = False
    use_rslora: bool = False
    modules_to_save: tuple[str, ...] = ()

    @property
    def method(self) -> str:
        return "qlora" if self.quantization and self.quantization.bits == 4 else "lora"

    @classmethod
    def from_training(cls, training: dict) -> "Adapter | None":
        """The adapter of the merged training arguments (TRL's ModelConfig field names; a missing key takes TRL's
        default), or None for a full fine-tune (`use_peft` off)."""
        training = training or {}
        if not is_on(training.get("use_peft", False)):
            return None
        targets = training.get("lora_target_modules")
        if isinstance(targets, (list, tuple)):
            # ModelConfig.__post_init__ turns a one-element list into its string (then PEFT reads it as a regex,
            # or as "all-linear"): the same here
            targets = targets[0] if len(targets) == 1 else tuple(str(t) for t in targets)
        quant = None
        if is_on(training.get("load_in_4bit", False)):
            quant = Quantization(
                bits=4,
                quant_type=str(training.get("bnb_4bit_quant_type") or "nf4"),
                double_quant=is_on(training.get("use_bnb_nested_quant", False)),
                storage_dtype=_dtype(training.get("bnb_4bit_quant_storage"), "uint8"),
            )
        elif is_on(training.get("load_in_8bit", False)):
            quant = Quantization(bits=8, quant_type="int8")
        return cls(
            r=int(training.get("lora_r", 16)),
            alpha=int(training.get("lora_alpha", 32)),
            dropout=float(training.get("lora_dropout", 0.05)),
            target_modules=str(targets) if isinstance(targets, str) else targets,
            quantization=quant,
            use_dora=is_on(training.get("use_dora", False)),
            use_rslora=is_on(training.get("use_rslora", False)),
            modules_to_save=tuple(training.get("lora_modules_to_save") or ()),
        )

    def identity(self) -> dict:
        """What makes two adapter checkpoints the same kind of run (resume identity): method, rank, alpha, targets,
        quantization."""
        q = self.quantization
        return {
            "method": self.method,
            "r": self.r,
            "alpha": self.alpha,
            "target_modules": (list(self.target_modules) if isinstance(self.target_modules, tuple)
                               else self.target_modules),
            "quantization": None if q is None else {
                "bits": q.bits, "quant_type": q.quant_type, "double_quant": q.double_quant,
                "storage_dtype": q.storage_dtype},
            "use_dora": self.use_dora,
        }

    @property
    def all_linear(self) -> bool:
        """`target_modules` is PEFT's "all-linear" shorthand (which PEFT reads in any case)."""
        return isinstance(self.target_modules, str) and self.target_modules.lower() == ALL_LINEAR

    def targets(self, linear_names, output_layer: str = "lm_head") -> list[str]:
        """Which of the model's linear-layer names (full dotted module names) LoRA wraps, as PEFT matches them."""
        names = list(linear_names)
        t = self.target_modules
        if t is None:
            t = DEFAULT_TARGETS
        if self.all_linear:
            return [n for n in names if n.rsplit(".", 1)[-1] != output_layer]
        if isinstance(t, str):
            return [n for n in names if re.fullmatch(t, n)]
        return [n for n in names if any(n == e or n.endswith("." + e) for e in t)]


def quantization_on_cpu_supported() -> bool:
    """Whether bitsandbytes' 4-bit path trains on CPU at our pins (QLoRA smoke runs on CPU). One answer, read by the
    rule `launch.checks.rules.quantized_base_on_cpu` and the QLoRA smoke tests.

    Yes with bitsandbytes 0.50.2 (and torch 2.13 CPU): 4-bit quantization runs in its default (pure torch) backend and
    dequantization in its CPU kernels (bitsandbytes/backends/cpu/ops.py), so `from_pretrained(quantization_config=
    BitsAndBytesConfig(load_in_4bit=True, ...))` puts Params4bit weights on the CPU, and the LoRA forward/backward
    through them trains (tests/test_qlora.py; recipes/qlora-fsdp/README.md has the details and the one CPU-only
    hazard: an eval-mode forward without gradients repacks the weights in place for bitsandbytes' CPU inference
    kernel)."""
    return True
