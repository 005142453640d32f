"""`python -m launch doctor [RECIPE] [--cpu]`: installed versions against the lock, feature floors, GPUs, kernels."""

from __future__ import annotations

from launch.checks import rules
from launch.run import runner
from launch.commands import command
from launch.checks.doctor import DOCTOR_RULES, run_doctor
from launch.config.envvars import doctor_at_start
from launch.config.options import Options, Parser, add_options, values_from
from launch.run.resolve import resolve


@command("doctor", "installed versions against the lock, feature floors, GPUs and kernels (for RECIPE, if given)",
         reads_first=True)
def main(argv: list[str]) -> int:
    p = Parser(prog="python -m launch doctor", description="Check versions, floors and GPUs.")
    p.add_argument("recipe", nargs="?", help="also check what this recipe needs")
    add_options(p, ("cpu", "num_processes"))
    p.add_argument("--strict", action="store_true", help="GPU-only packages must be installed too (the image)")
    ns = p.parse_args(argv)
    setup = resolve(Options(recipe=ns.recipe, **values_from(ns, ("cpu", "num_processes")))) if ns.recipe else None
    strict = ns.strict or doctor_at_start()
    return 1 if run_doctor(setup, strict=strict, preflight=preflight(setup)) else 0


def preflight(setup) -> list[str]:
    """The problems the run's preflight finds (the rules of launch.checks.rules, as `python -m launch RECIPE` checks
    them): a layout the run refuses is not `doctor: ok`. Less those run_doctor checks itself (DOCTOR_RULES), and the
    inputs (model and dataset found and loadable): doctor checks a machine, often before the data is there."""
    if setup is None:
        return []
    facts = runner.gather_facts(setup)
    own = {fn(setup, facts) for fn in (*DOCTOR_RULES, rules.model_and_data_found, rules.model_folder_loads)}
    return [m for m in rules.check(setup, facts).all if m not in own]
