"""`--bench`: what a run measures about itself, per step and overall, and `bench --max-length auto`.

Measured in the ranks (`BenchCallback`, added by `launch.monitor` when the launcher sets LAUNCH_BENCH):
- step time: wall time from the optimizer step's first micro-batch to its end, with `torch.cuda.synchronize()` on
  GPU so that the time is the kernels', not the launch queue's;
- tokens: the tokens each rank's model embeds during the step (a forward pre-hook on the input embeddings, so
  padding counts, and under CP/SP each rank counts its own shard);
- memory: `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` over the measured steps (GPU); the process's
  peak resident set size (`ru_maxrss`, whole process lifetime) and host memory in use (CPU and GPU runs).
Warm-up steps (default 2: the first step allocates optimizer states, compiles kernels, fills caches) are excluded.

MFU convention (torchtitan, `torchtitan/models/utils.py` get_dense_model_nparams_and_flops): model FLOPs per token =
6 N + 12 L H d S, where N = parameters without the input embedding table, L layers, H query heads of dimension d,
S the sequence length; no causal discount; activation recomputation not counted. MFU = FLOPs per token x tokens per
second per GPU / the GPU's dense BF16 peak (table below). An unknown GPU, or a CPU, gets no MFU, and says so.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

DEFAULT_WARMUP = 2

# Dense (no sparsity) BF16 tensor-core peak, FLOP/s, from NVIDIA's data sheets. Matched against
# torch.cuda.get_device_name() by substring, most specific first.
GPU_PEAK_BF16 = [
    ("H100 NVL", 835e12),  # H100 data sheet, NVL column: 1,671 TFLOPS with sparsity
    ("H100 PCIe", 756e12),  # H100 data sheet, PCIe column: 1,513 TFLOPS with sparsity
    ("H100", 989e12),  # H100 SXM: 1,979 TFLOPS with sparsity (torchtitan uses 989e12)
    ("H200", 989e12),  # H200 data sheet (SXM): 1,979 TFLOPS with sparsity
    ("GH200", 989e12),  # GH200 data sheet: 1,979 TFLOPS with sparsity
    ("B200", 2250e12),  # HGX B200: 4.5 PFLOPS with sparsity per GPU
    ("A100", 312e12),  # A100 data sheet (SXM and PCIe): 624 TFLOPS with sparsity
    ("L40S", 362e12),  # L40S data sheet: 733 TFLOPS with sparsity
    ("A10G", 70e12),  # AWS A10G (data sheet of g5 instances)
    ("A10", 125e12),  # A10 data sheet: 250 TFLOPS with sparsity
]


def gpu_peak_flops(name: str | None) -> float | None:
    if not name:
        return None
    for key, peak in GPU_PEAK_BF16:
        if key in name:
            return peak
    return None


def flops_per_token(matmul_params: int, num_layers: int, num_heads: int, head_dim: int, seq_len: int) -> float:
    """torchtitan's 6 N + 12 L H d S (training: forward + backward), no causal discount."""
    return 6 * matmul_params + 12 * num_layers * num_heads * head_dim * seq_len


def mfu(tokens_per_second_per_gpu: float, fpt: float, peak: float | None) -> float | None:
    return None if not peak else tokens_per_second_per_gpu * fpt / peak


