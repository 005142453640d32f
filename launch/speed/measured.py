"""Throughput, MFU and memory of a run, from what its ranks measured (`launch.rank.measure`), beside the
planner's prediction; and the longest-length search of `python -m launch bench --max-length auto`.

`report(folder, arch, seq_len, estimate)` combines the ranks' files (`summarize`) with the planner's
prediction and `format_report` prints it.

MFU, in two conventions, both against the GPU's dense BF16 peak (`launch.facts.gpus`; an unknown GPU or a CPU gets no
number, and the summary says so), recomputation never counted:
- non-causal (torchtitan `get_dense_model_nparams_and_flops`, llm-foundry): FLOPs per token = 6 N + 12 L H d S;
- causal-discounted (TRL PR #6846's MFU, DeepSpeed-Ulysses): 6 N + 6 L H d S, the attention term halved because a
  causal kernel skips the masked half (at 8K tokens the two differ by ~14% for an 8B model, at 1M by ~2x).
N = the parameters used in matrix multiplies: every layer's and the LM head's (also when tied to the embeddings: the
head is still a matmul), not the input embedding table (a lookup); L layers, H query heads of dimension d, S the
run's max_length (the attention span: exact for synthetic rows and packed rows of max_length, an upper bound, so an
overstated MFU, for padded batches of shorter rows).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from launch.facts import gpus
from launch.rank import run_files  # names only

CONVENTIONS = {
    "mfu": "non-causal: 6N + 12*L*H*d*S FLOPs per token (torchtitan, llm-foundry; recomputation not counted)",
    "mfu_causal": "causal-discounted: 6N + 6*L*H*d*S FLOPs per token (attention halved; TRL PR #6846)",
    "hfu": "HFU: what the GPU executes, the causal-discounted FLOPs plus activation checkpointing's recomputed "
           "forward (2*N_layers + 2*L*H*d*S per token; launch/speed/model.py)",
    "mfu_frozen_base": "frozen base (NeMo Automodel's LoRA convention): the causal-discounted FLOPs x (2 + trainable / "
                       "frozen) / 3, no weight-gradient matmuls for the frozen base",
}


def flops_per_token(matmul_params: int, num_layers: int, num_heads: int, head_dim: int, seq_len: int,
                    causal: bool = False) -> float:
    """Training FLOPs per token (forward + backward): 6 N + 12 L H d S, or with `causal` 6 N + 6 L H d S."""
    attention = 12 * num_layers * num_heads * head_dim * seq_len
    return 6 * matmul_params + (attention // 2 if causal else attention)


def flops_params(arch) -> int:
    """N of the MFU formulas for a `launch.memory.Architecture`: all parameters but the input embedding table, plus
    the LM head when it is tied to that table (then `num_params` counts the shared matrix once, as the embedding)."""
    return arch.num_params - arch.embedding_params + (arch.lm_head_params if arch.tie_word_embeddings else 0)


def mfu(tokens_per_second_per_gpu: float, fpt: float, peak: float | None) -> float | None:
    return None if not peak else tokens_per_second_per_gpu * fpt / peak


# ---- launcher side -----------------------------------------------------------------------------------------------
# (measured key in a rank's "memory", label, key of the prediction it is compared with)
MEMORY_FIGURES = [
    ("max_allocated_gib", "peak allocated (torch)", "allocated_gib"),
    ("max_reserved_gib", "peak reserved (torch)", "reserved_gib"),
    ("device_used_gib", "device memory in use (driver)", "device_gib"),
    ("peak_rss_gib", "peak RSS per process", "rss_gib"),
    ("host_used_gib", "host memory in use (node)", None),
]


def _read_ranks(folder: Path) -> list[dict]:
    ranks = []
    for path in sorted(folder.glob(run_files.RANK_FILES)):
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(ranks, key=lambda r: r.get("rank", 0))


def summarize(folder: Path, arch=None, seq_len: int | None = None, flops: dict | None = None) -> dict | None:
    """Combine the ranks' files into per-step, per-rank and overall figures; None when no rank wrote any. `flops`:
    FLOPs per token in the throughput model's other conventions (`launch.speed.model.flops_by_convention`):
    "hardware" gives the HFU (recomputation counted), "frozen_base_causal" an adapter run's MFU in NeMo's convention."""
    ranks = _read_ranks(folder)
    if not ranks:
        return None
    warmup = ranks[0]["warmup"]
    device = ranks[0]["device"]
    n_steps = min(len(r["steps"]) for r in ranks)
    if arch is not None and seq_len:
        n = flops_params(arch)
        fpt = flops_per_token(n, arch.num_layers, arch.num_attention_heads, arch.head_dim, seq_len)
        fpt_causal = flops_per_token(n, arch.num_layers, arch.num_attention_heads, arch.head_dim, seq_len, True)
    else:
        fpt = fpt_causal = None
    peak = gpus.peak_bf16(device) if device != "cpu" else None
    per_step = []
    for i in range(n_steps):
        rows = [r["steps"][i] for r in ranks]
        step_time = max(row["time_s"] for row in rows)  # the step ends when the slowest rank ends it
        tokens_per_gpu = sum(row["tokens"] for row in rows) / len(rows)
        tps = tokens_per_gpu / step_time if step_time else 0.0
        real = _real(rows, len(rows))
        per_step.append({"step": rows[0]["step"], "time_s": step_time, "tokens_per_s_per_gpu": tps,
                         "non_pad_tokens_per_s_per_gpu": real / step_time if real is not None and step_time else None,
                         "mfu": mfu(tps, fpt, peak) if fpt else None,
                         "mfu_causal": mfu(tps, fpt_causal, peak) if fpt_causal else None})

    # Overall: from the last synchronised mark every rank reached (the slowest rank's time), else the step sum.
    marked = [r.get("marks") or [] for r in ranks]
    common = min((m[-1]["steps"] for m in marked), default=0) if all(marked) else 0
    if common > 0:
        at = [next(x for x in m if x["steps"] == common) for m in marked]
        total_time = max(x["time_s"] for x in at)
        total_tokens = sum(x["tokens"] for x in at) / len(at)
        total_real = _real(at, len(at))
        measured_steps, timing = common, "synchronised marks"
    else:
        total_time = sum(s["time_s"] for s in per_step)
        total_tokens = sum(sum(r["steps"][i]["tokens"] for r in ranks) / len(ranks) for i in range(n_steps))
        reals = [_real([r["steps"][i] for r in ranks], len(ranks)) for i in range(n_steps)]
        total_real = None if None in reals else sum(reals)
        measured_steps, timing = len(per_step), "sum of per-step times"
    tps = total_tokens / total_time if total_time else None
    # the non-pad tokens the ranks counted (launch.rank.measure.real_tokens); None from ranks that counted none
    real_tps = total_real / total_time if total_real is not None and total_time else None

    per_rank = []
    for r in ranks:
        entry = {"rank": r.get("rank"), "steps": len(r["steps"])}
        entry.update({k: v for k, v in (r.get("memory") or {}).items() if v is not None})
        per_rank.append(entry)

    def worst(key):
        values = [p[key] for p in per_rank if p.get(key) is not None]
        return max(values) if values else None

    if peak:
        note = None
    elif device == "cpu":
        note = "a CPU run has no GPU peak to compare with"
    else:
        note = f"{device} is not in the table of known GPU peaks (launch/facts/gpus.py GPUS)"
    overall = {
        "measured_steps": measured_steps,
        "warmup_steps": warmup,
        "timing": timing + ("; every step synchronised" if ranks[0].get("sync_every_step") else ""),
        "step_time_s_median": statistics.median(s["time_s"] for s in per_step) if per_step else None,
        "step_time_s_mean": total_time / measured_steps if measured_steps else None,
        "tokens_per_s_per_gpu": tps,
        "tokens_per_s": tps * len(ranks) if tps is not None else None,  # the job's: all ranks together
        "non_pad_tokens_per_s_per_gpu": real_tps,
        "non_pad_tokens_per_s": real_tps * len(ranks) if real_tps is not None else None,
        "padding_fraction": 1 - total_real / total_tokens if total_real is not None and total_tokens else None,
        "seq_len": seq_len,
        "flops_per_token": fpt,
        "flops_per_token_causal": fpt_causal,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": mfu(tps, fpt, peak) if fpt and tps else None,
        "mfu_causal": mfu(tps, fpt_causal, peak) if fpt_causal and tps else None,
        "mfu_convention": CONVENTIONS["mfu"] + (f", against {peak / 1e12:.0f} TFLOP/s dense BF16 ({device})" if peak
                                                else ", against no known peak"),
        "mfu_causal_convention": CONVENTIONS["mfu_causal"],
        "hfu": mfu(tps, flops["hardware"], peak) if flops and tps and "hardware" in flops else None,
        "hfu_convention": CONVENTIONS["hfu"],
        "mfu_frozen_base_causal": mfu(tps, flops["frozen_base_causal"], peak)
        if flops and tps and "frozen_base_causal" in flops else None,
        "mfu_frozen_base_convention": CONVENTIONS["mfu_frozen_base"]
        if flops and "frozen_base_causal" in flops else None,
        "mfu_note": note,
        "peak_allocated_gib": worst("max_allocated_gib"),
        "peak_reserved_gib": worst("max_reserved_gib"),
        "device_used_gib": worst("device_used_gib"),
        "peak_rss_gib_per_process": worst("peak_rss_gib"),
        "host_used_gib": worst("host_used_gib"),
        "device": device,
        "power_limit_w": ranks[0].get("power_limit_w"),
        "ranks": len(ranks),
    }
    return {"overall": overall, "per_step": per_step, "per_rank": per_rank}


def _real(rows: list[dict], n: int) -> float | None:
    """The non-pad tokens per rank of a step's (or a mark's) rows; None if a rank did not count them."""
    values = [row.get("real_tokens") for row in rows]
    return None if None in values else sum(values) / n


def prediction(estimate) -> dict | None:
    """The planner's figures comparable with the measured ones, from a `launch.memory.Estimate` (duck-typed): on
    GPU the allocated peak, the reserved peak (the total without the CUDA-context/NCCL term, which PyTorch does not
    count) and the device total; on CPU the peak resident set per process."""
    if estimate is None:
        return None
    if getattr(estimate, "device", "gpu") == "cpu":
        return {"rss_gib": estimate.gpu_peak_gib, "device": "cpu"}
    context = sum(t.gib for t in estimate.gpu_terms if t.counted and t.name.startswith("CUDA context"))
    return {"allocated_gib": estimate.allocated_peak_gib, "reserved_gib": estimate.gpu_peak_gib - context,
            "device_gib": estimate.gpu_peak_gib, "device": "gpu", "peak_phase": getattr(estimate, "peak_phase", None)}


def memory_vs_plan(summary: dict, predicted: dict | None) -> list[dict]:
    """One row per measured memory figure: each rank's value, the largest, the planner's prediction and the ratio
    measured / predicted (None where the planner predicts nothing comparable)."""
    rows = []
    for key, label, pkey in MEMORY_FIGURES:
        values = [p.get(key) for p in summary["per_rank"]]
        if all(v is None for v in values):
            continue
        measured = max(v for v in values if v is not None)
        want = (predicted or {}).get(pkey) if pkey else None
        rows.append({"what": label, "per_rank_gib": values, "measured_gib": measured, "predicted_gib": want,
                     "ratio": measured / want if want else None})
    return rows


def report(folder: Path, arch=None, seq_len: int | None = None, estimate=None, flops: dict | None = None,
           predicted_tokens_per_s_per_gpu: float | None = None) -> dict | None:
    """What the launcher puts under "bench" in run_summary.json: `summarize` plus the planner's prediction beside
    every measured memory figure, and the throughput model's tokens/s per GPU beside the measured (`flops` and the
    prediction: `launch.speed.model`, computed by the caller). None when no rank wrote measurements."""
    summary = summarize(folder, arch, seq_len, flops)
    if summary is None:
        return None
    predicted = prediction(estimate)
    if predicted is not None and predicted_tokens_per_s_per_gpu is not None:
        predicted["tokens_per_s_per_gpu"] = predicted_tokens_per_s_per_gpu
    summary["predicted"] = predicted
    summary["memory_vs_plan"] = memory_vs_plan(summary, predicted)
    return summary


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def format_report(summary: dict, per_step: bool = True) -> str:
    """The report as printed: overall figures, each rank's memory beside the planner's, and with `per_step` the
    table of measured steps (a long run without --bench may leave it out)."""
    o = summary["overall"]
    # each rank is a GPU on GPU, a process on CPU (the key keeps its name: tokens_per_s_per_gpu)
    unit, short = ("process", "proc") if o["device"] == "cpu" else ("GPU", "GPU")
    lines = [f"bench: {o['measured_steps']} measured step(s) after {o['warmup_steps']} warm-up, {o['ranks']} rank(s) "
             f"on {o['device']}" + (f" ({o['power_limit_w']:.0f} W limit)" if o.get("power_limit_w") else "")
             + f"; timing: {o.get('timing', '-')}"]
    mfu_shown = o["mfu"] is not None
    if per_step:
        lines.append(f"  {'step':>5} {'time (s)':>10} {'tokens/s/' + short:>13}"
                     + (f" {'MFU':>7} {'MFU causal':>11}" if mfu_shown else ""))
    for s in summary["per_step"] if per_step else []:
        lines.append(f"  {s['step']:>5} {s['time_s']:>10.3f} {s['tokens_per_s_per_gpu']:>13.1f}"
                     + (f" {_pct(s['mfu']):>7} {_pct(s.get('mfu_causal')):>11}" if mfu_shown else ""))
    if o["tokens_per_s_per_gpu"] is not None:
        if mfu_shown:
            mfu_text = f"MFU {_pct(o['mfu'])} non-causal, {_pct(o.get('mfu_causal'))} causal-discounted"
        elif o.get("mfu_note"):
            mfu_text = f"MFU omitted ({o['mfu_note']})"
        else:
            mfu_text = "MFU omitted (the model's architecture or the sequence length is unknown)"
        median = f"step {o['step_time_s_median']:.3f} s (median), " if o["step_time_s_median"] is not None else ""
        if mfu_shown and o.get("hfu") is not None:
            mfu_text += f", HFU {_pct(o['hfu'])}"
        if mfu_shown and o.get("mfu_frozen_base_causal") is not None:
            mfu_text += f", frozen-base MFU {_pct(o['mfu_frozen_base_causal'])} (NeMo's convention)"
        want = (summary.get("predicted") or {}).get("tokens_per_s_per_gpu")
        expected = f"; predicted {want:,.0f} per {unit} (launch/speed/model.py)" if want and o["device"] != "cpu" \
            else ""
        # tokens_per_s: the figure run_summary.json also holds as `tokens_per_second` (launch.run.runner)
        lines.append(f"  overall: {median}{o['tokens_per_s']:.1f} tokens/s ({o['tokens_per_s_per_gpu']:.1f} per "
                     f"{unit}{expected}), {mfu_text}")
        if o.get("non_pad_tokens_per_s") is not None:
            lines.append(f"  non-pad: {o['non_pad_tokens_per_s']:.1f} tokens/s "
                         f"({o['non_pad_tokens_per_s_per_gpu']:.1f} per {unit}); padding "
                         f"{_pct(o['padding_fraction'])} of the tokens processed (counted per micro-batch from "
                         "its attention_mask, or its position_ids when padding-free)")
    if mfu_shown:  # the conventions of the figures above; an omitted MFU has none to explain
        lines.append(f"  MFU {o['mfu_convention']}")
        lines.append(f"  MFU {o.get('mfu_causal_convention', CONVENTIONS['mfu_causal'])}")
        if o.get("hfu") is not None:
            lines.append(f"  {o['hfu_convention']}")
        if o.get("mfu_frozen_base_convention"):
            lines.append(f"  MFU {o['mfu_frozen_base_convention']}")
    rows = summary.get("memory_vs_plan")
    if rows is None:  # summarize() alone: the measured figures, no prediction
        rows = memory_vs_plan(summary, None)
    if rows:
        n = len(summary["per_rank"])
        ranks = [f"rank {p.get('rank')}" for p in summary["per_rank"]] if n <= 8 else []
        head = f"  {'memory (GiB)':<30}" + "".join(f"{r:>9}" for r in ranks) + f"{'max':>9}{'planner':>9}{'ratio':>7}"
        lines.append(head)
        for row in rows:
            cells = "".join(f"{v:>9.2f}" if v is not None else f"{'-':>9}" for v in row["per_rank_gib"]) \
                if ranks else ""
            want = f"{row['predicted_gib']:>9.2f}" if row["predicted_gib"] is not None else f"{'-':>9}"
            ratio = f"{row['ratio']:>7.2f}" if row["ratio"] is not None else f"{'-':>7}"
            lines.append(f"  {row['what']:<30}{cells}{row['measured_gib']:>9.2f}{want}{ratio}")
        lines.append("  ratio = measured / planner (launch.memory); planner goal: within 15% of the measured peak")
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

