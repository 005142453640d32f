"""Reading a run's per-step metrics, judging them against a recipe's expected_metrics.json, recording them.

Judging follows two upstream models:
- TRL's invariant tests: per-step loss and grad_norm against reference values, with a maximum absolute
  difference *and* a mean (signed) drift (`TOLERANCE` below holds TRL's numbers);
- axolotl's e2e checks: two-sided bounds, i.e. the loss must fall, and the first and last loss must lie in a
  range (rtol 0.05 around the recorded values).

expected_metrics.json is written only by `python -m launch record ...`, which stores the environment it was
recorded in next to the values.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

METRICS = ("loss", "grad_norm")
# TRL tests/invariant: loss max |diff| 1e-3 and mean diff 1e-5; grad_norm 1e-1 and 1e-3 (fp32, seed 42).
TOLERANCE = {
    "loss": {"max_abs": 1e-3, "mean": 1e-5},
    "grad_norm": {"max_abs": 1e-1, "mean": 1e-3},
}
BOUNDS_RTOL = 0.05  # axolotl: first and last loss within 5% of the recorded values
DROP_FRACTION = 0.5  # the loss must fall by at least half of the recorded relative drop


def read_expected(recipe) -> dict:
    """A recipe's expected_metrics.json ({} when absent), checked before any training: a truncated or hand-broken
    file is named, with the key, now rather than after the run."""
    from launch.recipes import LaunchError

    path = recipe.expected_metrics_path
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise LaunchError(f"{path} is not valid JSON ({e.msg}, line {e.lineno} column {e.colno}). Restore it from git "
                          f"(`git checkout -- {path}`) or re-record it with `python -m launch record`.") from None
    problems = _expected_problems(data)
    if problems:
        raise LaunchError(f"{path} is malformed: " + "; ".join(problems) + ". Restore it from git or re-record it with "
                          "`python -m launch record`.")
    return data


def _expected_problems(data) -> list[str]:
    if not isinstance(data, dict):
        return ["the top level is not an object"]
    out = []
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict):
        return ["`profiles` is not an object"]
    for name, entry in profiles.items():
        where = f"profiles.{name}"
        if not isinstance(entry, dict):
            out.append(f"`{where}` is not an object")
            continue
        if not isinstance(entry.get("invocation"), dict):
            out.append(f"`{where}.invocation` is missing or not an object")
        steps = entry.get("steps")
        if not isinstance(steps, dict):
            out.append(f"`{where}.steps` is missing or not an object")
            continue
        for metric in METRICS:
            values = steps.get(metric)
            if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
                out.append(f"`{where}.steps.{metric}` is missing or not a list of numbers")
        bounds = entry.get("bounds")
        if bounds is not None and not (isinstance(bounds, dict) and {"first_loss", "last_loss", "min_relative_drop"}
                                       <= set(bounds)):
            out.append(f"`{where}.bounds` lacks first_loss, last_loss or min_relative_drop")
    tolerance = data.get("tolerance")
    if tolerance is not None and not all(isinstance(tolerance.get(m), dict) and {"max_abs", "mean"} <= set(tolerance[m])
                                         for m in METRICS):
        out.append("`tolerance` needs max_abs and mean for " + " and ".join(METRICS))
    return out


def read_history(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / "trainer_state.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text()).get("log_history", [])


def step_metrics(history: list[dict]) -> dict[str, list[float]]:
    """Per-step values of METRICS, from the log entries that carry a training loss."""
    rows = sorted((h for h in history if "loss" in h and "step" in h), key=lambda h: h["step"])
    return {m: [float(h[m]) for h in rows if m in h] for m in METRICS} | {"step": [int(h["step"]) for h in rows]}


def run_totals(history: list[dict]) -> dict:
    final = next((h for h in reversed(history) if "train_runtime" in h), {})
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    runtime = final.get("train_runtime")
    return {
        "train_runtime_s": runtime,
        "num_tokens": tokens,
        "tokens_per_second": (tokens / runtime) if runtime else None,
    }


def bounds_for(losses: list[float]) -> dict:
    first, last = losses[0], losses[-1]
    drop = (first - last) / first if first else 0.0
    return {
        "first_loss": [round(first * (1 - BOUNDS_RTOL), 6), round(first * (1 + BOUNDS_RTOL), 6)],
        "last_loss": [round(last * (1 - BOUNDS_RTOL), 6), round(last * (1 + BOUNDS_RTOL), 6)],
        "min_relative_drop": round(drop * DROP_FRACTION, 6),
    }


def compare(expected: dict, observed: dict, tolerance: dict | None = None) -> dict:
    """Judge observed per-step metrics against an expected profile entry. Returns a verdict dict with
    `passed`, per-check results and the per-step table rows."""
    tolerance = tolerance or TOLERANCE
    checks, rows = [], []
    for metric in METRICS:
        exp, obs = expected["steps"].get(metric, []), observed.get(metric, [])
        if len(exp) != len(obs):
            checks.append({"check": f"{metric} steps", "passed": False,
                           "detail": f"expected {len(exp)} logged steps, observed {len(obs)}"})
            continue
        diffs = [o - e for e, o in zip(exp, obs)]
        tol = tolerance[metric]
        max_abs = max((abs(d) for d in diffs), default=0.0)
        mean = sum(diffs) / len(diffs) if diffs else 0.0
        checks.append({"check": f"{metric} max |diff|", "value": max_abs, "limit": tol["max_abs"],
                       "passed": max_abs <= tol["max_abs"]})
        checks.append({"check": f"{metric} mean diff", "value": mean, "limit": tol["mean"],
                       "passed": abs(mean) <= tol["mean"]})
        steps = observed.get("step") or list(range(1, len(obs) + 1))
        for step, e, o, d in zip(steps, exp, obs, diffs):
            rows.append({"step": step, "metric": metric, "expected": e, "observed": o, "diff": d,
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


def environment(setup) -> dict:
    from launch.doctor import gpu_info, installed_versions

    gpus, names = (0, []) if setup.options.cpu else gpu_info()
    return {
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": "cpu" if setup.options.cpu else f"{gpus} x {', '.join(sorted(set(names))) or 'GPU'}",
        "cpu": _cpu_model(),
        "world_size": setup.plan.world_size,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {k: v for k, v in installed_versions().items() if v},
        "gpu_driver": _gpu_driver() if gpus else None,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpu_driver() -> str | None:
    path = Path("/proc/driver/nvidia/version")
    return path.read_text().splitlines()[0] if path.is_file() else None


def record(setup, observed: dict) -> Path:
    """Write the observed metrics as the expected ones for this recipe and profile (the record command)."""
    path = setup.recipe.expected_metrics_path
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("tolerance", TOLERANCE)
    data.setdefault("profiles", {})
    data["profiles"][setup.profile] = {
        "invocation": setup.invocation,
        "environment": environment(setup),
        "steps": {m: observed[m] for m in METRICS},
        "bounds": bounds_for(observed["loss"]),
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path
