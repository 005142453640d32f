"""`python -m launch plan RECIPE --trace`: one training step of the recipe's real model, traced under fake tensors.

The analytic model (`launch.memory.estimate`) is the fast path that `plan`, `--dry-run` and the preflight use; this
module is its measurement. It builds the model from its config.json with transformers under
`torch._subclasses.fake_tensor.FakeTensorMode` (no storage, no kernel computes, every allocation has its real shape
and dtype), applies the run's wrapping for ONE rank of its layout, runs one step's forward, backward and AdamW step
and reads the per-category peak off `torch.distributed._tools.mem_tracker.MemTracker`. What it reproduces of a GPU
run, and how:

- the model as the run loads it (`dtype`, SDPA), gradient checkpointing (non-reentrant, as transformers and the
  Trainer set it; with `checkpointing_layers` on the first layers only, as launch.rank.partial_checkpointing does)
  and its offload: transformers' `save_on_cpu(pin_memory=True)` is replaced by hooks that move each
  saved tensor to the `meta` device (the host, reported apart) and back, so the copy back for recomputation is
  counted on the device as on a GPU;
- TRL 1.16's fused LM head (`add_fused_lm_head`, the SFTTrainer's loss), with its GPU behaviour: only the labelled
  rows are scored (`hidden[mask]`) and the Triton kernels fold each tile in place, so the CPU-only torch fallbacks
  (fp32 copies per tile, `_addmm_fp32`'s upcasts) are replaced by in-place stand-ins that allocate nothing; a
  `device="cpu"` run keeps the fallbacks, as a CPU run does;
- torch's fused AdamW with its states created before the traced step (the steady state of step 2 onwards), and
  with gradient accumulation the earlier micro-batches' gradients too;
- FSDP2 (`fully_shard` per decoder layer, on the embedding, on Accelerate's tail unit and at the root, with
  Accelerate's fp32 upcast and bf16 MixedPrecisionPolicy) over a fake process group of the run's shard-group size;
  DDP: one rank's model states plus the reducer's bucket copy of the gradients, which fake tensors cannot see (the
  C++ reducer allocates it), taken from the analytic term.

Fake tensors live on the CPU device (a CPU build of torch cannot make fake CUDA tensors, "PyTorch is not linked with
support for cuda devices"), so SDPA is replaced by what the CUDA flash kernel allocates (`_FlashAttention`: the CPU
kernel takes the quadratic math path for grouped-query attention), dropout by CUDA's fused kernel (`_cuda_dropout`:
a 1-byte mask, where the CPU's is in the input's dtype), and transformers' packed-row detection, which
fake tensors cannot answer, by "one sequence per row". What cannot be traced is said, never approximated
(`untraceable`), and the memory outside PyTorch (the CUDA context, NCCL buffers, the allocator's fragmentation)
keeps its analytic terms, labelled.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from launch.memory.constants import GIB
from launch.memory.run_shape import RunShape

UNTRACED_GPU = ("CUDA context + NCCL buffers + allocator reserve: outside PyTorch's tensors, fake tensors do not "
                "see them; the analytic terms are added, labelled")


@dataclass
class Traced:
    """One traced step of one rank: its peak (bytes PyTorch would allocate) and the categories at that peak."""

    traced_gib: float  # the tracker's peak on the device: every tensor PyTorch allocates in the step
    categories: dict[str, float]  # GiB per MemTracker category at the peak
    host_gib: float  # offloaded checkpoints at their peak (the `meta` stand-in for the host)
    # analytic terms added because they cannot be traced: allocated by PyTorch but not seen (DDP's buckets), and
    # outside PyTorch's allocator (CUDA context, NCCL, the allocator's reserve)
    added_allocated: dict[str, float] = field(default_factory=dict)
    added: dict[str, float] = field(default_factory=dict)
    untraced: list[str] = field(default_factory=list)  # what the trace leaves out, one line each
    seconds: float = 0.0

    @property
    def peak_gib(self) -> float:
        """What torch.cuda.max_memory_allocated would report: the traced peak plus the untraced PyTorch buffers."""
        return self.traced_gib + sum(self.added_allocated.values())

    @property
    def total_gib(self) -> float:
        return self.peak_gib + sum(self.added.values())


def untraceable(run: RunShape) -> str | None:
    """Why this run's layout cannot be traced under fake tensors (one line), or None."""
    if run.layout.sharding == "zero":
        return ("DeepSpeed ZeRO engines cannot be traced under fake tensors (real collectives and C++ buffers in "
                "their hooks); the analytic plan stands alone")
    if run.layout.sp > 1 or run.uses_ulysses:
        return "Ulysses sequence parallelism runs DeepSpeed's all-to-all, which fake tensors cannot trace"
    if run.layout.cp > 1:
        return ("ring context parallelism does not run under fake tensors on a CPU build: torch's context_parallel() "
                "dispatches ring attention for the CUDA SDPA kernels only (tried: \"Operator "
                "aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy "
                "registered\")")
    if run.tiled_mlp:
        return "DeepSpeed's TiledMLP is not traced (a DeepSpeed autograd function outside a DeepSpeed-free build)"
    if run.adapter is not None and run.adapter.quantization is not None:
        return "QLoRA's 4-bit base is not traced (bitsandbytes' quantized storage under fake tensors is not wired)"
    if run.adapter is not None and (run.adapter.use_dora or run.adapter.modules_to_save):
        return "DoRA and modules_to_save adapters are not traced (only plain LoRA is wired)"
    if run.adapter is not None and run.layout.sharding == "fsdp":
        return ("LoRA under FSDP is not traced: torch's MemTracker hooks every parameter FSDP gathers, and a frozen "
                "base's gathered parameters refuse gradient hooks")
    if run.liger_kernels:
        return ("Liger's Triton kernels cannot run under fake tensors on a CPU build (`-- --use_liger_kernel false` "
                "traces the run without them)")
    return None


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _offload_to_meta(pin_memory=True, device_type="cuda"):
    """transformers' `save_on_cpu(pin_memory=True)` as the trace needs it: each tensor saved for recomputation goes
    to the `meta` device (the host; MemTracker reports it as a device of its own) and comes back as a new device
    tensor when the backward unpacks it (the copy back a GPU run makes)."""
    import torch

    def pack(t):
        return t.device, t.to("meta")

    def unpack(packed):
        device, t = packed
        return torch.empty_like(t, device=device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _gpu_loss_kernels(stack: contextlib.ExitStack) -> None:
    """The fused LM head as it runs on a GPU: Triton folds each tile in place and cuBLAS accumulates fp32 from 16-bit
    inputs (`out_dtype`), allocating nothing; only labelled rows are scored."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    def in_place(*_args, **_kwargs):
        return None

    stack.enter_context(_patched(chunked_logprob, "_forward_tile", in_place))
    stack.enter_context(_patched(chunked_logprob, "_backward_tile", in_place))
    stack.enter_context(_patched(chunked_logprob, "_addmm_fp32", in_place))
    # TRL scores `hidden[mask]` (a copy, saved by the kernel) on Triton devices; a boolean index has a data-dependent
    # shape that fake tensors cannot trace, and every label of a synthetic row is valid, so the copy is made whole
    fused = trl_utils._ChunkedLogProbFunction

    class Compact:
        @staticmethod
        def apply(hidden, *args):
            return fused.apply(hidden.clone(), *args)

    stack.enter_context(_patched(trl_utils, "_ChunkedLogProbFunction", Compact))


class _FlashAttention:
    """SDPA as the CUDA flash kernel allocates (torch's `_scaled_dot_product_flash_attention` and its backward,
    aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp `mha_fwd` / `mha_bwd`): the forward returns the
    output and saves it with q, k, v and the fp32 log-sum-exp [batch, heads, tokens]; the backward allocates an fp32
    dq accumulator, and with grouped-query attention dk and dv at the query head count before summing them down.
    A CPU build traces SDPA's CPU kernels instead, which take the math path (quadratic scores) for grouped-query
    attention: not what a GPU runs."""

    @staticmethod
    def function(torch):
        class Flash(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                out = torch.empty_like(q)
                lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
                ctx.save_for_backward(q, k, v, out, lse)
                return out

            @staticmethod
            def backward(ctx, dout):
                q, k, v, _out, _lse = ctx.saved_tensors
                accum = torch.empty_like(q, dtype=torch.float32)
                expanded = (torch.empty_like(q), torch.empty_like(q)) if k.shape[1] != q.shape[1] else ()
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                del accum, expanded
                return dq, dk, dv

        class Masked(torch.autograd.Function):
            """SDPA with a boolean mask (a padding-free row's block-diagonal one) as the CUDA memory-efficient and
            cuDNN backends allocate: `convert_boolean_attn_mask` (attention.cpp) inverts the mask and writes the
            query dtype's additive bias, which the attention node saves with q, k, v, the output and the fp32
            log-sum-exp; the backward an fp32 dq accumulator and dq, dk, dv (K and V come at every query head:
            transformers' repeat_kv under a mask)."""

            @staticmethod
            def forward(ctx, q, k, v, mask):
                inverted = torch.logical_not(mask)
                bias = torch.empty(mask.shape, dtype=q.dtype)
                del inverted
                out = torch.empty_like(q)
                lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
                ctx.save_for_backward(q, k, v, bias, out, lse)
                return out

            @staticmethod
            def backward(ctx, dout):
                q, k, v, _bias, _out, _lse = ctx.saved_tensors
                accum = torch.empty_like(q, dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                del accum
                return dq, dk, dv, None

        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            if attn_mask is not None:
                if attn_mask.dtype != torch.bool:
                    raise ValueError("the trace's SDPA stand-in takes a boolean mask (a packed row's) or none")
                if torch.is_autocast_enabled("cpu"):  # CUDA's autocast runs SDPA in the low dtype (its fp16 list)
                    low = torch.get_autocast_dtype("cpu")
                    q, k, v = (t.to(low) for t in (q, k, v))
                return Masked.apply(q, k, v, attn_mask)
            return Flash.apply(q, k, v)

        return sdpa


def _cuda_dropout(torch):
    """Dropout as CUDA runs it: torch's `dropout` takes the fused kernel on a CUDA tensor with 0 < p < 1
    (aten/src/ATen/native/Dropout.cpp `is_fused_kernel_acceptable`: `native_dropout`, which saves a bool mask, 1 byte
    per element), and on a CPU tensor multiplies by a mask in the input's dtype (`_dropout_impl`: 4 bytes per element
    of an fp32 LoRA input). A CPU trace of a LoRA run with lora_dropout > 0 would count the CPU's mask (measured on
    the lora recipe's Qwen3-8B default: 20 GiB of masks instead of 5)."""
    plain = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1 and not inplace and input.numel() > 0:
            return torch.native_dropout(input, p, True)[0]
        return plain(input, p, training, inplace)

    return dropout


def _dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, torch.float32)


def trace(config, run: RunShape, *, analytic=None) -> Traced:
    """Trace one training step of `run` on the model of `config` (a transformers config or a config.json dict).
    `analytic`: the run's `Estimate`, whose untraceable terms are added labelled (GPU runs). Raises ValueError for a
    layout `untraceable` refuses."""
    if why := untraceable(run):
        raise ValueError(why)
    import torch
    import torch.distributed as dist
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForCausalLM, masking_utils, modeling_utils
    from trl.trainer.utils import add_fused_lm_head

    start = time.perf_counter()
    if isinstance(config, dict):
        config = AutoConfig.for_model(**config)
    gpu = run.device == "gpu"
    layout = run.layout
    fsdp = layout.sharding == "fsdp"
    weights = _dtype(run.weights_dtype)
    act = _dtype("bfloat16" if run.act_bytes == 2 else "float32")
    transformers.logging.set_verbosity_error()

    with contextlib.ExitStack() as stack:
        if gpu:
            _gpu_loss_kernels(stack)
            stack.enter_context(_patched(torch.nn.functional, "scaled_dot_product_attention",
                                         _FlashAttention.function(torch)))
            stack.enter_context(_patched(torch.nn.functional, "dropout", _cuda_dropout(torch)))
        stack.enter_context(_patched(modeling_utils, "save_on_cpu", _offload_to_meta))
        # one sequence per row (synthetic or padded rows): transformers tells packed rows from their position ids,
        # a data-dependent test that fake tensors answer "maybe" (a full [rows, 1, L, L] mask); the run skips the mask.
        # A padding-free run: one flat row of micro-batch x length tokens, position ids restarting at each of the
        # micro-batch's conversations (full-length ones), whose indices are given as the test would find them
        batch, length = layout.per_device_train_batch_size, layout.per_rank_length
        packed = run.padding_free and gpu

        def conversations(*_a, **_k):
            return torch.arange(batch).repeat_interleave(length)[None] if packed else None

        stack.enter_context(_patched(masking_utils, "find_packed_sequence_indices", conversations))
        group = None
        if fsdp:
            from torch.testing._internal.distributed.fake_pg import FakeStore

            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", rank=0, world_size=layout.shard_group, store=FakeStore())
            group = True
        mesh = None
        if fsdp:  # outside the fake mode: the mesh reads its ranks off a real tensor
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (layout.shard_group,))
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=weights, attn_implementation="sdpa")
            model.config.use_cache = False
            if run.adapter is not None:  # TRL's SFTTrainer: get_peft_model on the loaded model, base frozen
                model = _lora(model, run.adapter)
            model.train()
            if run.gradient_checkpointing:
                model.activation_checkpointing_enable({"use_reentrant": False},
                                                      offload=bool(run.offload_activations and gpu))
                if run.checkpointing_layers is not None:  # the first k, as the ranks choose them
                    from launch.rank.partial_checkpointing import keep_first

                    keep_first(model, run.checkpointing_layers)
            add_fused_lm_head(_base(model), outputs=("log_probs", "entropy", "is_top1"))
            if fsdp:
                _fully_shard(model, run, mesh, torch)
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5,
                                          fused=True)
            _create_adam_states(model, optimizer, torch, keep_grads=layout.gradient_accumulation_steps > 1)
            ids = torch.zeros((1, batch * length) if packed else (batch, length), dtype=torch.long)
            positions = torch.arange(length).repeat(batch)[None] if packed else None
            peak, cats, host = _run_step(model, optimizer, ids, fsdp, gpu and act != torch.float32, act, torch,
                                         positions)
        finally:
            if group:
                dist.destroy_process_group()

    added_allocated, added, untraced = {}, {}, []
    if layout.sharding == "replicated" and layout.world_size > 1 and analytic is not None:
        bucket = next((t.gib for t in analytic.gpu_terms if t.name == "communication buffers"), 0.0)
        added_allocated["DDP reducer buckets (analytic)"] = bucket
        untraced.append("DDP's reducer buckets are allocated by its C++ reducer, not traced: the analytic term is "
                        "added")
    if gpu:
        if analytic is not None:
            for t in analytic.gpu_terms:
                if t.name.startswith(("CUDA context", "allocator reserve")):
                    added[f"{t.name} (analytic)"] = t.gib
        untraced.append(UNTRACED_GPU)
    return Traced(peak / GIB, {k: v / GIB for k, v in cats.items()}, host / GIB, added_allocated, added, untraced,
                  time.perf_counter() - start)


