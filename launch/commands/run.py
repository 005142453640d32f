"""`python -m launch RECIPE [options] [-- training args]` and `python -m launch record RECIPE --smoke ...`: one
run from start to verdict (`launch.runner`); `record` writes its per-step metrics as the expected ones."""

from __future__ import annotations

from launch import runner
from launch.commands import command, overview
from launch.errors import LaunchError
from launch.options import parse_run


def main(argv: list[str], record: bool = False) -> int:
    """The run form, `python -m launch RECIPE ...`: not a registered command, what `launch.__main__` runs when the
    first word names none (its --help lists the commands)."""
    if record:
        options = parse_run(argv, "python -m launch record", record=True)
    else:
        options = parse_run(argv, "python -m launch", epilog=overview())
    if record and not options.smoke:
        raise LaunchError("`record` writes the expected metrics of a smoke profile: add --smoke (and --cpu on CPU).")
    if (options.bench_steps is not None and options.bench_steps < 1) or options.bench_warmup < 0:
        raise LaunchError("--bench-steps must be at least 1 and --bench-warmup at least 0.")
    if options.bench_steps is not None and not options.bench:
        raise LaunchError("--bench-steps needs --bench.")
    return runner.launch(options, dry_run=options.dry_run)


@command("record", "run RECIPE's smoke profile and write its per-step metrics as the expected ones (deliberate)")
def record_main(argv: list[str]) -> int:
    return main(argv, record=True)
