"""The environment variables the launcher reads, each parsed here, once, with a clear error on a bad value."""

from __future__ import annotations

import os

from launch.constants import ENV_MIN_FREE_MB
from launch.errors import LaunchError


def _number(name: str, default: float, cast=int, minimum: float = 0):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise LaunchError(f"The environment variable {name}={raw!r} is not a{'n integer' if cast is int else ' number'}"
                          f"; unset it or set a number (default {default}).") from None
    if value < minimum:
        raise LaunchError(f"The environment variable {name}={raw!r} must be at least {minimum}.")
    return value


def min_free_bytes() -> int:
    """LAUNCH_MIN_FREE_MB: the free space (MiB) the output folder's file system must have before a run (200)."""
    return _number(ENV_MIN_FREE_MB, 200) * 2**20


def optional_int(name: str) -> int | None:
    """An integer variable set by a scheduler (SLURM_NNODES, SLURM_NODEID, MASTER_PORT), None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"The environment variable {name}={raw!r} is not an integer; the launcher reads it as the "
                          "default of a multi-node option. Unset it or fix it.") from None
