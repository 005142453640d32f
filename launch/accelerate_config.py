"""An Accelerate config checked with Accelerate's own classes before any process starts.

- Top-level keys and `distributed_type`: `ClusterConfig` (what `accelerate launch --config_file` loads) refuses
  unknown keys and enum values it does not know.
- Every key, nested ones included (`deepspeed_config`, `fsdp_config`, `parallelism_config`): `accelerate launch`
  copies each onto its own argument namespace (`_validate_launch_command`), where a key it has no option for is
  silently ignored and a value is never type-checked. We look each key up in `launch_command_parser()` and check
  the value against that option's type and choices, so that `num_processes: eight`, `mixed_precison: bf16` or
  `zero_stag: 3` are refused here, with the file and key, instead of failing (or being ignored) in the ranks.
The mesh it asks for is read (and validated by Accelerate's `ParallelismConfig`) in `launch.layout`.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

from launch.errors import LaunchError

# Nested sections whose keys `accelerate launch` prefixes before looking them up (_validate_launch_command).
_PREFIXED = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}


@lru_cache(maxsize=1)
def _launch_options() -> dict:
    from accelerate.commands.launch import launch_command_parser

    return {a.dest: a for a in launch_command_parser()._actions}


def problems(path: Path, data: dict) -> list[str]:
    """One line per unknown key, bad enum value or mistyped value in an Accelerate config."""
    from accelerate.commands.config.config_args import ClusterConfig

    out: list[str] = []
    fields = set(ClusterConfig.__dataclass_fields__)
    try:
        processed = ClusterConfig.process_config(dict(data))
    except ValueError as e:
        return [f"{path}: {e}"]
    for key in sorted(set(processed) - fields):
        out.append(f"{path}: unknown key `{key}`{_hint(key, fields)}")
    if not out:
        try:
            ClusterConfig(**processed)
        except (TypeError, ValueError) as e:  # e.g. "'MULTI_GPUU' is not a valid DistributedType"
            out.append(f"{path}: {e}")
    options = _launch_options()
    for section, key, value in _keys(data):
        name = _PREFIXED.get(section, "") + key if section and not key.startswith(_PREFIXED.get(section, "")) else key
        where = f"{section}.{key}" if section else key
        if name not in options:
            if section:  # top-level keys are ClusterConfig's business (compute_environment, tpu_env, ...)
                out.append(f"{path}: `{where}` is not an `accelerate launch` setting; Accelerate would ignore it"
                           f"{_hint(name, options)}")
            continue
        if msg := _value_problem(options[name], value):
            out.append(f"{path}: `{where}: {value!r}`: {msg}")
    return out


def _keys(data: dict):
    for key, value in data.items():
        if isinstance(value, dict) and key.endswith("_config"):
            for sub, v in value.items():
                yield key, sub, v
        else:
            yield None, key, value


def _value_problem(action, value) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if action.choices and str(value) not in [str(c) for c in action.choices]:
        return "expected one of " + ", ".join(map(str, action.choices))
    if action.type in (int, float):
        if isinstance(value, bool):
            return f"expected {'an integer' if action.type is int else 'a number'}"
        try:
            action.type(str(value))
        except ValueError:
            return f"expected {'an integer' if action.type is int else 'a number'}"
    return None


def _hint(key: str, known) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=2)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def check(path: Path, data: dict) -> None:
    if found := problems(path, data):
        raise LaunchError("The Accelerate config has problems:\n  " + "\n  ".join(found))
