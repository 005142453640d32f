"""ALST's memory features change memory, not numbers: on CPU, each gives the loss and gradients of the plain model.

- Tiled MLP: `tile_mlps` from the canonical train script (DeepSpeed's `TiledMLP` on every decoder MLP).
- Tiled loss: TRL's fused LM head, which SFTTrainer always uses (also under sequence parallelism, with pre-shifted
  `shift_labels`), forced here into many token x vocabulary tiles.
- Activation offload: TRL's `OffloadActivations` (SFTConfig `activation_offloading`) around a checkpointed model
  with tiled MLPs. It only moves tensors that live on an accelerator, so the test declares the CPU to be one: the
  pack/unpack path then runs (CPU to CPU copies), without CUDA streams.
"""

import copy
import importlib.util
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.testing import assert_close

REPO = Path(__file__).resolve().parents[1]
BATCH, SEQ = 2, 37  # odd length: the last tile is shorter than the others


def _train_module():
    spec = importlib.util.spec_from_file_location("canonical_train", REPO / "templates" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_model(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).float()
    model.train()
    return model


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 64, (BATCH, SEQ), generator=g)
    labels = input_ids.clone()
    labels[0, :5] = -100  # a masked prompt
    return input_ids, labels


def _loss_and_grads(model, context=None, **inputs):
    model.zero_grad(set_to_none=True)
    if context is None:
        loss = model(**inputs).loss
    else:
        with context:
            loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(reference, result):
    (ref_loss, ref_grads), (loss, grads) = reference, result
    assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert_close(grads[name], ref_grads[name], msg=lambda m, name=name: f"{name}: {m}")


def _tiled(model, shards):
    _train_module().tile_mlps(types.SimpleNamespace(model=model, is_deepspeed_enabled=True), shards)
    return model


@pytest.mark.parametrize("shards", [4, None])  # None: ALST's ceil(seq / hidden), here 1 (SEQ < hidden)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_tiled_mlp_matches_untiled(shards, checkpointing):
    input_ids, labels = _batch()
    plain = _tiny_model()
    tiled = _tiled(copy.deepcopy(plain), shards)
    for model in (plain, tiled):
        if checkpointing:
            model.activation_checkpointing_enable()
    _assert_same(
        _loss_and_grads(plain, input_ids=input_ids, labels=labels),
        _loss_and_grads(tiled, input_ids=input_ids, labels=labels),
    )


def test_tiled_mlp_really_tiles():
    from deepspeed.runtime.sequence_parallel import ulysses_sp

    model = _tiled(_tiny_model(), 4)
    calls = []
    original = ulysses_sp.TiledMLP.forward

    def counting_forward(ctx, fn, self, x, shards, compute_params):
        calls.append(shards)
        return original(ctx, fn, self, x, shards, compute_params)

    input_ids, labels = _batch()
    with mock.patch.object(ulysses_sp.TiledMLP, "forward", staticmethod(counting_forward)):
        model(input_ids=input_ids, labels=labels)
    assert calls == [4, 4]  # one call per decoder layer, 4 tiles each


def test_tiled_mlp_needs_deepspeed():
    with pytest.raises(ValueError, match="needs DeepSpeed"):
        _train_module().tile_mlps(types.SimpleNamespace(model=_tiny_model(), is_deepspeed_enabled=False), None)


@pytest.mark.parametrize("pre_shifted", [False, True])  # True: what the SP dataloader adapter passes
def test_tiled_loss_matches_full_logits_loss(pre_shifted, monkeypatch):
    import trl.kernels.chunked_logprob as chunked_logprob
    import trl.trainer.utils as trl_utils

    # Tiles of 8 tokens x 16 vocabulary entries: 10 x 4 tiles for this batch (SFTTrainer's are 4,096 x 32,768)
    monkeypatch.setattr(chunked_logprob, "TOKEN_CHUNK_SIZE", 8)
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 16)

    input_ids, labels = _batch()
    plain = _tiny_model()
    fused = copy.deepcopy(plain)
    trl_utils.add_fused_lm_head(fused, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does
    if pre_shifted:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:].contiguous()
        inputs = {"input_ids": input_ids, "labels": shift_labels, "shift_labels": shift_labels}
    else:
        inputs = {"input_ids": input_ids, "labels": labels}
    _assert_same(_loss_and_grads(plain, **inputs), _loss_and_grads(fused, **inputs, fused_lm_head=True))


def test_activation_offload_with_checkpointing_and_tiled_mlp_matches_plain():
    from trl.trainer import sft_trainer

    from launch.cpu import activation_offload

    input_ids, labels = _batch()
    plain = _tiny_model()
    alst = _tiled(copy.deepcopy(plain), 4)
    for model in (plain, alst):
        model.activation_checkpointing_enable()

    activation_offload.install()  # what a CPU run's SFTTrainer gets (launch/cpu/activation_offload.py)
    offload = sft_trainer.get_act_offloading_ctx_manager(alst)
    moved = []
    pack = offload.pack_hook

    def counting_pack(tensor):
        tensor_id = pack(tensor)
        moved.append(offload.tracker[tensor_id][1])  # True: copied out, to be brought back in the backward
        return tensor_id

    offload.pack_hook = counting_pack
    _assert_same(
        _loss_and_grads(plain, input_ids=input_ids, labels=labels),
        _loss_and_grads(alst, offload, input_ids=input_ids, labels=labels),
    )
    # each decoder layer's checkpointed input (batch x seq x hidden) is among the offloaded tensors
    assert sum(moved) >= 2, moved
