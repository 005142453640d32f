"""Communication between GPUs (launch/speed/communication.py) and the predicted step it adds to.

- The bytes each strategy's collectives move per GPU per step, against hand-computed values for a small
  architecture (the arithmetic is written beside each value): DDP, ZeRO-1/2/3, FSDP2 (with and without resharding,
  with accumulation with and without sync_each_batch), HSDP, Ulysses SP, ring-attention CP.
- One process has no collectives and today's prediction; the same Qwen3-8B ZeRO-3 run predicts fewer tokens/s per
  GPU with its communication than without, and fewer across nodes than on one GPU.
- `plan fsdp2-70b --gpus 8 --nodes 3 --json` is communication-bound at 400 Gb/s per GPU and not at 3,200;
  `--network-gbps` refuses NaN, infinities and non-positive numbers.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from launch.__main__ import main
from launch.facts import gpus, hub
from launch.memory import Architecture, RunShape
from launch.speed import communication as comm, model as throughput_model

# A small Llama-style architecture: hidden 64, 2 layers, 4 query heads and 2 K/V heads of 16, MLP 128, vocabulary
# 1,000, untied head.
#   per layer: q 64x64 = 4,096, k 64x32 = 2,048, v 2,048, o 4,096 (attention 12,288); gate, up, down 3 x 64 x 128 =
#   24,576; two norms 128: 36,992. Two layers 73,984; embeddings 64,000, LM head 64,000, final norm 64:
#   202,048 parameters. ZeRO-3 keeps the small ones whole (norms: 2 x 128 + 64 = 320): 201,728 gathered.
ARCH = Architecture(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)
N = 202_048
TRAINING = {"max_length": 128, "per_device_train_batch_size": 2, "dtype": "bfloat16", "activation_checkpointing": False}


def test_the_small_architecture_is_counted_as_written():
    assert ARCH.num_params == N and ARCH.small_params == 320


def _run(accelerate: dict, **training) -> RunShape:
    return RunShape.from_configs({"num_processes": 8, **accelerate}, {**TRAINING, **training})


def _by_name(run: RunShape) -> dict:
    return {c.name: c for c in comm.collectives(ARCH, run)}


def test_ddp_all_reduces_the_gradients_once_per_step_in_their_dtype():
    # pure bf16: grads reduced in bf16, 2 x N = 404,096 bytes, all-reduce over 8: x 2 x 7/8
    found = _by_name(_run({"distributed_type": "MULTI_GPU"}))
    (c,) = found.values()
    assert c.kind == "all_reduce" and c.group == 8 and not c.inter_node and c.hidden_behind == "backward"
    assert c.bytes == pytest.approx(2 * N * 2 * 7 / 8)
    assert c.pieces == 1  # 404 KB: one 25 MiB bucket
    # fp32 weights under bf16 autocast (the recipes' fp32 masters): fp32 grads, 4 x N; accumulation 4 under no_sync:
    # still once per step, in the last micro-batch
    fp32 = _by_name(_run({"distributed_type": "MULTI_GPU"}, dtype="float32", gradient_accumulation_steps=4))
    (c,) = fp32.values()
    assert c.bytes == pytest.approx(4 * N * 2 * 7 / 8) and c.micro_batches == 1


def test_zero_1_and_2_reduce_scatter_and_gather_after_the_step_exposed():
    # ZeRO-2, accumulation 2: reduce-scatter of 2-byte grads (communication_data_type: the model's bf16) every
    # micro-batch: 2 x (2N x 7/8); after the step the updated 16-bit params are all-gathered once: 2N x 7/8
    z2 = _by_name(_run({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}},
                       gradient_accumulation_steps=2))
    assert z2["gradient reduce-scatter"].bytes == pytest.approx(2 * (2 * N * 7 / 8))
    assert z2["parameter all-gather (after the optimizer step)"].bytes == pytest.approx(2 * N * 7 / 8)
    assert all(c.hidden_behind is None for c in z2.values())  # overlap_comm is off below stage 3
    # ZeRO-1 reduces at the accumulation boundary only: once
    z1 = _by_name(_run({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 1}},
                       gradient_accumulation_steps=2))
    assert z1["gradient reduce-scatter"].bytes == pytest.approx(2 * N * 7 / 8)


def test_zero3_gathers_forward_recomputed_forward_and_backward_and_reduce_scatters():
    # 16-bit parameters less the small ones: 2 x 201,728 bytes, over 8: x 7/8, per micro-batch (2 here)
    run = _run({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}},
               gradient_accumulation_steps=2, activation_checkpointing=True)
    found = _by_name(run)
    gather = 2 * 201_728 * 7 / 8 * 2
    assert found["parameter all-gather (forward)"].bytes == pytest.approx(gather)
    assert found["parameter all-gather (recomputed forward)"].bytes == pytest.approx(gather)
    assert found["parameter all-gather (backward)"].bytes == pytest.approx(gather)
    assert found["gradient reduce-scatter"].bytes == pytest.approx(2 * N * 7 / 8 * 2)
    assert found["parameter all-gather (forward)"].pieces == 2  # a layer at a time
    without = _by_name(replace(run, gradient_checkpointing=False))
    assert "parameter all-gather (recomputed forward)" not in without
    first = _by_name(replace(run, checkpointing_layers=1))  # the first of the 2 layers: half the recomputed gathers
    assert first["parameter all-gather (recomputed forward)"].bytes == pytest.approx(gather / 2)


FSDP2 = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}}


def test_fsdp2_gathers_in_the_param_dtype_and_reduce_scatters_in_the_reduce_dtype():
    # fp32 weights, bf16 mixed precision: gathered as bf16 (2N), reduced in bf16 (Accelerate's reduce_dtype: 2N);
    # over 8: x 7/8. Forward and (resharded after forward) backward gathers; with checkpointing no third gather (the
    # recomputed forward uses the backward's)
    run = _run(FSDP2, dtype="float32", activation_checkpointing=True)
    found = _by_name(run)
    assert set(found) == {"parameter all-gather (forward)", "parameter all-gather (backward)",
                          "gradient reduce-scatter"}
    assert found["parameter all-gather (forward)"].bytes == pytest.approx(2 * N * 7 / 8)
    assert found["gradient reduce-scatter"].bytes == pytest.approx(2 * N * 7 / 8)
    # not resharded after forward: one gather
    assert set(_by_name(replace(run, fsdp_reshard_after_forward=False))) == {
        "parameter all-gather (forward)", "gradient reduce-scatter"}
    # accumulation 3: gathers every micro-batch; the reduce-scatter on the last only (no_sync), or on every one
    acc = replace(run, layout=replace(run.layout, gradient_accumulation_steps=3))
    assert _by_name(acc)["parameter all-gather (forward)"].bytes == pytest.approx(3 * 2 * N * 7 / 8)
    assert _by_name(acc)["gradient reduce-scatter"].bytes == pytest.approx(2 * N * 7 / 8)
    assert _by_name(replace(acc, sync_each_batch=True))["gradient reduce-scatter"].bytes == \
        pytest.approx(3 * 2 * N * 7 / 8)


def test_hsdp_adds_the_replicas_all_reduce_across_nodes():
    # dp_replicate 2 x dp_shard 4 on 2 nodes of 4: the shard group (4 consecutive ranks) stays on a node, the replica
    # pairs cross nodes; the all-reduce is of this rank's shard of the grads: 2N / 4 bytes, over 2: x 2 x 1/2
    run = _run({**FSDP2, "num_machines": 2, "parallelism_config": {
        "parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 4}})
    found = _by_name(run)
    assert found["parameter all-gather (forward)"].bytes == pytest.approx(2 * N * 3 / 4)
    assert not found["parameter all-gather (forward)"].inter_node
    hsdp = found["gradient all-reduce across replicas (HSDP)"]
    assert hsdp.group == 2 and hsdp.inter_node and hsdp.bytes == pytest.approx(2 * N / 4 * 2 * 1 / 2)


def test_ulysses_all_to_alls_are_exposed_and_ring_cp_exchanges_kv_behind_attention():
    # Ulysses over sp 4 (ZeRO-3 over 8): per layer and pass q, k, v and the output go through all-to-alls:
    # tokens per rank 2 x 128 / 4 = 64; (2 x 64 (q and out) + 2 x 32 (k, v)) x 64 tokens x 2 bytes = 24,576 bytes,
    # x 3/4 sent; 2 layers, forward + backward (no checkpointing): x 4
    uly = _run({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}, "parallelism_config": {
        "parallelism_config_dp_shard_size": 2, "parallelism_config_sp_size": 4}})
    found = [c for c in comm.collectives(ARCH, uly) if c.kind == "all_to_all"]
    assert len(found) == 1 and found[0].hidden_behind is None and found[0].group == 4
    assert found[0].bytes == pytest.approx(24_576 * 3 / 4 * 2 * 2)
    # ring CP over 4 (FSDP2 shards over dp_shard x cp): per layer and pass this rank's K and V chunk, 2 x 32 x 64
    # tokens (2 x 128 / 4) x 2 bytes = 8,192 bytes, cp - 1 = 3 chunks in; forward + backward (K/V and their
    # gradients: two) = 3 passes, 2 layers
    cp = _run({**FSDP2, "num_processes": 4, "parallelism_config": {"parallelism_config_cp_size": 4}})
    (ring,) = [c for c in comm.collectives(ARCH, cp) if c.name == "ring-attention K/V exchange"]
    assert ring.hidden_behind == "attention" and ring.group == 4
    assert ring.bytes == pytest.approx(8_192 * 3 * 2 * 3)


def test_collective_times_and_the_overlap_model():
    """Time is bytes / bus bandwidth; a group across nodes runs at the slower link; the overlap waits for what exceeds
    the compute plus one piece nothing hides."""
    net = comm.Network.of(gpus.CALIBRATION, 400)
    assert net.intra_node == pytest.approx(350e9) and net.inter_node == pytest.approx(45e9)
    assert comm.Network.of(gpus.CALIBRATION, 3200).bus(True) == pytest.approx(350e9)  # NVLink the slower there
    c = comm.Collective("x", "all_gather", 45e9, 16, True, "forward", 1, 10)  # 1 s
    assert c.seconds(net) == pytest.approx(1.0)
    # 1 s of comm behind 4 s of compute in 10 pieces: 0.1 s exposed; behind 0.5 s: 0.5 + 0.05
    assert comm.exposed([c], {"forward": 4.0}, 1, net)["x"] == pytest.approx(0.1)
    assert comm.exposed([c], {"forward": 0.5}, 1, net)["x"] == pytest.approx(0.55)
    hidden_by_nothing = replace(c, hidden_behind=None)
    assert comm.exposed([hidden_by_nothing], {"forward": 4.0}, 1, net)["x"] == pytest.approx(1.0)


# ---- the prediction -------------------------------------------------------------------------------------------------
def _qwen(name: str) -> Architecture:
    return Architecture.from_config(json.loads((hub.SHIPPED_CONFIGS / name / "config.json").read_text()))


def test_one_process_has_no_collectives_and_todays_prediction():
    arch = _qwen("Qwen--Qwen3-1.7B")
    run = RunShape.from_configs({"distributed_type": "MULTI_GPU", "num_processes": 1},
                                {"max_length": 2048, "per_device_train_batch_size": 4, "dtype": "bfloat16"})
    assert comm.collectives(arch, run) == []
    cost = throughput_model.predict(arch, run)
    assert cost.communication is None and cost.exposed_communication_s == 0
    assert cost.step_s == sum(cost.seconds.values()) == cost.compute_s  # compute alone, as before
    assert not cost.communication_bound


def test_zero3_qwen3_8b_is_slower_per_gpu_with_its_communication():
    """The zero3 recipe's shape (Qwen3-8B, 4 x 2,048 tokens per GPU): on 8 GPUs of one node the step adds its exposed
    communication (fewer tokens/s per GPU than its compute alone); across 2 nodes of 4 at 100 Gb/s per GPU the
    collectives cross the network and it predicts fewer tokens/s per GPU than one GPU, whose optimizer step is
    8 times larger but which has no collectives."""
    arch = _qwen("Qwen--Qwen3-8B")
    training = {"max_length": 2048, "per_device_train_batch_size": 4, "dtype": "bfloat16",
                "activation_checkpointing": False}
    zero3 = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}
    one = throughput_model.predict(arch, RunShape.from_configs({**zero3, "num_processes": 1}, training))
    eight = throughput_model.predict(arch, RunShape.from_configs({**zero3, "num_processes": 8}, training))
    assert eight.exposed_communication_s > 0
    assert eight.tokens_per_s_per_gpu < eight.tokens_per_step_per_gpu / eight.compute_s
    # two gathers and a reduce-scatter of the 16-bit 8B model over 8: ~43 GB per GPU per step
    assert eight.communication.bytes == pytest.approx(3 * 2 * arch.num_params * 7 / 8, rel=0.01)
    nodes = throughput_model.predict(arch, RunShape.from_configs({**zero3, "num_processes": 8, "num_machines": 2},
                                                                 training), network_gbps=100)
    assert all(c.inter_node for c in nodes.communication.collectives)
    assert nodes.tokens_per_s_per_gpu < one.tokens_per_s_per_gpu


def _plan(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_fsdp2_70b_on_three_nodes_is_communication_bound_at_400_gbps_not_at_3200(capsys):
    rc, out, err = _plan(capsys, "fsdp2-70b", "--gpus", "8", "--nodes", "3", "--json")
    assert rc == 0, err
    slow = json.loads(out)
    assert slow["communication_bound"] is True
    steps = slow["step_s"]
    assert steps["step"] == pytest.approx(steps["compute"] + steps["exposed_communication"], abs=1e-3)
    assert steps["exposed_communication"] > 0.1 * steps["step"]
    moved = sum(c["bytes"] for c in slow["communication"])
    assert moved == pytest.approx(418e9, rel=0.02)  # 3 x 2 bytes x 72.7B x 23/24
    assert all(c["inter_node"] and c["group"] == 24 for c in slow["communication"])
    rc, out, err = _plan(capsys, "fsdp2-70b", "--gpus", "8", "--nodes", "3", "--json", "--network-gbps", "3200")
    fast = json.loads(out)
    assert fast["communication_bound"] is False
    assert fast["step_s"]["exposed_communication"] < 0.1 * slow["step_s"]["exposed_communication"]
    assert fast["predicted_tokens_per_s_per_gpu"] > slow["predicted_tokens_per_s_per_gpu"]
    rc, out, err = _plan(capsys, "fsdp2-70b", "--gpus", "8", "--nodes", "3")
    assert "Communication-bound" in out and "a faster network" in out


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-400"])
def test_network_gbps_must_be_positive_and_finite(capsys, value):
    rc, out, err = _plan(capsys, "ddp", "--network-gbps", value)
    assert rc == 2 and "--network-gbps" in err
