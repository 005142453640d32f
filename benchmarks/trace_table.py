"""Every recipe's GPU default, planned and traced: the analytic peak per GPU, the traced peak, their ratio, written to
docs/trace-table.json (which docs/planning.md shows through a generated block: `python -m launch sync-scripts`
after a new measurement).

    python benchmarks/trace_table.py [--out docs/trace-table.json] [--only RECIPE ...]

A measurement, not a test: each recipe runs `python -m launch plan RECIPE --trace --json -- --use_liger_kernel false`
offline (the model's config.json from the hub cache or docs/model_configs/), one recipe at a time, and its wall time
is kept with the machine's load average (a busy machine slows every trace). Liger is turned off for both sides of the
comparison because its Triton kernels do not run under fake tensors on a CPU build; the recipes' GPU defaults turn
it on, so the analytic figures here are the Liger-off plan of each default. A layout that cannot be traced keeps its
one-line reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launch.recipe.discovery import recipe_names  # noqa: E402


# Liger's Triton kernels do not run under fake tensors on a CPU build: both sides plan and trace the default without
TRAINING_ARGS = ["--use_liger_kernel", "false"]


def row(name: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "launch", "plan", name, "--trace", "--json", "--", *TRAINING_ARGS],
                          cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"recipe": name, "error": last, "wall_s": round(wall, 1)}
    plan = json.loads(proc.stdout)
    trace = plan.get("trace", {})
    out = {"recipe": name, "max_length": plan["max_length"], "per_rank_length": plan["per_rank_length"],
           "analytic_allocated_gib": plan["gpu_allocated_peak_gib"], "analytic_total_gib": plan["gpu_peak_gib"],
           "wall_s": round(wall, 1)}
    if "ratio" in trace:
        out.update({k: trace[k] for k in ("traced_allocated_gib", "ratio", "traced_total_gib", "categories_gib",
                                          "added_gib", "seconds")})
    else:
        out["untraced"] = trace.get("untraced", ["not traced"])[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "trace-table.json")
    ap.add_argument("--only", nargs="*", help="these recipes only (the others keep their recorded rows)")
    args = ap.parse_args()
    names = recipe_names()
    old = {r["recipe"]: r for r in json.loads(args.out.read_text())["recipes"]} if (
        args.only and args.out.is_file()) else {}
    rows = []
    load = os.getloadavg()[0]
    for name in names:
        if args.only and name not in args.only and name in old:
            rows.append(old[name])
            continue
        r = row(name)
        print(json.dumps(r), flush=True)
        rows.append(r)
    data = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
            "load_average": load, "training_args": TRAINING_ARGS, "recipes": rows}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(REPO)}; `python -m launch sync-scripts` regenerates docs/planning.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
