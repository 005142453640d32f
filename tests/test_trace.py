"""`plan --trace` holds the analytic memory model to a measurement: one training step of the real model (transformers
+ TRL's fused loss + torch's AdamW, FSDP2 over a fake process group) traced under fake tensors
(launch/memory/trace.py). Tiny configs here run in seconds; the full-size GPU defaults are one slow test and the
table in docs/trace-table.md (`python benchmarks/trace_table.py`)."""

from __future__ import annotations

import json

import pytest

from launch.config.adapter import Adapter
from launch.config.layout import Layout
from launch.memory import Architecture, RunShape, estimate
from launch.memory import trace as tracing

TOLERANCE = 0.15  # the bound: traced and analytic peaks within 15%

# A Qwen3 (q/k norms, grouped-query attention) small enough to trace in a second or two
TINY = {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
        "tie_word_embeddings": True, "max_position_embeddings": 65536, "rope_theta": 1e6, "rms_norm_eps": 1e-6}


def layout(kind: str, world: int, length: int, batch: int = 1, accumulation: int = 1) -> Layout:
    return Layout(kind=kind, distributed_type={"ddp": "MULTI_GPU", "fsdp2": "FSDP"}[kind], zero_stage=None,
                  offload_optimizer=False, offload_params=False, num_machines=1, world_size=world,
                  mesh={"dp_replicate": 1, "dp_shard": world if kind == "fsdp2" else 1, "tp": 1, "cp": 1, "sp": 1},
                  per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, max_length=length,
                  pad_to_multiple_of=1)


LORA = Adapter.from_training({"use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0,
                              "lora_target_modules": ["all-linear"]})
