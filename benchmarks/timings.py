"""How long the launcher takes to check and plan a run before anything starts: the wall time of whole commands, as a
user waits for them, written to docs/timings.json (which docs/planning.md shows through a generated block:
`python -m launch sync-scripts` after a new measurement).

    python benchmarks/timings.py [--runs 8] [--out docs/timings.json]

A benchmark, not a test. Offline (the planner reads the model's config.json from docs/model_configs/), no GPU needed.
Each command runs once to warm the file cache, then --runs times; the median, fastest and slowest are kept with
every run and the machine's load average, because a busy machine slows every run. The same measurement with
hyperfine: `hyperfine --warmup 1 --runs 8 'python -m launch ring-cp-8gpu --dry-run'`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The floor under every command: what any launcher of TRL's SFTTrainer imports before it can read a training
# argument (torch, transformers, Accelerate, and TRL's parser with its SFTConfig, which imports transformers' trainer
# utilities and through them PEFT). The launcher's own cost is a command's time less this one.
IMPORTS = ("import torch, transformers, accelerate; from trl import SFTConfig, TrlParser; "
           "SFTConfig.__dataclass_fields__")
# (what the docs show, the arguments after `python`, the exit statuses that mean it worked)
COMMANDS = [
    (f'python -c "{IMPORTS}"', ["-c", IMPORTS], {0}),
    ("python -m launch ring-cp-8gpu --dry-run", ["-m", "launch", "ring-cp-8gpu", "--dry-run"], {0}),
    ("python -m launch plan ring-cp-8gpu --model docs/model_configs/Qwen--Qwen3-8B",
     ["-m", "launch", "plan", "ring-cp-8gpu", "--model", "docs/model_configs/Qwen--Qwen3-8B"], {0, 1}),  # 1: no fit
]


def run_once(args: list[str], ok: set[int]) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        sys.exit(f"`python {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-2000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "timings.json")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    commands = []
    for shown, launch_args, ok in COMMANDS:
        run_once(launch_args, ok)  # warm-up, not counted
        seconds = [round(run_once(launch_args, ok), 3) for _ in range(args.runs)]
        commands.append({"command": shown, "seconds": seconds, "median_s": round(statistics.median(seconds), 3),
                         "min_s": min(seconds), "max_s": max(seconds)})
        print(f"{shown}: median {statistics.median(seconds):.2f} s ({min(seconds):.2f}-{max(seconds):.2f})")
    data = {
        "written_by": "python benchmarks/timings.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                 "system": platform.platform()},
        "load_average": round(load, 2),
        "runs": args.runs,
        "warmup": 1,
        "commands": commands,
        "imports": IMPORTS,  # the first command: the floor the others are set against
    }
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}; `python -m launch sync-scripts` shows it in docs/planning.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
