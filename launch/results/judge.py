"""Judging a smoke run against its recipe's expected metrics, and recording them (`python -m launch record`).

The per-step comparison is `launch.results.stepdiff`'s (aligned by step, NaN-aware); the tolerances and bounds are the
expected-metrics file's (`launch.results.expected`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from launch.errors import LaunchError
from launch.results.expected import TOLERANCE, bounds_for, profile_entry, read_expected, smoke_gpu
from launch.facts.machine import cpu_model, gpu_driver, gpu_info, installed_versions
from launch.results.stepdiff import METRICS, by_step, step_difference

# Exit statuses of a judged smoke run (README: "Exit status").
PASSED, MISSED, NO_REFERENCE, UNREADABLE_REFERENCE = 0, 1, 3, 4


def compare(expected: dict, observed: dict, tolerance: dict | None = None) -> dict:
    """Judge observed per-step metrics against an expected profile entry. Returns a verdict dict with `passed`,
    per-check results and the per-step table rows."""
    tolerance = tolerance or TOLERANCE
    checks, rows = [], []
    exp = expected["steps"]  # recorded for steps 1..n (by_step's default)
    for metric in METRICS:
        diff = step_difference(exp, observed, metric)
        tol = tolerance[metric]
        if not diff.complete:
            checks.append({"check": f"{metric} steps", "passed": False,
                           "detail": f"expected {diff.n_reference} logged steps, observed {diff.n_run}"})
            continue
        checks.append({"check": f"{metric} max |diff|", "value": diff.max_abs, "limit": tol["max_abs"],
                       "passed": diff.within(tol["max_abs"])})
        checks.append({"check": f"{metric} mean diff", "value": diff.mean, "limit": tol["mean"],
                       "passed": bool(diff.steps) and abs(diff.mean) <= tol["mean"]})
        reference, run = by_step(exp, metric), by_step(observed, metric)
        for step, d in zip(diff.steps, diff.diffs):
            rows.append({"step": step, "metric": metric, "expected": reference[step], "observed": run[step], "diff": d,
                         "passed": abs(d) <= tol["max_abs"]})
    losses = observed.get("loss", [])
    bounds = expected.get("bounds")
    if bounds and losses:
        lo, hi = bounds["first_loss"]
        checks.append({"check": "first loss in range", "value": losses[0], "limit": [lo, hi],
                       "passed": lo <= losses[0] <= hi})
        lo, hi = bounds["last_loss"]
        checks.append({"check": "last loss in range", "value": losses[-1], "limit": [lo, hi],
                       "passed": lo <= losses[-1] <= hi})
        drop = (losses[0] - losses[-1]) / losses[0]
        checks.append({"check": "loss falls", "value": drop, "limit": f">= {bounds['min_relative_drop']}",
                       "passed": drop >= bounds["min_relative_drop"]})
    return {"passed": bool(checks) and all(c["passed"] for c in checks), "checks": checks, "rows": rows}


def format_verdict(verdict: dict) -> str:
    lines = [f"{'step':>4}  {'metric':<9} {'expected':>12} {'observed':>12} {'diff':>11}  verdict"]
    for r in verdict["rows"]:
        lines.append(f"{r['step']:>4}  {r['metric']:<9} {r['expected']:>12.6f} {r['observed']:>12.6f} "
                     f"{r['diff']:>11.2e}  {'ok' if r['passed'] else 'MISS'}")
    lines.append("")
    for c in verdict["checks"]:
        value = c.get("value")
        shown = f"{value:.3g}" if isinstance(value, float) else str(value if value is not None else c.get("detail"))
        lines.append(f"{'ok  ' if c['passed'] else 'MISS'}  {c['check']:<22} {shown:>12}  limit {c.get('limit', '-')}")
    lines.append(f"expected metrics: {'PASSED' if verdict['passed'] else 'FAILED'}")
    return "\n".join(lines)


def record_command(setup) -> str:
    """The command that records this profile's expected metrics; on GPU with the GPU smoke profile's layout
    (launch.results.expected.smoke_gpu: one process wherever the recipe means something on one GPU)."""
    if setup.options.cpu:
        return f"python -m launch record {setup.recipe.name} --smoke --cpu"
    return f"python -m launch record {setup.recipe.name} --smoke " + " ".join(smoke_gpu(setup.recipe).argv())


def judge_run(setup, observed: dict, say=print) -> tuple[dict, int]:
    """The verdict of a finished smoke run and its exit status. The reference is read again here (it was checked
    before the start): one that became unreadable during the run gets its own status, and the summary is still
    written by the caller."""
    path = setup.recipe.expected_metrics_path
    if setup.options.synthetic:
        say("not judged: a synthetic run (random weights and tokens) has no expected metrics")
        return {"passed": None, "reason": "synthetic run"}, PASSED
    try:
        expected_all = read_expected(path)
    except LaunchError as e:
        say(f"not judged: the expected metrics cannot be read any more: {e}")
        return {"passed": None, "reason": f"expected metrics unreadable: {e}"}, UNREADABLE_REFERENCE
    expected = profile_entry(expected_all, setup.profile)
    if not expected or "steps" not in expected:
        say(f"no expected metrics for profile {setup.profile} in {path}; record them deliberately with "
            f"`{record_command(setup)}`")
        return {"passed": False, "reason": "no expected metrics for this profile"}, NO_REFERENCE
    if expected.get("invocation") != setup.invocation:
        say(f"not judged: this run's layout {setup.invocation} differs from the recorded one "
            f"{expected.get('invocation')}")
        return {"passed": None, "reason": "layout differs from the recorded one"}, PASSED
    verdict = compare(expected, observed, expected_all.get("tolerance"))
    print(format_verdict(verdict), flush=True)
    return verdict, PASSED if verdict["passed"] else MISSED


def environment(setup) -> dict:
    gpus, names = (0, []) if setup.options.cpu else gpu_info()
    return {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": "cpu" if setup.options.cpu else f"{gpus} x {', '.join(sorted(set(names))) or 'GPU'}",
        "cpu": cpu_model(),
        "world_size": setup.layout.world_size,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {k: v for k, v in installed_versions().items() if v},
        "gpu_driver": gpu_driver() if gpus else None,
    }


def record(setup, observed: dict) -> Path:
    """Write the observed metrics as the expected ones for this recipe and profile (the record command)."""
    path = setup.recipe.expected_metrics_path
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("tolerance", TOLERANCE)
    data.setdefault("profiles", {})
    data["profiles"][setup.profile] = {
        **{k: v for k, v in profile_entry(data, setup.profile).items() if k not in ("steps", "bounds")},
        "invocation": setup.invocation,
        "environment": environment(setup),
        "steps": {m: observed[m] for m in METRICS},
        "bounds": bounds_for(observed["loss"]),
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
