"""`python -m launch doctor [RECIPE] [--cpu]`: installed versions against the lock, feature floors, GPUs, kernels."""

from __future__ import annotations

from launch.commands import command
from launch.doctor import run_doctor
from launch.envvars import doctor_at_start
from launch.options import Options, Parser, add_options, values_from
from launch.resolve import resolve


@command("doctor", "installed versions against the lock, feature floors, GPUs and kernels (for RECIPE, if given)")
def main(argv: list[str]) -> int:
    p = Parser(prog="python -m launch doctor", description="Check versions, floors and GPUs.")
    p.add_argument("recipe", nargs="?", help="also check what this recipe needs")
    add_options(p, ("cpu", "num_processes"))
    p.add_argument("--strict", action="store_true", help="GPU-only packages must be installed too (the image)")
    ns = p.parse_args(argv)
    setup = resolve(Options(recipe=ns.recipe, **values_from(ns, ("cpu", "num_processes")))) if ns.recipe else None
    strict = ns.strict or doctor_at_start()
    return 1 if run_doctor(setup, strict=strict) else 0
