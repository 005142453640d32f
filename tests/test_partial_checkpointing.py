"""Partial activation checkpointing (`checkpointing_layers: k`, launch/rank/partial_checkpointing.py): which layers the
ranks checkpoint, that it changes no loss, and that the plan and `--fastest` count it.

- In one process: the smoke model's architecture with 4 layers trained by TRL's SFTTrainer for a few steps with
  checkpointing off, on every layer and on the first 2 of 4 (transformers' flags, set the way the recipes' train.py
  sets them); FSDP2's own path (torch's checkpoint wrappers taken off all but the first k, before sharding) on the same
  model without a process group. Checkpointing recomputes the same forward, so the losses are equal to the bit.
- The plan: k of L between all and none, layer by layer; the trace holds it within 15% (tests/test_trace.py's bound).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from launch.config import smoke
from launch.rank import partial_checkpointing as partial

STEPS = 3
LAYERS = 4


def _model():
    """The smoke model's architecture with LAYERS layers, its weights from a fixed seed (the same for every run)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"],
                                        num_hidden_layers=LAYERS, layer_types=["full_attention"] * LAYERS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _losses(tmp_path, name: str, checkpointing: bool, layers: int | None) -> tuple[list[float], list[bool]]:
    """Per-step training losses of STEPS steps, and which layers were checkpointed during them."""
    from datasets import load_dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    assets = smoke.ensure_smoke_assets(progress=lambda *_: None)
    args = SFTConfig(output_dir=str(tmp_path / name), use_cpu=True, bf16=False, max_steps=STEPS, logging_steps=1,
                     per_device_train_batch_size=2, learning_rate=3e-3, max_length=64, report_to="none",
                     save_strategy="no", dataset_num_proc=1, seed=0, data_seed=0,
                     activation_checkpointing=checkpointing)
    trainer = SFTTrainer(model=_model(), args=args, processing_class=AutoTokenizer.from_pretrained(assets["model"]),
                         train_dataset=load_dataset(str(smoke.data_dir()), split="train"))
    if layers is not None:  # as templates/train.py does
        partial.checkpoint_first_layers(trainer, layers)
    seen = []

    class Flags(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            seen.append([layer.gradient_checkpointing for layer in partial.decoder_layers(model)])

    trainer.add_callback(Flags())
    trainer.train()
    assert all(flags == seen[0] for flags in seen)
    return [row["loss"] for row in trainer.state.log_history if "loss" in row], seen[0]


def test_the_first_k_layers_are_checkpointed_and_the_losses_do_not_change(tmp_path):
    """Off, all 4 and the first 2 of 4: the same per-step losses, exactly (fp32 on CPU: the recomputed forward is the
    same computation, and torch's checkpoint restores the RNG state, which nothing here draws from anyway)."""
    off, flags_off = _losses(tmp_path, "off", False, None)
    every, flags_all = _losses(tmp_path, "all", True, None)
    first, flags_first = _losses(tmp_path, "first", True, 2)
    assert flags_off == [False] * 4 and flags_all == [True] * 4 and flags_first == [True, True, False, False]
    assert len(off) == STEPS and off == every == first, (off, every, first)


def test_fsdp2s_own_checkpointing_keeps_the_first_k_wrappers(monkeypatch):
    """FSDP2's path: Accelerate's `fsdp2_apply_ac` wraps every decoder layer (checkpoint, and offload when asked);
    the patched one leaves the first k wrapped and the rest bare, and a few SGD steps give the same losses as
    every layer wrapped and none."""
    import accelerate.accelerator as accelerator_module
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper, OffloadWrapper
    from types import SimpleNamespace

    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "Qwen3DecoderLayer")

    def run(count: int | None, wrap: bool = True, offload: bool = False):
        model = _model()
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
                                                transformer_cls_names_to_wrap=["Qwen3DecoderLayer"],
                                                activation_checkpointing=wrap,
                                                activation_checkpointing_offload=offload)
        accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))
        trainer = SimpleNamespace(model=model, accelerator=accelerator, args=SimpleNamespace(
            activation_checkpointing=False), add_callback=lambda callback: None)
        upstream = accelerator_module.fsdp2_apply_ac
        try:
            if count is not None:
                partial.checkpoint_first_layers(trainer, count)
            if wrap:
                plugin.set_auto_wrap_policy(model)
                model = accelerator_module.fsdp2_apply_ac(accelerator, model)
        finally:
            accelerator_module.fsdp2_apply_ac = upstream
        layers = model.model.layers
        wrapped = [isinstance(layer, ActivationWrapper) for layer in layers]
        offloaded = [isinstance(layer, OffloadWrapper) for layer in layers]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
        losses = []
        model.train()
        for _ in range(3):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, wrapped, offloaded

    none, wrapped_none, _ = run(None, wrap=False)
    every, wrapped_all, _ = run(None)
    first, wrapped_first, _ = run(3)
    _, wrapped_offload, offloaded = run(1, offload=True)
    assert wrapped_none == [False] * 4 and wrapped_all == [True] * 4 and wrapped_first == [True, True, True, False]
    assert wrapped_offload == offloaded == [True, False, False, False]
    assert none == every == first, (none, every, first)


def test_a_count_the_model_does_not_have_is_refused_on_the_rank():
    assert partial.checkpointed(4, 1) == [True, False, False, False]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="the model has 4 decoder layers"):
            partial.checkpointed(4, bad)


# ---- the plan and the speed model ------------------------------------------------------------------------------------
def _qwen3_8b():
    import json

    from launch.facts import hub
    from launch.memory import Architecture

    return Architecture.from_config(json.loads((hub.SHIPPED_CONFIGS / "Qwen--Qwen3-8B" / "config.json").read_text()))


