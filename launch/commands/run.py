"""`python -m launch RECIPE [options] [-- training args]` and `python -m launch record RECIPE --smoke ...`: one
run from start to verdict (`launch.runner`); `record` writes its per-step metrics as the expected ones."""

from __future__ import annotations

from launch import runner
from launch.errors import LaunchError
from launch.options import options_from, run_parser, split_extra


def main(argv: list[str], record: bool = False) -> int:
    own, extra = split_extra(argv)
    prog = "python -m launch record" if record else "python -m launch"
    ns = run_parser(prog).parse_args(own)
    if record and not ns.smoke:
        raise LaunchError("`record` writes the expected metrics of a smoke profile: add --smoke (and --cpu on CPU).")
    if (ns.bench_steps is not None and ns.bench_steps < 1) or ns.bench_warmup < 0:
        raise LaunchError("--bench-steps must be at least 1 and --bench-warmup at least 0.")
    if ns.bench_steps is not None and not ns.bench:
        raise LaunchError("--bench-steps needs --bench.")
    options = options_from(ns, extra)
    options.record = record
    return runner.launch(options, dry_run=ns.dry_run)


def record_main(argv: list[str]) -> int:
    return main(argv, record=True)