# ---- rank side -------------------------------------------------------------------------------------------------
def bench_callback(folder: Path, warmup: int):
    import resource

    import torch
    from transformers import TrainerCallback

    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()

    class BenchCallback(TrainerCallback):
        def __init__(self):
            self.steps: list[dict] = []
            self.tokens = 0
            self.t0 = None
            self.hook = None
            self.peak = {}

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            embeddings = model.get_input_embeddings() if model is not None else None
            if embeddings is not None:
                self.hook = embeddings.register_forward_pre_hook(self._count)

        def _count(self, module, inputs):
            if inputs and hasattr(inputs[0], "numel") and module.training:
                self.tokens += int(inputs[0].numel())

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
                if len(self.steps) == warmup:
                    torch.cuda.reset_peak_memory_stats()
            self.tokens = 0
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            step = {"step": state.global_step, "time_s": time.perf_counter() - self.t0, "tokens": self.tokens}
            if cuda:
                step["max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
                step["max_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            step["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
            step["host_used_gib"] = _host_used_gib()
            self.steps.append(step)
            if len(self.steps) % 10 == 0:
                self._write(state)

        def on_train_end(self, args, state, control, **kwargs):
            if self.hook is not None:
                self.hook.remove()
            self._write(state)

        def _write(self, state):
            info = {"rank": rank, "warmup": warmup, "device": _device_name(), "steps": self.steps}
            try:
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f"rank{rank}.tmp"
                tmp.write_text(json.dumps(info))
                os.replace(tmp, folder / f"rank{rank}.json")
            except OSError:
                pass

    return BenchCallback()


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def _host_used_gib() -> float | None:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return (vm.total - vm.available) / 2**30
    except Exception:  # noqa: BLE001 - psutil missing: host memory is not reported
        return None


# ---- launcher side -----------------------------------------------------------------------------------------------
def summarize(folder: Path, arch=None, seq_len: int | None = None) -> dict | None:
    """Combine the ranks' files into per-step and overall figures; None when no rank wrote any."""
    ranks = []
    for path in sorted(folder.glob("rank*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not ranks:
        return None
    warmup = ranks[0]["warmup"]
    device = ranks[0]["device"]
    n_steps = min(len(r["steps"]) for r in ranks)
    measured = list(range(warmup, n_steps))
    fpt = (flops_per_token(arch.matmul_params, arch.num_layers, arch.num_attention_heads, arch.head_dim, seq_len)
           if arch is not None and seq_len else None)
    peak = gpu_peak_flops(device) if device != "cpu" else None
    per_step = []
    for i in measured:
        rows = [r["steps"][i] for r in ranks]
        step_time = max(row["time_s"] for row in rows)  # the step ends when the slowest rank ends it
        tokens_per_gpu = sum(row["tokens"] for row in rows) / len(rows)
        tps = tokens_per_gpu / step_time if step_time else 0.0
        per_step.append({"step": rows[0]["step"], "time_s": step_time, "tokens_per_s_per_gpu": tps,
                         "mfu": mfu(tps, fpt, peak) if fpt else None})
    total_time = sum(s["time_s"] for s in per_step)
    total_tokens = sum(sum(r["steps"][i]["tokens"] for r in ranks) / len(ranks) for i in measured)

    def worst(key):
        values = [r["steps"][-1].get(key) for r in ranks if r["steps"] and r["steps"][-1].get(key) is not None]
        return max(values) if values else None

    overall = {
        "measured_steps": len(per_step),
        "warmup_steps": warmup,
        "step_time_s_median": statistics.median(s["time_s"] for s in per_step) if per_step else None,
        "step_time_s_mean": total_time / len(per_step) if per_step else None,
        "tokens_per_s_per_gpu": total_tokens / total_time if total_time else None,
        "mfu": (mfu(total_tokens / total_time, fpt, peak) if fpt and total_time else None),
        "mfu_convention": ("torchtitan: 6N + 12*L*H*d*S FLOPs per token, no causal discount, recomputation not "
                           f"counted, against {'%.0f TFLOP/s dense BF16 (' % (peak / 1e12) + device + ')' if peak else 'no known peak'}"),
        "mfu_note": None if peak else (f"{device} is not in the table of known GPU peaks"
                                       if device != "cpu" else "a CPU run has no GPU peak to compare with"),
        "peak_allocated_gib": worst("max_allocated_gib"),
        "peak_reserved_gib": worst("max_reserved_gib"),
        "peak_rss_gib_per_process": worst("peak_rss_gib"),
        "host_used_gib": worst("host_used_gib"),
        "device": device,
        "ranks": len(ranks),
    }
    return {"overall": overall, "per_step": per_step}


def compare_with_plan(measured: dict, predicted: dict | None, device: str) -> dict | None:
    """Predicted vs measured peak memory, with the relative error (GPU: reserved, per GPU; CPU: RSS per process)."""
    if not predicted or not measured:
        return None
    if device == "cpu":
        have, want, what = measured.get("peak_rss_gib_per_process"), predicted.get("cpu_rss_gib"), "peak RSS per process"
    else:
        have, want, what = measured.get("peak_reserved_gib"), predicted.get("gpu_peak_gib"), "peak reserved per GPU"
    if have is None or want is None:
        return None
    return {"what": what, "predicted_gib": want, "measured_gib": have, "relative_error": (want - have) / have}


def format_summary(summary: dict, comparison: dict | None) -> str:
    o = summary["overall"]
    lines = [f"bench: {o['measured_steps']} measured step(s) after {o['warmup_steps']} warm-up, {o['ranks']} rank(s) "
             f"on {o['device']}"]
    lines.append(f"  {'step':>5} {'time (s)':>10} {'tokens/s/GPU':>13} {'MFU':>7}")
    for s in summary["per_step"]:
        m = f"{100 * s['mfu']:.1f}%" if s["mfu"] is not None else "-"
        lines.append(f"  {s['step']:>5} {s['time_s']:>10.3f} {s['tokens_per_s_per_gpu']:>13.1f} {m:>7}")
    if o["step_time_s_median"] is not None:
        lines.append(f"  overall: step {o['step_time_s_median']:.3f} s (median), "
                     f"{o['tokens_per_s_per_gpu']:.1f} tokens/s per GPU, MFU "
                     + (f"{100 * o['mfu']:.1f}%" if o["mfu"] is not None else f"omitted ({o['mfu_note']})"))
    lines.append(f"  MFU convention: {o['mfu_convention']}")
    labels = {"peak_allocated_gib": "peak allocated per GPU", "peak_reserved_gib": "peak reserved per GPU",
              "peak_rss_gib_per_process": "peak RSS per process", "host_used_gib": "host memory in use"}
    mem = [f"{label} {o[k]:.2f} GiB" for k, label in labels.items() if o.get(k) is not None]
    lines.append("  memory: " + ", ".join(mem))
    if comparison:
        lines.append(f"  planner: {comparison['what']} predicted {comparison['predicted_gib']:.2f} GiB, measured "
                     f"{comparison['measured_gib']:.2f} GiB ({100 * comparison['relative_error']:+.1f}%)")
    return "\n".join(lines)


# ---- bench --max-length auto -------------------------------------------------------------------------------------
def search_longest(start: int, multiple: int, trial, upper: int | None = None, max_tries: int = 8) -> tuple[int, list]:
    """The longest length (a multiple of `multiple`) for which trial(length) -> (ok, detail) trains, starting from
    the planner's answer: one step of 25% up (or down), then doubling (or halving) until the result flips, then
    bisecting between the last length that trained and the first that did not. Returns (longest, tries); longest 0
    if nothing trained within max_tries."""
    def snap(n):
        return max(multiple, int(n) // multiple * multiple)

    tries: list[tuple[int, bool, str]] = []

    def attempt(n):
        ok, detail = trial(n)
        tries.append((n, ok, detail))
        return ok

    good, bad = 0, None
    n = snap(start)
    factor = 1.25
    if attempt(n):
        good = n
        while len(tries) < max_tries and (upper is None or n < upper):
            n = max(snap(n * factor), n + multiple)
            factor = 2.0
            if upper is not None:
                n = min(n, snap(upper))
            if not attempt(n):
                bad = n
                break
            good = n
    else:
        bad = n
        factor = 0.75
        while len(tries) < max_tries and n > multiple:
            n = snap(n * factor)
            factor = 0.5
            if attempt(n):
                good = n
                break
            bad = n
    while bad is not None and good and bad - good > multiple and len(tries) < max_tries:
        mid = snap((good + bad) // 2)
        if mid in (good, bad):
            break
        if attempt(mid):
            good = mid
        else:
            bad = mid
    return good, tries
