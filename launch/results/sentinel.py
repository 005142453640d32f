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
        "recorded_with": {"max_length": 1048576, "model": {"model_type": "qwen3", ...}, "rope": {...}}
                                    # optional: what the run is (IDENTITY) or training arguments the band holds for
    }}}

`band_problems(entry)` validates an entry's band for the launcher (NaN and infinities refused); `env_for(entry)` is
what the launcher adds to the ranks' environment (ENV, the band as JSON); `mismatch(band, training)` lists the
`recorded_with` values the run differs in: what the run *is* (its model's architecture and RoPE, its length, its layout;
IDENTITY), not how its model's path is spelled (the launcher then leaves the sentinel off and says why). A synthetic
run is checked instead against the first loss a random model must give (`random_init_band`: about ln(vocab)). In the
ranks, `launch.rank.monitor.add_callbacks` adds `launch.rank.sentinel.sentinel_callback()` when ENV is set: it has each
of the first `steps` optimizer steps logged (whatever `logging_steps` is, so a checked loss is one step's loss), and at
each of those logs, every rank (the logged loss is the mean over all ranks, the same on each) checks it and raises
`FirstLossError` outside the band, so every rank stops and torchrun ends the job; the launcher reports the error's
one-line message. The verdict (passed or stopped, the losses seen) is also written to
`<LAUNCH_MONITOR_DIR>/sentinel.json` by rank 0 (`read_verdict`). Off when no band is recorded.

This module is the launcher's half (the band, its checks, the ranks' environment, the verdict); the ranks' half is
`launch.rank.sentinel`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from launch.facts import hub
from launch.rank import run_files  # names only
from launch.rank.sentinel import ENV

KEY = "first_loss_band"
REQUIRED = ("steps", "low", "high", "source")
OPTIONAL = ("recorded_with", "kind")
KINDS = ("recorded", "random_init")  # a band recorded for a recipe, or the one every synthetic run gets

# What a run *is*, for a band's `recorded_with` (not how its model's path is spelled: a local copy of Qwen/Qwen3-8B is
# the same run): the model's architecture and RoPE settings from its config, the sequence length, and the layout.
# Any other key of `recorded_with` is a training argument, compared as given.
ARCHITECTURE = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size")
IDENTITY = ("model", "rope", "max_length", "layout")

# The first loss of a random model on uniform random tokens (a synthetic run): logits z = W x with x the final
# RMS-normalised hidden state (|x|^2 = hidden_size at init) and W's entries N(0, initializer_range^2), so each logit
# is ~N(0, s^2) with s^2 = initializer_range^2 * hidden_size, and E[cross-entropy] = E[logsumexp z] - E[z_label]
# ~= ln(V) + s^2 / 2 (V large). Measured (tests/test_sentinel.py, random init, fp32): the smoke model (V 64, h 64)
# gives ln(V) + 0.01 to + 0.02, and a Qwen3-0.6B-shaped model (V 151,936, h 1024, 2 layers) ln(V) + 0.2, as
# predicted. The band: below by RANDOM_BELOW (sampling noise of a few hundred tokens; a random model cannot do better
# than chance on random tokens), above by the predicted offset plus RANDOM_ABOVE. A loss averaged wrongly over the
# ranks (x or / the CP size), summed instead of averaged, or NaN lands outside it; ln(64) = 4.16 halved or doubled too.
RANDOM_BELOW = 0.5
RANDOM_ABOVE = 1.0




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
    if "kind" in band and band["kind"] not in KINDS:
        problems.append(f"{KEY}.kind must be one of {', '.join(KINDS)}, not {band['kind']!r}")
    return problems


def band_of(entry: dict | None) -> dict | None:
    return entry.get(KEY) if isinstance(entry, dict) else None


def identity(config, training: dict, layout=None) -> dict:
    """What the run is, under the keys a band's `recorded_with` may name (IDENTITY); "model" and "rope" only when
    the model's config was read."""
    out: dict = {"max_length": training.get("max_length")}
    if config is not None:
        out["model"] = {k: getattr(config, k, None) for k in ARCHITECTURE}
        # the model's own RoPE settings, not the run's model_init_kwargs over them: RoPE scaling left out or
        # misapplied is a trap the band is there to catch (TRL PR #6846: 10.6 instead of 4.4), so it must not turn
        # the band off
        out["rope"] = hub.rope_parameters(config)
    if layout is not None:
        out["layout"] = {"world_size": layout.world_size, "mesh": dict(layout.mesh)}
    return out


def _differs(recorded, have) -> bool:
    """For the "model", "rope" and "layout" objects: a value the band names that the run has otherwise (keys the
    band leaves out do not matter); numbers compared as numbers (1e6 == 1000000)."""
    if isinstance(recorded, dict):
        return not isinstance(have, dict) or any(_differs(v, have.get(k)) for k, v in recorded.items())
    if _number(recorded) and _number(have):
        return not math.isclose(recorded, have, rel_tol=1e-9)
    return recorded != have


def mismatch(band: dict | None, training: dict, config=None, layout=None) -> list[str]:
    """What this run has otherwise than the band's `recorded_with` (the band does not hold for it): the identity
    keys (IDENTITY) compared with what the run is (`config`: the model's text config, None when not read), any
    other key as a training argument."""
    if not band:
        return []
    run = identity(config, training, layout)
    out = []
    for k, v in (band.get("recorded_with") or {}).items():
        if k in ("model", "rope") and k not in run:
            out.append(f"{k}: recorded with {v!r}, and this run's model config was not read")
        elif k in IDENTITY and _differs(v, run.get(k)):
            out.append(f"{k}: recorded with {v!r}, this run has {run.get(k)!r}")
        elif k not in IDENTITY and training.get(k) != v:
            out.append(f"{k}: recorded with {v!r}, this run has {training.get(k)!r}")
    return out


def random_init_band(config) -> dict | None:
    """The band of a synthetic run's first logged loss (random weights, uniform random tokens), from the model's
    config; None when it was not read."""
    vocab = getattr(config, "vocab_size", None) if config is not None else None
    if not _number(vocab) or vocab < 2:
        return None
    std = getattr(config, "initializer_range", None)
    std = std if _number(std) else 0.02  # transformers' default
    chance = math.log(vocab)
    offset = std ** 2 * getattr(config, "hidden_size", 0) / 2
    return {"steps": 1, "low": round(max(chance - RANDOM_BELOW, 0.0), 4),
            "high": round(chance + offset + RANDOM_ABOVE, 4),
            "source": f"a random model on random tokens starts at ln(vocab {vocab:,}) = {chance:.3f} (+{offset:.3f} "
                      f"for its init std {std:g} at hidden size {getattr(config, 'hidden_size', '?')})",
            "kind": "random_init"}


def env_for(entry: dict | None, recipe: str | None = None, profile: str | None = None) -> dict:
    """What the launcher adds to the ranks' environment for this profile entry: {} without a band. Raises
    ValueError on an invalid band (the launcher reports `band_problems` first)."""
    band = band_of(entry)
    if band is None:
        return {}
    if problems := band_problems(entry):
        raise ValueError("invalid first_loss_band: " + "; ".join(problems))
    value = {k: band[k] for k in REQUIRED + ("kind",) if k in band}
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