LORA_DROPOUT = Adapter.from_training({"use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                                      "lora_target_modules": ["all-linear"]})

CASES = {
    "one process (no DDP wrapper)": (TINY, RunShape(layout("ddp", 1, 2048, 2), attn_implementation="sdpa")),
    "DDP, 2 processes": (TINY, RunShape(layout("ddp", 2, 2048, 2), attn_implementation="sdpa")),
    "untied LM head": ({**TINY, "tie_word_embeddings": False},
                       RunShape(layout("ddp", 1, 2048, 2), attn_implementation="sdpa")),
    "no checkpointing": (TINY, RunShape(layout("ddp", 1, 4096), attn_implementation="sdpa",
                                        gradient_checkpointing=False)),
    # the extreme the planner got wrong: long sequences with a small model (the layer phase, not the states)
    "long sequence, small model": (TINY, RunShape(layout("ddp", 1, 32768), attn_implementation="sdpa")),
    "long sequence, checkpoint offload": (TINY, RunShape(layout("ddp", 1, 32768), attn_implementation="sdpa",
                                                         offload_activations=True)),
    # a later micro-batch: the earlier ones' gradients are alive from the start
    "FSDP2, gradient accumulation": (TINY, RunShape(layout("fsdp2", 2, 4096, accumulation=2),
                                                    attn_implementation="sdpa")),
    "FSDP2 over 2 ranks": (TINY, RunShape(layout("fsdp2", 2, 4096), attn_implementation="sdpa")),
    "FSDP2 over 4 ranks, long, offload": (TINY, RunShape(layout("fsdp2", 4, 32768), attn_implementation="sdpa",
                                                         offload_activations=True)),
    # LoRA (the lora recipe's adapter: r 16, alpha 32, all linear layers) on a frozen bf16 base
    "LoRA, DDP, 2 processes": (TINY, RunShape(layout("ddp", 2, 4096, 2), attn_implementation="sdpa",
                                              adapter=LORA)),
    # the lora recipe's lora_dropout 0.05 without checkpointing: every targeted linear keeps CUDA's 1-byte dropout
    # mask (a CPU trace would keep the CPU's fp32 one: tracing._cuda_dropout)
    "LoRA with dropout, no checkpointing": (TINY, RunShape(layout("ddp", 1, 4096), attn_implementation="sdpa",
                                                           gradient_checkpointing=False, adapter=LORA_DROPOUT)),
    # partial checkpointing (`checkpointing_layers`): the first k of the 4 layers, the others keep their activations
    "2 of 4 layers checkpointed, long sequence": (TINY, RunShape(layout("ddp", 1, 32768), attn_implementation="sdpa",
                                                                 checkpointing_layers=2)),
    "LoRA, 1 of 4 layers checkpointed": (TINY, RunShape(layout("ddp", 1, 4096, 2), attn_implementation="sdpa",
                                                        adapter=LORA_DROPOUT, checkpointing_layers=1)),
    "FSDP2, 3 of 4 layers checkpointed": (TINY, RunShape(layout("fsdp2", 2, 4096), attn_implementation="sdpa",
                                                         checkpointing_layers=3)),
    # padding-free rows under SDPA (packing: bfd): one flat row, transformers' boolean T x T mask, SDPA's bias per
    # layer call (saved by the attention node) and K, V repeated to every query head
    "packed row, SDPA mask": (TINY, RunShape(layout("ddp", 1, 2048, 2), attn_implementation="sdpa",
                                             padding_free=True)),
    "packed row, SDPA mask, no checkpointing": (TINY, RunShape(layout("ddp", 1, 2048, 4), attn_implementation="sdpa",
                                                               padding_free=True, gradient_checkpointing=False)),
    "packed 16K row, 2 of 4 layers checkpointed": (TINY, RunShape(layout("ddp", 1, 8192, 2),
                                                                  attn_implementation="sdpa", padding_free=True,
                                                                  checkpointing_layers=2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_traced_peak_matches_the_analytic_plan(name):
    config, run = CASES[name]
    est = estimate(Architecture.from_config(config), run)
    traced = tracing.trace(config, run, analytic=est)
    ratio = traced.peak_gib / est.allocated_peak_gib
    assert abs(ratio - 1) <= TOLERANCE, (name, traced.categories, [(t.name, t.gib, t.counted) for t in est.gpu_terms])


def test_trace_sees_the_offloaded_checkpoints_on_the_host():
    config, run = CASES["long sequence, checkpoint offload"]
    traced = tracing.trace(config, run)
    arch = Architecture.from_config(config)
    # one [tokens, hidden] bf16 copy per layer went to the host
    assert traced.host_gib * 2**30 == pytest.approx(arch.num_layers * 32768 * arch.hidden_size * 2, rel=1e-6)


def test_lora_traces_under_ddp_and_says_why_not_under_fsdp():
    """The lora recipe's layout (DDP, a frozen base with a LoRA adapter) is traced above; QLoRA and LoRA under FSDP
    are refused in one line each."""
    fsdp = RunShape(layout("fsdp2", 2, 4096), attn_implementation="sdpa", adapter=LORA)
    assert "LoRA under FSDP" in tracing.untraceable(fsdp)
    qlora = Adapter.from_training({"use_peft": True, "load_in_4bit": True, "lora_target_modules": ["all-linear"]})
    assert "QLoRA" in tracing.untraceable(RunShape(layout("ddp", 2, 4096), adapter=qlora))


def test_untraceable_layouts_say_why_in_one_line():
    zero = Layout(kind="deepspeed", distributed_type="DEEPSPEED", zero_stage=3, offload_optimizer=False,
                  offload_params=False, num_machines=1, world_size=8, mesh={"dp_replicate": 1, "dp_shard": 1, "tp": 1,
                                                                            "cp": 1, "sp": 1},
                  per_device_train_batch_size=1, gradient_accumulation_steps=1, max_length=2048, pad_to_multiple_of=1)
    why = tracing.untraceable(RunShape(zero))
    assert "DeepSpeed" in why and "\n" not in why
    with pytest.raises(ValueError, match="DeepSpeed"):
        tracing.trace(TINY, RunShape(zero))


def test_plan_trace_prints_both_peaks_and_their_ratio(tmp_path, capsys):
    from launch.__main__ import main

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    # Liger off: the ddp recipe's GPU default turns it on, and its Triton kernels do not run under fake tensors
    rc = main(["plan", "ddp", "--model", str(tmp_path), "--gpus", "1", "--trace", "--json", "--",
               "--use_liger_kernel", "false"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    t = out["trace"]
    assert t["analytic_allocated_gib"] == out["gpu_allocated_peak_gib"]
    assert abs(t["ratio"] - 1) <= TOLERANCE and "Parameter" in t["categories_gib"]
    assert any("CUDA context" in line for line in t["untraced"])
    rc = main(["plan", "zero3", "--model", str(tmp_path), "--trace"])
    assert "Not traced: DeepSpeed ZeRO engines" in capsys.readouterr().out


@pytest.mark.slow


@pytest.mark.long
def test_ddp_recipe_gpu_default_full_size():
    """The ddp recipe's GPU default (Qwen3-0.6B, 8 processes, 4 x 2,048 tokens), full size: ~30 s on 2 cores."""
    from launch.catalog.blocks import MODEL_CONFIGS

    config = json.loads((MODEL_CONFIGS / "Qwen--Qwen3-0.6B" / "config.json").read_text())
    run = RunShape(layout("ddp", 8, 2048, 4), attn_implementation="sdpa")
    est = estimate(Architecture.from_config(config), run)
    traced = tracing.trace(config, run, analytic=est)
    assert abs(traced.peak_gib / est.allocated_peak_gib - 1) <= TOLERANCE
