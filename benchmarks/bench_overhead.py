"""How much `--bench` adds to a run's step time: the same smoke run, alternately without and with `--bench`, compared
on the Trainer's own `train_runtime` (trainer_state.json), which neither variant measures differently.

    python benchmarks/bench_overhead.py [--recipe ddp] [--pairs 5] [--max-steps 40]

A benchmark, not a test: it prints the median of the paired ratios (each pair runs back to back, so a drift of the
machine's load cancels within a pair), their spread and range, with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(recipe: str, bench: bool, max_steps: int, out: Path) -> float:
    cmd = [sys.executable, "-m", "launch", recipe, "--smoke", "--cpu", "--max-steps", str(max_steps),
           "--output-dir", str(out)] + (["--bench"] if bench else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return next(h["train_runtime"] for h in reversed(history) if "train_runtime" in h)


def paired_ratios(plain: list[float], bench: list[float]) -> list[float]:
    """--bench / plain train_runtime of each pair (the i-th runs of both variants ran back to back)."""
    if len(plain) != len(bench):
        raise ValueError("unpaired runs")
    return [b / p for p, b in zip(plain, bench)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="ddp")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=40)
    ns = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    times = {False: [], True: []}
    for i in range(ns.pairs):
        for bench in ((False, True) if i % 2 == 0 else (True, False)):  # alternate the order against drift
            times[bench].append(run(ns.recipe, bench, ns.max_steps, root / f"{i}-{int(bench)}"))
            label = "--bench" if bench else "plain  "
            print(f"pair {i + 1}: {label} train_runtime {times[bench][-1]:.3f} s", flush=True)
    # each pair ran back to back, so the machine's load drifts between pairs, not within one: compare the pairs'
    # own ratios (their median and spread), not the medians of the two unpaired columns
    ratios = paired_ratios(times[False], times[True])
    overhead = statistics.median(ratios) - 1
    spread = statistics.pstdev(ratios) if len(ratios) > 1 else 0.0
    print(f"\n{ns.recipe} smoke on CPU, {ns.max_steps} steps, {ns.pairs} pairs, {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}")
    print(f"median of the {len(ratios)} paired ratios (--bench / plain train_runtime): overhead {100 * overhead:+.1f}% "
          f"(spread of the ratios {100 * spread:.1f}%; lowest {100 * (min(ratios) - 1):+.1f}%, highest "
          f"{100 * (max(ratios) - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