def _lora_run(**changes):
    """The lora recipe's shape on one GPU: Qwen3-8B, 4,096 tokens, LoRA r 16 on every linear layer, micro-batch 2."""
    from launch.config.adapter import Adapter
    from launch.config.layout import Layout
    from launch.memory import RunShape

    layout = Layout(kind="ddp", distributed_type="MULTI_GPU", zero_stage=None, offload_optimizer=False,
                    offload_params=False, num_machines=1, world_size=1,
                    mesh={"dp_replicate": 1, "dp_shard": 1, "tp": 1, "cp": 1, "sp": 1}, per_device_train_batch_size=2,
                    gradient_accumulation_steps=2, max_length=4096, pad_to_multiple_of=1)
    adapter = Adapter.from_training({"use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
                                     "lora_target_modules": ["all-linear"]})
    return replace(RunShape(layout, attn_implementation="sdpa", adapter=adapter), **changes)


def test_the_plan_holds_k_checkpointed_inputs_and_the_other_layers_activations():
    """k of L: k layers' checkpointed inputs and L - k layers' full activations, the peak falling with every layer
    checkpointed, from none's to all's (the first k checkpointed: a recomputation never meets the full activations)."""
    from launch.memory import estimate

    arch = _qwen3_8b()
    L = arch.num_layers
    every, none = estimate(arch, _lora_run()), estimate(arch, _lora_run(gradient_checkpointing=False))
    peaks = [estimate(arch, _lora_run(checkpointing_layers=k)).allocated_peak_gib for k in range(1, L)]
    assert none.allocated_peak_gib > peaks[0] and all(a > b for a, b in zip(peaks, peaks[1:]))
    assert peaks[-1] > every.allocated_peak_gib
    assert estimate(arch, _lora_run(checkpointing_layers=L)).allocated_peak_gib == every.allocated_peak_gib

    def term(est, start):
        return next(t.gib for t in est.gpu_terms if t.name.startswith(start))

    k = 9
    part = estimate(arch, _lora_run(checkpointing_layers=k))
    stored = term(part, f"stored activations (the last {L - k} of {L} layers")
    assert stored == pytest.approx(term(none, "stored activations") * (L - k) / L, rel=1e-9)
    inputs = term(part, f"checkpointed activations (inputs of the first {k} of {L} layers)")
    assert inputs < term(every, "checkpointed activations") * (k + 1) / L


def test_the_recomputation_is_k_of_l_of_all_of_it():
    """The speed model: the recomputed forward's FLOPs and time scale with k / L."""
    from launch.speed import model as throughput_model

    arch = _qwen3_8b()
    L = arch.num_layers

    def hardware_extra(run):
        flops = throughput_model.flops_by_convention(arch, run)
        return flops["hardware"] - flops["model_causal"]

    every, none = _lora_run(), _lora_run(gradient_checkpointing=False)
    assert hardware_extra(none) == 0
    assert hardware_extra(_lora_run(checkpointing_layers=9)) == pytest.approx(hardware_extra(every) * 9 / L)
    steps = [throughput_model.predict(arch, _lora_run(checkpointing_layers=k)).step_s for k in (1, 9, 18, 27)]
    assert throughput_model.predict(arch, none).step_s < steps[0] and steps == sorted(steps)
    assert steps[-1] < throughput_model.predict(arch, every).step_s
    recompute = throughput_model.predict(arch, every).step_s - throughput_model.predict(arch, none).step_s
    assert steps[1] - throughput_model.predict(arch, none).step_s == pytest.approx(recompute * 9 / L, rel=0.05)


def test_fastest_checkpoints_the_fewest_layers_that_fit(capsys):
    """`plan lora --gpus 1 --fastest` (Qwen3-8B, 4,096 tokens, one 80 GB GPU) considers partial checkpointing: as
    the recipe packs (SDPA's block mask over the flat micro-batch), the fewest layers that fit at micro-batch 2 are a
    candidate, within a percent of micro-batch 1 without checkpointing (the mask's square grows with the micro-batch);
    on padded rows (`-- --packing false`) checkpointing off does not fit at micro-batch 2, all layers is slower than
    needed, and the choice checkpoints the fewest layers that fit, applied as `--checkpointing_layers k`, faster
    than the recipe's own micro-batch."""
    import json

    from launch.__main__ import main
    from launch.memory.plan import SPARE

    assert main(["plan", "lora", "--gpus", "1", "--fastest", "--json"]) == 0
    packed = json.loads(capsys.readouterr().out)
    partial = [c for c in packed["candidates"] if 0 < (c.get("checkpointing_layers") or 0) < 36 and c["fits"]]
    assert partial and partial[0]["predicted_tokens_per_s_per_gpu"] > 0.98 * packed["fastest"][
        "predicted_tokens_per_s_per_gpu"]

    assert main(["plan", "lora", "--gpus", "1", "--fastest", "--json", "--", "--packing", "false"]) == 0
    data = json.loads(capsys.readouterr().out)
    chosen = data["fastest"]
    k = chosen["checkpointing_layers"]
    assert chosen["activation_checkpointing"] and 0 < k < 36 and chosen["gpu_peak_gib"] <= 79.1 * (1 - SPARE)
    same = [c for c in data["candidates"] if c["activation_checkpointing"] is False and all(
        c[f] == chosen[f] for f in ("per_device_train_batch_size", "gradient_accumulation_steps", "use_liger_kernel"))]
    assert same and not same[0]["fits"]  # without checkpointing the same batch does not fit
    own = [c for c in data["candidates"] if c["per_device_train_batch_size"] == 1 and c["use_liger_kernel"]
           and c["activation_checkpointing"] is False]
    assert own and chosen["predicted_tokens_per_s_per_gpu"] > own[0]["predicted_tokens_per_s_per_gpu"]