def _lora(model, adapter):
    """PEFT's LoRA on the model as TRL's `get_peft_config` builds it from the same fields
    (launch.config.adapter.Adapter)."""
    import torch
    from peft import LoraConfig, get_peft_model

    targets = list(adapter.target_modules) if isinstance(adapter.target_modules, tuple) else adapter.target_modules
    config = LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=adapter.dropout, target_modules=targets,
                        use_rslora=adapter.use_rslora, task_type="CAUSAL_LM")
    # PEFT moves each new LoRA module to its base layer's device (`Module.to(device)`, which swaps fake parameters and
    # fails on their weak references); in the trace every tensor is on the one stand-in device already, and PEFT
    # casts the adapter's dtype tensor by tensor (fp32, `autocast_adapter_dtype`), so module moves are skipped
    with _patched(torch.nn.Module, "to", lambda self, *_a, **_k: self):
        return get_peft_model(model, config)


def _base(model):
    """The transformers model under a PEFT wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _fully_shard(model, run: RunShape, mesh, torch) -> None:
    """Accelerate's `fsdp2_prepare_model` for one rank: fp32 upcast of the trainable parameters under mixed
    precision, `fully_shard` on every decoder layer, the embedding, the tail and the root,
    MixedPrecisionPolicy(param_dtype=bf16)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if run.mixed_precision in ("bf16", "fp16") and run.device == "gpu":
        low = torch.bfloat16 if run.mixed_precision == "bf16" else torch.float16
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low)
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    kwargs = {"mesh": mesh, "reshard_after_forward": run.fsdp_reshard_after_forward, "mp_policy": mp}
    base = _base(model)
    for layer in base.model.layers:
        fully_shard(layer, **kwargs)
    # Accelerate 1.15 carves the embedding (untied) and a tail [final norm, (embedding,) LM head] into units of
    # their own, the tail with reshard_after_forward=False (gathered from the forward's end to its backward)
    embed, head = base.get_input_embeddings(), base.get_output_embeddings()
    tied = embed.weight is head.weight
    if not tied:
        fully_shard(embed, **kwargs)
    fully_shard([base.model.norm, embed, head] if tied else [base.model.norm, head],
                **{**kwargs, "reshard_after_forward": False})
    fully_shard(model, **kwargs)


