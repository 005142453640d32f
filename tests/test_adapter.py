"""The run's adapter (launch/config/adapter.py): read once from TRL's ModelConfig fields, matched to the model's linear
layers as PEFT matches them."""

from __future__ import annotations

import dataclasses

from trl import ModelConfig

from launch.config.adapter import ALL_LINEAR, Adapter, Quantization

QWEN_LINEARS = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")] + [
    f"model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")] + ["lm_head"]


def test_a_full_fine_tune_has_no_adapter():
    assert Adapter.from_training({}) is None
    assert Adapter.from_training({"lora_r": 8, "load_in_4bit": False}) is None


def test_missing_keys_take_trls_modelconfig_defaults():
    """The defaults are TRL's own: a ModelConfig with only use_peft set reads the same as a dict with only it."""
    trl_defaults = {f.name: getattr(ModelConfig(use_peft=True), f.name) for f in dataclasses.fields(ModelConfig)}
    assert Adapter.from_training({"use_peft": True}) == Adapter.from_training(trl_defaults)
    a = Adapter.from_training({"use_peft": True})
    assert (a.method, a.r, a.alpha, a.dropout, a.target_modules, a.quantization) == ("lora", 16, 32, 0.05, None, None)


def test_qlora_fields_as_trl_names_them():
    a = Adapter.from_training({"use_peft": "true", "lora_r": 64, "lora_alpha": 16,
                               "lora_target_modules": ["all-linear"],
                               "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": True,
                               "bnb_4bit_quant_storage": "bfloat16"})
    assert a.method == "qlora" and a.r == 64 and a.target_modules == ALL_LINEAR  # one-element list -> its string
    assert a.quantization == Quantization(bits=4, quant_type="nf4", double_quant=True, storage_dtype="bfloat16")
    assert a.identity()["quantization"]["storage_dtype"] == "bfloat16"
    assert Adapter.from_training({"use_peft": True, "load_in_4bit": True}).quantization.storage_dtype == "uint8"
    assert Adapter.from_training({"use_peft": True, "load_in_8bit": True}).method == "lora"


def test_four_bit_weights_take_half_a_byte_plus_their_absmax():
    assert Quantization(bits=4).bytes_per_weight == 0.5 + 4 / 64
    assert 0.5 + 1 / 64 < Quantization(bits=4, double_quant=True).bytes_per_weight < 0.5 + 1.1 / 64


def test_targets_match_as_peft_does():
    lin = QWEN_LINEARS
    assert len(Adapter(16, 32, 0.0, ALL_LINEAR).targets(lin)) == 7  # every linear but the LM head
    assert Adapter(16, 32, 0.0, None).targets(lin) == [lin[0], lin[2]]  # PEFT's default: q_proj, v_proj
    assert Adapter(16, 32, 0.0, ("o_proj", "down_proj")).targets(lin) == [lin[3], lin[6]]
    assert Adapter(16, 32, 0.0, r".*\.(q|k)_proj").targets(lin) == lin[:2]  # a string is a full-match regex
    assert Adapter(16, 32, 0.0, ("query_key_value",)).targets(lin) == []
    assert Adapter(16, 32, 0.0, ("proj",)).targets(lin) == []  # a suffix after a dot, not a substring


def test_the_reading_agrees_with_what_trl_builds_from_the_same_fields():
    """TRL's get_peft_config / get_quantization_config (what the ranks pass to SFTTrainer and from_pretrained) build
    the same rank, alpha, dropout, targets and 4-bit settings from a ModelConfig that Adapter reads from its fields."""
    from trl.trainer.utils import get_peft_config, get_quantization_config

    fields = dict(use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.1, lora_target_modules=["q_proj", "v_proj"],
                  load_in_4bit=True, use_bnb_nested_quant=True, bnb_4bit_quant_storage="bfloat16", dtype="bfloat16")
    model_config = ModelConfig(**fields)
    peft, bnb = get_peft_config(model_config), get_quantization_config(model_config)
    a = Adapter.from_training(fields)
    assert (a.r, a.alpha, a.dropout) == (peft.r, peft.lora_alpha, peft.lora_dropout)
    assert set(a.target_modules) == set(peft.target_modules)
    q = a.quantization
    assert (q.bits == 4) == bnb.load_in_4bit and q.quant_type == bnb.bnb_4bit_quant_type
    assert q.double_quant == bnb.bnb_4bit_use_double_quant
    assert q.storage_dtype == str(bnb.bnb_4bit_quant_storage).replace("torch.", "")
