"""The first-steps loss sentinel: stop a run at once when its first logged losses fall outside the band recorded for
the recipe, instead of after hours of training a broken setup.

A full run's first loss is known in advance within a margin (TRL PR #6846: Qwen3-8B on PG-19 at 1M tokens starts
at 4.4 with YaRN and at 10.6 without). The traps that move it are silent otherwise: RoPE scaling not applied,
packing across documents under context parallelism, the wrong dtype or precision, the wrong chat template or labels.

Where the band lives: a recipe's expected_metrics.json, in the entry of the profile it was recorded for:

    "profiles": {"full-gpu": {"first_loss_band": {
        "steps": 1,                 # how many logged losses are checked (the first `steps` logs), >= 1
        "low": 3.0, "high": 6.0,    # finite, 0 <= low < high; a logged loss must satisfy low <= loss <= high
        "source": "TRL PR #6846: first loss 4.4 with YaRN, 10.6 without",  # where the numbers come from
        "recorded_with": {"max_length": 1048576}   # optional: training arguments the band holds for
    }}}

`band_problems(entry)` validates an entry's band for the launcher (NaN and infinities refused); `env_for(entry)` is
what the launcher adds to the ranks' environment (ENV, the band as JSON); `mismatch(band, training)` lists the
`recorded_with` values the run differs in (the launcher then leaves the sentinel off and says why; a synthetic run
always leaves it off: random weights start at ln(vocab)). In the ranks, `launch.rank.monitor.add_callbacks` adds
`launch.rank.sentinel.sentinel_callback()` when ENV is set: it has each of the first `steps` optimizer steps logged (whatever
`logging_steps` is, so a checked loss is one step's loss), and at each of those logs, every rank
(the logged loss is the mean over all ranks, the same on each) checks it and raises `FirstLossError` outside the
band, so every rank stops and torchrun ends the job; the launcher reports the error's one-line message. The verdict
(passed or stopped, the losses seen) is also written to `<LAUNCH_MONITOR_DIR>/sentinel.json` by rank 0
(`read_verdict`). Off when no band is recorded.

This module is the launcher's half (the band, its checks, the ranks' environment, the verdict); the ranks' half is
`launch.rank.sentinel`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from launch.rank import run_files  # names only
from launch.rank.sentinel import ENV

KEY = "first_loss_band"
REQUIRED = ("steps", "low", "high", "source")
OPTIONAL = ("recorded_with",)




def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def band_problems(entry: dict | None) -> list[str]:
    """Problems of the `first_loss_band` of one profile entry of expected_metrics.json; [] when it has none or it
    is valid."""
    if not isinstance(entry, dict) or KEY not in entry:
        return []
    band = entry[KEY]
    if not isinstance(band, dict):
        return [f"{KEY} must be an object with {', '.join(REQUIRED)}, not {type(band).__name__}"]
    problems = [f"{KEY}.{k} is missing" for k in REQUIRED if k not in band]
    problems += [f"{KEY}.{k} is not a known key (known: {', '.join(REQUIRED + OPTIONAL)})"
                 for k in band if k not in REQUIRED + OPTIONAL]
    steps = band.get("steps")
    if "steps" in band and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        problems.append(f"{KEY}.steps must be an integer >= 1, not {steps!r}")
    for k in ("low", "high"):
        if k in band and not _number(band[k]):
            problems.append(f"{KEY}.{k} must be a finite number, not {band[k]!r}")
    if _number(band.get("low")) and _number(band.get("high")):
        if band["low"] < 0:
            problems.append(f"{KEY}.low must be >= 0 (a cross-entropy loss), not {band['low']!r}")
        if band["low"] >= band["high"]:
            problems.append(f"{KEY}.low ({band['low']!r}) must be below {KEY}.high ({band['high']!r})")
    if "source" in band and (not isinstance(band["source"], str) or not band["source"].strip()):
        problems.append(f"{KEY}.source must say where the band comes from (a non-empty string)")
    if "recorded_with" in band and not isinstance(band["recorded_with"], dict):
        problems.append(f"{KEY}.recorded_with must be an object of training arguments")
    return problems


def band_of(entry: dict | None) -> dict | None:
    return entry.get(KEY) if isinstance(entry, dict) else None


def mismatch(band: dict | None, training: dict) -> list[str]:
    """The `recorded_with` training arguments this run sets differently (the band does not hold for it)."""
    if not band:
        return []
    return [f"{k}: recorded with {v!r}, this run has {training.get(k)!r}"
            for k, v in (band.get("recorded_with") or {}).items() if training.get(k) != v]


def env_for(entry: dict | None, recipe: str | None = None, profile: str | None = None) -> dict:
    """What the launcher adds to the ranks' environment for this profile entry: {} without a band. Raises
    ValueError on an invalid band (the launcher reports `band_problems` first)."""
    band = band_of(entry)
    if band is None:
        return {}
    if problems := band_problems(entry):
        raise ValueError("invalid first_loss_band: " + "; ".join(problems))
    value = {k: band[k] for k in REQUIRED}
    if recipe:
        value["recipe"] = recipe
    if profile:
        value["profile"] = profile
    return {ENV: json.dumps(value)}


def read_verdict(monitor_dir: Path) -> dict | None:
    """The launcher's side: {"verdict": "passed" | "stopped", "band": ..., "losses": [...]}, None if none was
    written (no band, or the run ended before its first checked log)."""
    try:
        return json.loads((Path(monitor_dir) / run_files.SENTINEL_VERDICT).read_text())
    except (OSError, ValueError):
        return None
