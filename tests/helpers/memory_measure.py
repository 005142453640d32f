"""Re-measuring the memory model's CPU constants (launch/memory/constants.py): each starts a subprocess that imports
the training stack, so they live with the tests, which run them only on request (MEMORY_MEASURE=1)."""

from __future__ import annotations


def measure_cpu_runtime_baseline_gib() -> float:
    """Re-measure CPU_RUNTIME_BASELINE_GIB: VmRSS of a fresh interpreter after importing the training stack. Runs a
    subprocess (several seconds); used by the tests only on request."""
    import subprocess
    import sys

    code = (
        "import torch, transformers, accelerate, deepspeed, trl\n"
        "from trl import SFTTrainer, SFTConfig\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 2**20


def measure_cpu_deepspeed_engine_gib(stage: int = 3) -> float:
    """Re-measure CPU_DEEPSPEED_ENGINE_GIB: a fresh process builds a bare ZeRO engine (gloo, one rank, a 0.5M-parameter
    model, DeepSpeed's default buckets), takes two steps, and reports the VmRSS growth since before
    `deepspeed.initialize` (minus the model states, 16 bytes per parameter). Runs a subprocess (~30 s)."""
    import os
    import subprocess
    import sys

    code = f"""
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch, deepspeed
def rss():
    return int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) * 1024
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
cfg = {{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": {stage}}},
       "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "torch_adam": True}}}}}}
deepspeed.init_distributed(dist_backend="gloo")
before = rss()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
for _ in range(2):
    loss = engine(torch.randn(4, 512)).sum()
    engine.backward(loss)
    engine.step()
states = 16 * sum(p.numel() for p in model.parameters())
print(rss() - before - states)
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1]) / 2**30


def measure_fused_lm_head_peak_bytes(tokens: int, vocab: int, hidden: int) -> int:
    """Resident-set growth of a fresh process over one forward + backward of TRL's fused LM head
    (`ChunkedLogProbFunction`, the CPU path without Triton, fp32, SFTTrainer's outputs) at [tokens, hidden] x
    [vocab, hidden]: the peak (VmHWM, reset through /proc/self/clear_refs once the inputs exist) minus the resident
    set before the forward. A tiny call first imports what the backward imports lazily (trl.trainer.utils), so only
    the function's own memory is counted. Runs a subprocess (~10 s)."""
    import subprocess
    import sys

    code = f"""
import torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction
import trl.trainer.utils  # the backward's lazy import, done before measuring
def status(key):
    return int([l for l in open('/proc/self/status') if l.startswith(key)][0].split()[1]) * 1024
outputs = ("log_probs", "entropy", "is_top1")
def step(n):
    w = torch.nn.Parameter(torch.randn({vocab}, {hidden}) * 0.02)
    h = torch.randn(n, {hidden}, requires_grad=True)
    t = torch.randint(0, {vocab}, (n,))
    return w, h, t
w, h, t = step(8)
(-ChunkedLogProbFunction.apply(h, w, None, t, 1.0, 32768, None, 1.0, outputs)[0].sum()).backward()
del w, h, t
w, h, t = step({tokens})
before = status("VmRSS")
open('/proc/self/clear_refs', 'w').write('5')  # VmHWM := VmRSS
(-ChunkedLogProbFunction.apply(h, w, None, t, 1.0, 32768, None, 1.0, outputs)[0].sum()).backward()
print(status("VmHWM") - before)
"""
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])
