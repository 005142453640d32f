"""Every check of a GPU machine that `python -m launch doctor` runs, and the image at its start: the performance
traps of its libraries and driver (launch.checks.traps) and the attention each recipe gets (launch.checks.attention).

`trap_checks()` runs them all; `python -m launch.checks.image` prints them for every recipe.
"""

from __future__ import annotations

# What trap_checks runs, and the names of both modules the tests reach as launch.checks.image.NAME
from launch.checks.attention import (AttentionFacts, SP_BUILTIN_ATTENTION, check_recipes,  # noqa: F401
                                     recipe_attention, recipe_attn_settings, recipe_paths)
from launch.checks.traps import (FLASH_ATTN_4, FLASH_ATTN_4_MIN_MAJOR, NOT_CHECKED, Check,  # noqa: F401
                                 _sdpa_choice, _torch, check_bitsandbytes, check_cudnn, check_driver,
                                 check_flash_attn, check_flash_attn_4, check_kernels_route, check_sdpa_backend,
                                 cudnn_number, fatbin_archs, flash_attn_import, runs_on)
from launch.facts.machine import kernels_requirement, kernels_route  # noqa: F401


def trap_checks(recipe_attn: dict[str, str] | None = None, torch_module=None, paths: dict[str, str] | None = None,
                quantized: bool = False, lock: dict[str, str] | None = None,
                lock_source: str = "image.lock") -> list[Check]:
    """Every check: [(name, what was found, problem or None)]. recipe_attn: {recipe: attn_implementation} of the
    recipes to report (None: none); paths: their layouts (default: read from the recipe folders); quantized: also
    run bitsandbytes' 4-bit round trip; lock, lock_source: the versions the loaded cuDNN is held to (default
    image.lock; a machine's own torch build: its installed wheels)."""
    torch = _torch(torch_module)
    checks = [check_cudnn(torch, lock, source=lock_source), check_sdpa_backend(torch), check_driver(torch),
              check_flash_attn(torch),
              check_flash_attn_4(torch), check_kernels_route()]
    if quantized:
        checks.append(check_bitsandbytes(torch))
    if recipe_attn:
        checks += check_recipes(recipe_attn, torch, paths=paths)
    return checks


def main() -> int:
    """`python -m launch.checks.image`: print the checks for every recipe; exit 1 when one finds a problem."""
    errors: dict[str, str] = {}
    settings = recipe_attn_settings(errors)
    problems = 0
    for name, message in errors.items():
        print(f"PROBLEM: recipe {name}: {message}")
        problems += 1
    for name, found, problem in trap_checks(settings, quantized=True):
        print(f"{name:<28} {found}")
        if problem:
            print(f"PROBLEM: {problem}")
            problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
