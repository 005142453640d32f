"""`python -m launch bench RECIPE --max-length auto [run options] [-- training args]` (GPU hosts): the longest
global sequence length that really trains here.

Starts from the planner's answer for this machine's GPUs, runs a few real steps per try (`--bench`, warm-up + 2
measured steps) in a fresh launcher process each time, so that an out-of-memory error ends only that try, and
bisects (`launch.speed.measured.search_longest`). Prints the table of tries: length, result, step time, peak reserved
memory against the planner's prediction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from launch.run import interrupt
from launch.speed import measured as throughput
from launch.run.command import code_env
from launch.commands import command
from launch.errors import LaunchError
from launch.facts.machine import gpu_info, gpu_memory_gib, host_memory_gib
from launch.memory.plan import default_target, plan_memory
from launch.config.options import Parser, options_from, run_parser, split_extra
from launch.results.outdir import RunFolder
from launch.run.resolve import resolve

OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED")
MEASURED_STEPS = 2
MAX_LENGTH = "--max-length"


def auto(value: str) -> str:
    if value != "auto":
        raise argparse.ArgumentTypeError("bench searches the longest length: pass --max-length auto (for one length, "
                                         "run the recipe with --bench -- --max_length L)")
    return value


def parser() -> Parser:
    """The run's options, and the required `--max-length auto`."""
    p = run_parser("python -m launch bench")
    p.description = ("GPU host: the longest global sequence length that really trains here, bisected with a few "
                     "real --bench steps per try. Takes the run's options.")
    p.add_argument(MAX_LENGTH, required=True, type=auto, metavar="auto", help="search the longest length (required)")
    return p


def without_max_length(own: list[str]) -> list[str]:
    """The run's own options for each try: ours minus `--max-length auto` (also as `--max-length=auto`, or any
    prefix of the flag that argparse accepted: one that reaches `--max-l`, past `--max-steps`)."""
    kept, skip = [], False
    for arg in own:
        key = arg.split("=", 1)[0]
        if skip:
            skip = False
        elif len(key) >= len("--max-l") and MAX_LENGTH.startswith(key):
            skip = "=" not in arg
        else:
            kept.append(arg)
    return kept


@command("bench", "GPU host: the longest sequence length that really trains here (--max-length auto)",
         reads_first=True)
def main(argv: list[str]) -> int:
    own, extra = split_extra(argv)
    ns = parser().parse_args(own)
    own = without_max_length(own)
    if ns.cpu or gpu_info()[0] == 0:
        raise LaunchError("bench --max-length auto searches on this machine's GPUs, and it has none: out-of-memory is "
                          "what it looks for. Use `python -m launch plan RECIPE --max-length auto` to plan for a "
                          "target machine instead.")
    setup = resolve(options_from(ns, extra), progress=lambda *_: None)
    target = default_target(setup, gpu_memory_gib(), host_memory_gib())
    plan = plan_memory(setup, target, auto=True)
    start = plan.longest or plan.multiple
    print(f"[launch] bench: planner's longest length for {target.gpus_per_node} x {target.gpu_memory_gib:.1f} GiB: "
          f"{start:,} (a multiple of {plan.multiple}); trying from there", flush=True)

    interrupt.writing()  # the tries write run folders: from here a Ctrl-C raises (launch.run.interrupt)
    root = Path(tempfile.mkdtemp(prefix=f"bench-{setup.recipe.name}-"))
    results: dict[int, dict] = {}

    def trial(length: int) -> tuple[bool, str]:
        out = root / str(length)
        cmd = [sys.executable, "-m", "launch", *own, "--bench", "--bench-steps", str(MEASURED_STEPS),
               "--output-dir", str(out), "--force", "--", *extra, "--max_length", str(length)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=code_env(dict(os.environ)))
        files = RunFolder(out)
        log = files.log.read_text(errors="replace") if files.log.is_file() else proc.stdout
        summary = json.loads(files.summary.read_text()) if files.summary.is_file() else {}
        measured = ((summary.get("bench") or {}).get("overall") or {})
        oom = any(m in log for m in OOM_MARKERS)
        ok = proc.returncode == 0 and not oom
        detail = "trains" if ok else ("out of memory" if oom else f"failed (exit {proc.returncode}; see {out})")
        results[length] = {"ok": ok, "detail": detail, "step_s": measured.get("step_time_s_median"),
                           "reserved_gib": measured.get("peak_reserved_gib")}
        print(f"[launch] bench: {length:,} tokens: {detail}", flush=True)
        return ok, detail

    longest, tries = throughput.search_longest(start, plan.multiple, trial)
    print(f"\n{'max_length':>12} {'result':<16} {'step (s)':>9} {'reserved GiB':>13} {'predicted GiB':>14}")
    for length, _ok, _detail in tries:
        r = results[length]
        predicted = plan.with_run(plan.run.with_length(length)).estimate.gpu_peak_gib
        step = f"{r['step_s']:.2f}" if r["step_s"] else "-"
        reserved = f"{r['reserved_gib']:.1f}" if r["reserved_gib"] else "-"
        print(f"{length:>12,} {r['detail'][:16]:<16} {step:>9} {reserved:>13} {predicted:>14.1f}")
    print(f"\nlongest length that trains here: {longest:,} (planner: {start:,}); runs in {root}")
    return 0 if longest else 1

