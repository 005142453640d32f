"""`python -m launch doctor [RECIPE] [--cpu]`: installed versions against the lock, feature floors, GPUs, kernels."""

from __future__ import annotations

import argparse
import os

from launch.doctor import run_doctor
from launch.options import Options
from launch.resolve import resolve


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m launch doctor", description="Check versions, floors and GPUs.")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--strict", action="store_true", help="GPU-only packages must be installed too (the image)")
    ns = p.parse_args(argv)
    setup = resolve(Options(recipe=ns.recipe, cpu=ns.cpu, num_processes=ns.num_processes)) if ns.recipe else None
    strict = ns.strict or os.environ.get("LAUNCH_DOCTOR_AT_START") == "1"
    return 1 if run_doctor(setup, strict=strict) else 0
