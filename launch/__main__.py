"""`python -m launch`: the entry point; dispatch only (each subcommand is a module of `launch.commands`).

    python -m launch list
    python -m launch doctor [RECIPE] [--cpu]
    python -m launch RECIPE [--smoke] [--cpu] [--num-processes N] [--sp-size N] ... [--dry-run] [-- training args]
    python -m launch record RECIPE --smoke [--cpu] [...]     (re-records expected_metrics.json; deliberate)
    python -m launch plan RECIPE [--gpus N] [--nodes M] [--gpu-memory GIB] [--host-memory GIB] [--max-length L|auto] ...
    python -m launch bench RECIPE --max-length auto [run options]  (GPU host: the longest length that trains)
    python -m launch compare RUN_DIR RUN_DIR... [--out FILE.png]
    python -m launch sync-scripts                              (templates/train.py -> every marked recipe copy)
"""

from __future__ import annotations

import sys

from launch.commands import bench, compare, doctor, listing, plan, run, sync
from launch.errors import LaunchError

COMMANDS = {
    "list": listing.main,
    "doctor": doctor.main,
    "plan": plan.main,
    "bench": bench.main,
    "compare": compare.main,
    "record": run.record_main,
    "sync-scripts": sync.main,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(argv[0]) if argv else None
    try:
        return command(argv[1:]) if command else run.main(argv)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before or after the ranks ran (while they run, supervise forwards it)
        print("\n[launch] interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
