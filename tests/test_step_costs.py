"""Two step costs of the throughput model (launch/speed/model.py) beyond the layers' kernels:

- autocast's casts of fp32 weights: a run whose matmuls compute in bf16 over fp32 trainable weights (DDP or one
  process loaded in fp32 under bf16 autocast, `Precision.autocast_copies`) casts every decoder weight to bf16 once
  per forward pass (the cast cached within the forward's autocast region; checkpointing's recomputed forward casts
  again), converts each weight gradient back to fp32 once, and TRL's fused LM head casts its weight tile by tile in
  the forward and the backward. Counted for the ddp recipe, not for ZeRO-3's or FSDP2's 16-bit compute weights nor a
  pure bf16 DDP; bytes checked by hand for a small architecture.
- the host's Adam step under optimizer offload (DeepSpeed's CPU Adam): host-memory bytes per shard parameter, at
  the stated host bandwidth per GPU, exposed; only with optimizer offload; bytes checked by hand.
- the measured calibration rows have neither (the ddp rows ran pure bf16, no row offloads its optimizer), so the
  fitted rates do not move; the ddp default's prediction drops by the casts' time, zero3-offload's by the host step.
"""

from __future__ import annotations

import pytest

from launch.facts import calibration, hub
from launch.memory import Architecture, RunShape
from launch.recipe.discovery import find_recipe
from launch.speed import model as throughput_model

# The small Llama-style architecture of tests/test_communication.py: hidden 64, 2 layers, 4 query heads and 2 K/V
# heads of 16, MLP 128, vocabulary 1,000, untied head.
#   per layer the matmul weights: q 64x64 = 4,096, k 64x32 = 2,048, v 2,048, o 4,096, gate, up, down 3 x 64 x 128 =
#   24,576: 36,864. N = 202,048 parameters (embeddings 64,000, LM head 64,000, norms 320).
ARCH = Architecture(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)
PER_LAYER = 36_864
N = 202_048
TRAINING = {"max_length": 128, "per_device_train_batch_size": 2, "activation_checkpointing": False}
DDP = {"distributed_type": "MULTI_GPU"}
ZERO3 = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}
FSDP2 = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}}
OFFLOAD_BOTH = {"distributed_type": "DEEPSPEED", "deepspeed_config": {
    "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"}}
OFFLOAD_OPTIMIZER = {"distributed_type": "DEEPSPEED", "deepspeed_config": {
    "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none"}}


def _run(accelerate: dict, **training) -> RunShape:
    return RunShape.from_configs({"num_processes": 8, **accelerate}, {**TRAINING, **training})


def _cast_bytes(arch: Architecture, run: RunShape) -> float:
    """Bytes autocast's weight casts move in one optimizer step (every micro-batch)."""
    kernels = throughput_model.autocast_cast_kernels(arch, run)
    return sum(k.count * k.bytes for k in kernels) * run.layout.gradient_accumulation_steps


def test_the_small_architecture_is_counted_as_written():
    assert ARCH.num_params == N and ARCH.num_layers * PER_LAYER == sum(
        ARCH.num_layers * i * o for _p, i, o in ARCH.linear_layers().values())


def test_casts_only_where_bf16_computes_over_fp32_weights():
    ddp_fp32 = _run(DDP, dtype="float32")  # the ddp recipe: fp32 weights, bf16 autocast
    assert ddp_fp32.precision.autocast_copies and throughput_model.autocast_cast_kernels(ARCH, ddp_fp32)
    one = RunShape.from_configs({"num_processes": 1}, {**TRAINING, "dtype": "float32"})  # one process: the same
    assert one.layout.kind == "single" and throughput_model.autocast_cast_kernels(ARCH, one)
    for run in (_run(DDP, dtype="bfloat16"),  # pure bf16 DDP: the weights are bf16 already
                _run(ZERO3, dtype="float32"), _run(ZERO3, dtype="bfloat16"),  # DeepSpeed's 16-bit module
                _run(FSDP2, dtype="float32"), _run(FSDP2, dtype="bfloat16"),  # FSDP2's bf16 param_dtype
                _run(DDP, dtype="float32", bf16=False)):  # fp32 throughout: no autocast
        assert not throughput_model.autocast_cast_kernels(ARCH, run), run.precision
        assert _cast_bytes(ARCH, run) == 0


def test_cast_bytes_by_hand():
    # 256 tokens a micro-batch: the LM head is one tile (4,096 tokens x 32,768 vocabulary), its 1,000 x 64 weight
    # cast in the forward and the backward: 2 x 6 x 64,000 = 768,000 bytes. Each decoder weight cast once forward
    # (read 4, write 2) and its gradient once back (read 2, write 4): 6 x 2 x 2 layers x 36,864 = 884,736.
    run = _run(DDP, dtype="float32")
    assert _cast_bytes(ARCH, run) == pytest.approx(884_736 + 768_000)
    kernels = throughput_model.autocast_cast_kernels(ARCH, run)
    assert sum(k.count for k in kernels) == 7 * 2 * 2 + 2  # one kernel a weight each way, two for the head
    # checkpointing's recomputed forward casts again: 6 x 3 x 2 x 36,864 = 1,327,104; accumulation 2: per micro-batch
    ckpt = _run(DDP, dtype="float32", activation_checkpointing=True, gradient_accumulation_steps=2)
    assert _cast_bytes(ARCH, ckpt) == pytest.approx(2 * (1_327_104 + 768_000))
    # in the step: the casts are memory-bound kernels among the micro-batch's
    assert all(k in throughput_model._micro_batch_kernels(ARCH, run) for k in kernels)


