"""`python -m launch compare RUN_DIR RUN_DIR... [--out FILE.png]`: per-step loss and grad_norm of several runs, and
each run's difference from the first, as one PNG (`launch.results.plots`) and a table."""

from __future__ import annotations

from pathlib import Path

from launch.commands import command
from launch.errors import LaunchError
from launch.config.options import Parser
from launch.results.plots import (DEFAULT_OUT, CompareError, read_run, run_label, unique_labels, write_comparison,
                                  written_by_us)


@command("compare", "plot and tabulate per-step loss and grad_norm of run folders against the first")
def main(argv: list[str]) -> int:
    p = Parser(
        prog="python -m launch compare",
        description="Plot and tabulate per-step loss and grad_norm of run folders; each run is compared with the "
                    "first on the steps both logged (max |diff|, mean signed diff).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="output folders holding trainer_state.json; the "
                   "first is the reference")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="FILE.png",
                   help=f"where the PNG goes (default: {DEFAULT_OUT} in the current folder)")
    p.add_argument("--overwrite", action="store_true", help="replace --out even when it is not a plot this command "
                   "wrote")
    ns = p.parse_args(argv)
    if len(ns.runs) < 2:
        p.error("give at least two run folders (the first is the reference)")

    out = Path(ns.out)
    if out.suffix.lower() != ".png":
        raise LaunchError(f"--out {out}: the plot is written as PNG; give a name ending in .png.")
    if out.exists() and not ns.overwrite and not (out.is_file() and written_by_us(out)):
        raise LaunchError(f"--out {out} already exists and is not a plot `compare` wrote: it is left alone. Pass "
                          "another --out, or --overwrite to replace it.")
    folders = [Path(r) for r in ns.runs]
    problems, observed = [], []
    for folder in folders:
        try:
            observed.append(read_run(folder))
        except CompareError as e:
            problems.append(str(e))
    if problems:
        raise LaunchError("; ".join(problems))
    labels = unique_labels(folders, [run_label(f) for f in folders])
    runs = list(zip(labels, observed))

    try:
        table = write_comparison(runs, out)
    except ImportError as e:
        raise LaunchError(f"matplotlib is needed to draw the comparison ({e}); install the project's "
                          "requirements.") from None
    except OSError as e:
        raise LaunchError(f"--out {out}: cannot write the plot ({e.strerror or e}).") from None
    print(table)
    print(f"plot: {out.resolve()}")
    return 0

