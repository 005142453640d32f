"""The memory table as `plan`, `--dry-run` and the preflight print it."""

from __future__ import annotations

from launch.memory.estimate import fits
from launch.memory.results import Estimate


def format_table(est: Estimate, gpu_memory_gib: float, host_memory_gib: float | None = None) -> str:
    """The per-GPU table (term, GiB, setting), the host table, total vs budget, headroom and a verdict line."""
    unit = "per process (CPU)" if est.device == "cpu" else "per GPU"
    lines = [f"Memory {unit} (peak phase: {est.peak_phase}; per-rank length {est.per_rank_length} tokens)"]
    w = max([len(t.name) for t in est.gpu_terms + est.host_terms] + [20])
    lines.append(f"  {'term':<{w}}  {'GiB':>8}  setting")
    for t in est.gpu_terms:
        mark = "" if t.counted else "  (other phase, not in the total)"
        lines.append(f"  {t.name:<{w}}  {t.gib:8.2f}  {t.setting}{mark}")
    lines.append(f"  {'total':<{w}}  {est.gpu_peak_gib:8.2f}  budget {gpu_memory_gib:.2f} GiB, "
                 f"headroom {gpu_memory_gib - est.gpu_peak_gib:+.2f} GiB")
    if est.host_terms:
        lines.append("Host memory per process")
        for t in est.host_terms:
            mark = "" if t.counted else "  (before training; not in the per-process total)"
            lines.append(f"  {t.name:<{w}}  {t.gib:8.2f}  {t.setting}{mark}")
        budget = f"budget {host_memory_gib:.1f} GiB" if host_memory_gib is not None else "no budget given"
        lines.append(f"  {'total per process':<{w}}  {est.host_per_process_gib:8.2f}")
        lines.append(f"  {'total per node':<{w}}  {est.host_per_node_gib:8.2f}  {budget}")
    ok = fits(est, gpu_memory_gib, host_memory_gib)
    verdict = "fits" if ok else "does NOT fit"
    lines.append(f"Verdict: {verdict}. {est.advice(gpu_memory_gib, host_memory_gib)}")
    for note in est.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)