def test_host_adam_only_with_optimizer_offload_by_hand():
    for run in (_run(DDP, dtype="float32"), _run(ZERO3), _run(FSDP2, dtype="float32")):
        assert throughput_model.host_step_bytes(ARCH, run) == 0
        assert "host optimizer" not in throughput_model.predict(ARCH, run).seconds
    # parameters and optimizer offloaded, a shard of N / 8: Adam reads master, grad, m, v (16) and writes three (12),
    # the bf16 gradient converted to fp32 (2 + 4), the update copied into the host's bf16 parameters (4 + 2): 40
    both = _run(OFFLOAD_BOTH, gradient_accumulation_steps=2)
    assert throughput_model.host_step_bytes(ARCH, both) == pytest.approx(40 * N / 8)
    # the host link: the bf16 parameters in for the forward and the backward every micro-batch (2 x 2 x N / 8 x 2),
    # each micro-batch's bf16 gradient partition down and back up (2 x 2 x N / 8 x 2); nothing up after the step
    assert throughput_model.host_link_bytes(ARCH, both) == pytest.approx(2 * 2 * N / 8 * 2 + 2 * 2 * N / 8 * 2)
    # the optimizer only: no host parameters to update (34), the updated bf16 parameters up over the link (2)
    opt = _run(OFFLOAD_OPTIMIZER)
    assert throughput_model.host_step_bytes(ARCH, opt) == pytest.approx(34 * N / 8)
    assert throughput_model.host_link_bytes(ARCH, opt) == pytest.approx(2 * 2 * N / 8 + 2 * N / 8)
    seconds = throughput_model.predict(ARCH, opt).seconds
    assert seconds["host optimizer"] == pytest.approx(34 * N / 8 / throughput_model.HOST_MEMORY_BYTES_PER_S_PER_GPU)
    assert throughput_model.HOST_MEMORY_BYTES_PER_S_PER_GPU == pytest.approx(76.8e9)


def test_no_calibration_row_has_either_cost():
    for row in calibration.MEASURED_ROWS:
        arch, run = throughput_model.row_run(row)
        assert not throughput_model.autocast_cast_kernels(arch, run), row
        assert throughput_model.host_step_bytes(arch, run) == 0, row


def _recipe_run(name: str) -> tuple[Architecture, RunShape]:
    """A recipe's GPU defaults on its model's shipped config, synthetic, in unpacked rows (as the measured rows of
    launch.facts.calibration ran: the shares below were checked against those; a packed row's SDPA mask adds
    attention, tests/test_packed_attention.py)."""
    recipe = find_recipe(name)
    model = str(recipe.config["model_name_or_path"]).replace("/", "--")
    arch = Architecture.from_config(hub.read_model_config(str(hub.SHIPPED_CONFIGS / model)).config)
    return arch, RunShape.from_configs(recipe.accelerate, {**recipe.config, "synthetic": True, "packing": False,
                                                           "padding_free": False})


def test_the_ddp_default_slows_by_its_casts(monkeypatch):
    arch, run = _recipe_run("ddp")
    with_casts = throughput_model.predict(arch, run)
    kernels = throughput_model.autocast_cast_kernels(arch, run)
    rates = throughput_model.Rates()
    cast_s = sum(sum(rates.seconds(k, with_casts.peak_flops)) for k in kernels) * \
        run.layout.gradient_accumulation_steps
    monkeypatch.setattr(throughput_model, "autocast_cast_kernels", lambda _a, _r: [])
    without = throughput_model.predict(arch, run)
    assert with_casts.compute_s - without.compute_s == pytest.approx(cast_s)
    drop = with_casts.tokens_per_s_per_gpu / without.tokens_per_s_per_gpu - 1
    assert -0.17 < drop < -0.12, drop  # about -15% at the model's rates (0.6B: short casts, at the issue floor)


def test_zero3_offload_slows_by_the_host_step(monkeypatch):
    arch, run = _recipe_run("zero3-offload")
    with_host = throughput_model.predict(arch, run)
    host_s = throughput_model.host_step_bytes(arch, run) / throughput_model.HOST_MEMORY_BYTES_PER_S_PER_GPU
    assert with_host.seconds["host optimizer"] == pytest.approx(host_s)
    monkeypatch.setattr(throughput_model, "host_step_bytes", lambda _a, _r: 0.0)
    without = throughput_model.predict(arch, run)
    assert with_host.step_s - without.step_s == pytest.approx(host_s)
    drop = with_host.tokens_per_s_per_gpu / without.tokens_per_s_per_gpu - 1
    assert -0.45 < drop < -0.25, drop  # about -35%: 40 bytes x 7.4 B parameters a rank at 76.8 GB/s