def _create_adam_states(model, optimizer, torch, keep_grads: bool = False) -> None:
    """The optimizer states of the steady state (step 2 onwards), created before the traced step. With gradient
    accumulation the traced micro-batch is a later one: the gradients of the earlier ones are kept."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    if not keep_grads:
        optimizer.zero_grad(set_to_none=True)


def _peak_only(tracker_class):
    """The tracker without its per-module peaks: `_update_peak_stats` walks every module's statistics after every
    op (ops x modules: 50 of 60 s of a 0.6B model's step); the plan needs the per-device peak and its categories."""

    class PeakOnly(tracker_class):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                total = snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(snap)

    return PeakOnly


class _NoHook:
    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _run_step(model, optimizer, ids, fsdp: bool, autocast: bool, act, torch, positions=None):
    """Forward (TRL's fused loss), backward, optimizer step under the tracker: (peak bytes on the device, bytes per
    category at that peak, peak bytes on the `meta` stand-in for the host)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    # MemTracker, not FSDPMemTracker: the latter keys its hooks by module and cannot take Accelerate's tail unit (one
    # `fully_shard` over [norm, LM head]); MemTracker sees the same allocations, in coarser categories (the gathered
    # parameters and the collectives' buffers count as temporaries or activations)
    tracker = _peak_only(MemTracker)()
    # MemTracker registers a gradient hook on every parameter, which torch refuses for a frozen one (a LoRA base):
    # marked as hooked already (a frozen parameter never gets a gradient, so its hook would never fire)
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
    tracker.track_external(model, optimizer, ids)
    amp = torch.autocast("cpu", dtype=act) if autocast else contextlib.nullcontext()
    with tracker:
        with amp:
            extra = {} if positions is None else {"position_ids": positions}
            out = model(input_ids=ids, labels=ids, fused_lm_head=True, **extra)
            loss = -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    snap = tracker.get_tracker_snapshot("peak")
    device = torch.device("cpu")
    cats = {str(k.value if hasattr(k, "value") else k): v for k, v in snap.get(device, {}).items()}
    total = cats.pop("Total", sum(cats.values()))
    host = snap.get(torch.device("meta"), {})
    host_total = host.get("Total", 0) if isinstance(host, dict) else 0
    return total, cats, host_total


def compare(traced: Traced, est) -> dict:
    """The traced peak beside the analytic plan's: allocated peaks (what `torch.cuda.max_memory_allocated` reports)
    and totals (with the untraceable terms added to the traced side), in GiB, with the ratio traced / analytic."""
    analytic = est.allocated_peak_gib
    return {"traced_allocated_gib": round(traced.peak_gib, 3), "analytic_allocated_gib": round(analytic, 3),
            "ratio": round(traced.peak_gib / analytic, 3) if analytic else None,
            "traced_total_gib": round(traced.total_gib, 3), "analytic_total_gib": round(est.gpu_peak_gib, 3),
            "categories_gib": {k: round(v, 3) for k, v in traced.categories.items() if v >= 0.0005},
            "host_offloaded_gib": round(traced.host_gib, 3),
            "added_gib": {k: round(v, 3) for k, v in {**traced.added_allocated, **traced.added}.items()},
            "untraced": traced.untraced, "seconds": round(traced.seconds, 1)}


def format_comparison(traced: Traced, est) -> str:
    """The traced categories, the analytic plan's counted terms, and the two peaks with their ratio."""
    c = compare(traced, est)
    unit = "per process (CPU)" if est.device == "cpu" else "per GPU"
    lines = [f"Traced {unit}: one training step of one rank under fake tensors ({c['seconds']:.0f} s)"]
    w = max([len(k) for k in c["categories_gib"]] + [len(t.name) for t in est.gpu_terms] + [28])
    lines.append(f"  {'traced category (at the peak)':<{w}}  {'GiB':>8}")
    for name, gib in c["categories_gib"].items():
        lines.append(f"  {name:<{w}}  {gib:8.2f}")
    if c["host_offloaded_gib"]:
        lines.append(f"  {'(host: offloaded checkpoints)':<{w}}  {c['host_offloaded_gib']:8.2f}")
    lines.append(f"  {'traced peak':<{w}}  {traced.traced_gib:8.2f}")
    for name, gib in traced.added_allocated.items():
        lines.append(f"  {'+ ' + name:<{w}}  {gib:8.2f}")
    lines.append(f"  {'allocated peak':<{w}}  {c['traced_allocated_gib']:8.2f}  analytic "
                 f"{c['analytic_allocated_gib']:.2f}, ratio traced/analytic {c['ratio']:.2f}")
    for name, gib in traced.added.items():
        lines.append(f"  {'+ ' + name:<{w}}  {gib:8.2f}")
    lines.append(f"  {'traced total':<{w}}  {c['traced_total_gib']:8.2f}  analytic {c['analytic_total_gib']:.2f}")
    for line in c["untraced"]:
        lines.append(f"Not traced: {line}.")
    return "\n".join(lines)
