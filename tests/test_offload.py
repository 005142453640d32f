"""Activation-checkpoint offload as transformers does it (`activation_checkpointing_kwargs: {offload: true}`), which
alst-ulysses-8gpu and the ring-cp recipes use with ZeRO-3 / FSDP2, and its CPU enablement
(launch/cpu/pinned_offload.py).

What makes it safe with ZeRO-3, where TRL's `activation_offloading` is not (launch/checks/rules/): the saved-tensor
hook wraps each checkpointed decoder layer's call only, so it receives that layer's input hidden states and nothing
else; no parameter (under ZeRO-3 a parameter carrying DeepSpeed's `ds_status`) ever passes through it. The distributed
check (ZeRO-3 + Ulysses SP + TiledMLP, offload on vs off) is in tests/test_sp_parity.py.
"""

from __future__ import annotations

import pytest
import torch

from launch.config import smoke


def _model():
    tokenizer = smoke.build_tokenizer()
    model = smoke.build_model(tokenizer)
    model.train()
    return model, tokenizer


def _batch(tokenizer, n=3, length=24):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(tokenizer), (n, length), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.fixture
def recorded(monkeypatch):
    """Every tensor that reaches the pack hook of torch's save_on_cpu (as transformers constructs it)."""
    from launch.cpu import pinned_offload

    seen: list[torch.Tensor] = []
    upstream = torch.autograd.graph.save_on_cpu

    class Recording(upstream):
        def __init__(self, pin_memory=False, device_type="cuda"):
            super().__init__(pin_memory=pin_memory, device_type=device_type)
            pack = self.pack_hook

            def record(tensor):
                seen.append(tensor)
                return pack(tensor)

            self.pack_hook = record

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Recording)
    pinned_offload.install()
    return seen


def test_the_offload_hook_receives_exactly_the_layer_inputs_and_never_a_parameter(recorded):
    model, tokenizer = _model()
    inputs = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda mod, args, kw: inputs.append(args[0] if args else kw["hidden_states"]),
                                        with_kwargs=True)
    model.activation_checkpointing_enable(offload=True)
    model(**_batch(tokenizer)).loss.backward()
    n_layers = model.config.num_hidden_layers
    # the forward's calls (the backward's recomputation runs outside the hook's context)
    assert len(recorded) == n_layers, [tuple(t.shape) for t in recorded]
    assert not any(isinstance(t, torch.nn.Parameter) for t in recorded)
    params = {p.data_ptr() for p in model.parameters()}
    assert not any(t.data_ptr() in params for t in recorded)
    for saved, layer_input in zip(recorded, inputs[:n_layers]):
        assert saved.shape == (3, 24, model.config.hidden_size)
        assert torch.equal(saved, layer_input)


def test_offload_keeps_loss_and_gradients_unchanged(recorded):
    model, tokenizer = _model()
    batch = _batch(tokenizer)
    model.activation_checkpointing_enable()
    plain = model(**batch).loss
    plain.backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.activation_checkpointing_enable(offload=True)
    offloaded = model(**batch).loss
    offloaded.backward()
    assert len(recorded) == model.config.num_hidden_layers
    assert offloaded.item() == plain.item()
    for a, p in zip(plain_grads, model.parameters()):
        assert torch.equal(a, p.grad)


def test_cpu_torch_refuses_pinned_memory_so_the_shim_is_needed(monkeypatch):
    """If this fails, CPU-only torch accepts pin_memory=True (or transformers stopped pinning): drop the shim."""
    if torch.accelerator.current_accelerator() is not None:
        pytest.skip("an accelerator is present: pinned memory works here, the shim is for CPU-only torch")
    from transformers import modeling_utils

    monkeypatch.setattr(modeling_utils, "save_on_cpu", torch.autograd.graph.save_on_cpu)  # upstream, unshimmed
    model, tokenizer = _model()
    model.activation_checkpointing_enable(offload=True)
    with pytest.raises(RuntimeError, match="pin_memory"):
        model(**_batch(tokenizer)).loss.backward()
