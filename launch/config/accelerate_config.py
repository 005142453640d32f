"""An Accelerate config checked with Accelerate's own classes before any process starts.

- Top-level keys and `distributed_type`: `ClusterConfig` (what `accelerate launch --config_file` loads) refuses
  unknown keys and enum values it does not know.
- Every key, nested ones included (`deepspeed_config`, `fsdp_config`, `parallelism_config`): `accelerate launch`
  copies each onto its own argument namespace (`_validate_launch_command`), where a key it has no option for is
  silently ignored and a value is never type-checked. We look each key up in `launch_command_parser()` and check
  the value against that option's type and choices, so that `num_processes: eight`, `mixed_precison: bf16` or
  `zero_stag: 3` are refused here, with the file and key, instead of failing (or being ignored) in the ranks.
- Every enum-valued key against the enum upstream reads it with (`ENUMS`: Accelerate's constants and enums, torch's
  FSDP enums through them, DeepSpeed's offload devices), spelled as upstream accepts it (case, the numbers of torch's
  FSDP enums): the launch parser has no choices for most of them (`fsdp_state_dict_type: FULL_STATE_DICTS` was a
  KeyError in every rank), and lower-case choices for one that Accelerate reads in upper case (`dynamo_backend:
  INDUCTOR`, as `accelerate config` writes it).
The mesh it asks for is read (and validated by Accelerate's `ParallelismConfig`) in `launch.config.layout`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from launch.errors import LaunchError

# Nested sections whose keys `accelerate launch` prefixes before looking them up (_validate_launch_command).
_PREFIXED = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}


@dataclass(frozen=True)
class Enum:
    """An enum-valued key as upstream reads it: the enum's name (for the message), its values (read from upstream
    when checked), how upstream folds the case before looking the value up, and whether it also takes the 1-based
    number of a torch enum member (the FSDP plugin's `ShardingStrategy(int(value))`)."""

    name: str
    values: Callable[[dict], list[str] | None]  # the Accelerate config -> the accepted names (None: not an enum here)
    case: str | None = None  # "upper" / "lower": upstream folds the value so before comparing; None: exact
    numbered: Callable[[], list[str]] | None = None  # the torch enum's members in number order

    def accepts(self, value, config: dict) -> bool | None:
        names = self.values(config)
        if names is None:
            return None
        text = str(value)
        if self.numbered and text.isdigit():
            order = self.numbered()
            return 1 <= int(text) <= len(order) and order[int(text) - 1] in names
        fold = {"upper": str.upper, "lower": str.lower}.get(self.case, lambda t: t)
        return fold(text) in [fold(str(n)) for n in names]


def _constants():
    from accelerate.utils import constants

    return constants


def _values(enum) -> list[str]:
    return [member.value for member in enum]


def _accelerate_enum(name: str):
    def values(_config):
        import accelerate.utils.dataclasses as dataclasses

        return _values(getattr(dataclasses, name))
    return values


def _fsdp_version(config: dict) -> int:
    try:
        return int((config.get("fsdp_config") or {}).get("fsdp_version") or 1)
    except (TypeError, ValueError):
        return 1  # the parser's choices refuse it


def _offload_devices(_config) -> list[str] | None:
    # DeepSpeed's own (its ZeRO config model validates the device against it in every rank); Accelerate only names
    # them in a help string ("none|cpu|nvme"). Without DeepSpeed installed: not checked here (rules.version_floors
    # says it is missing).
    import logging

    logging.disable(logging.WARNING)  # importing deepspeed logs which accelerator it picked
    try:
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
    except ImportError:
        return None
    finally:
        logging.disable(logging.NOTSET)
    return _values(OffloadDeviceEnum)


# Every enum-valued key of an Accelerate config (nested keys under their `accelerate launch` name) -> the enum upstream
# reads it with (accelerate 1.15: utils/constants.py, utils/dataclasses.py; the FSDP plugin folds names to upper case
# and takes torch's member numbers; `accelerate launch` lowers mixed_precision and the offload devices and raises
# dynamo_backend; the rest are compared as written). One check for all (`_enum_problem`), instead of one per key.
ENUMS = {
    "compute_environment": Enum("ComputeEnvironment", _accelerate_enum("ComputeEnvironment")),
    "distributed_type": Enum("DistributedType", _accelerate_enum("DistributedType")),
    "mixed_precision": Enum("PrecisionType", _accelerate_enum("PrecisionType"), case="lower"),
    "dynamo_backend": Enum("DynamoBackend", _accelerate_enum("DynamoBackend"), case="upper"),
    "dynamo_mode": Enum("TORCH_DYNAMO_MODES", lambda _c: list(_constants().TORCH_DYNAMO_MODES)),
    "fp8_backend": Enum("FP8BackendType", _accelerate_enum("FP8BackendType")),  # read as given (ACCELERATE_FP8_BACKEND)
    "fsdp_sharding_strategy": Enum("FSDP_SHARDING_STRATEGY", lambda _c: list(_constants().FSDP_SHARDING_STRATEGY),
                                   case="upper", numbered=lambda: list(_constants().FSDP_SHARDING_STRATEGY)),
    # FSDP1 only: FSDP2 takes true / false (rules.fsdp2_without_fsdp1_settings says what an FSDP1 name means there)
    "fsdp_reshard_after_forward": Enum(
        "FSDP_SHARDING_STRATEGY",
        lambda c: list(_constants().FSDP_SHARDING_STRATEGY) if _fsdp_version(c) == 1 else None,
        case="upper", numbered=lambda: list(_constants().FSDP_SHARDING_STRATEGY)),
    "fsdp_auto_wrap_policy": Enum("FSDP_AUTO_WRAP_POLICY", lambda _c: list(_constants().FSDP_AUTO_WRAP_POLICY),
                                  case="upper"),
    "fsdp_backward_prefetch": Enum("FSDP_BACKWARD_PREFETCH", lambda _c: list(_constants().FSDP_BACKWARD_PREFETCH),
                                   case="upper", numbered=lambda: list(_constants().FSDP_BACKWARD_PREFETCH)),
    # the spelling only: which types write final weights under which FSDP is rules.fsdp_state_dict_type_saves_weights'
    "fsdp_state_dict_type": Enum("FSDP_STATE_DICT_TYPE", lambda _c: list(_constants().FSDP_STATE_DICT_TYPE),
                                 case="upper", numbered=lambda: list(_constants().FSDP_STATE_DICT_TYPE)),
    "deepspeed_multinode_launcher": Enum("DEEPSPEED_MULTINODE_LAUNCHERS",
                                         lambda _c: list(_constants().DEEPSPEED_MULTINODE_LAUNCHERS)),
    "offload_optimizer_device": Enum("OffloadDeviceEnum (DeepSpeed)", _offload_devices, case="lower"),
    "offload_param_device": Enum("OffloadDeviceEnum (DeepSpeed)", _offload_devices, case="lower"),
}


def _enum_problem(name: str, value, config: dict) -> str | None:
    enum = ENUMS[name]
    if value is None or isinstance(value, (dict, list, bool)) or enum.accepts(value, config) is not False:
        return None
    names = enum.values(config)
    return f"{value!r} is not a valid {enum.name}; expected one of {', '.join(map(str, names))}" + \
        _hint(str(value), [str(n) for n in names])


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
    options = _launch_options()
    for section, key, value in _keys(data):
        name = _PREFIXED.get(section, "") + key if section and not key.startswith(_PREFIXED.get(section, "")) else key
        where = f"{section}.{key}" if section else key
        if name in ENUMS:  # the enum upstream reads it with, instead of the parser's choices (if any)
            if msg := _enum_problem(name, value, data):
                out.append(f"{path}: `{where}`: {msg}")
            continue
        if name not in options:
            if section:  # top-level keys are ClusterConfig's business (tpu_env, ...)
                out.append(f"{path}: `{where}` is not an `accelerate launch` setting; Accelerate would ignore it"
                           f"{_hint(name, options)}")
            continue
        if msg := _value_problem(options[name], value):
            out.append(f"{path}: `{where}: {value!r}`: {msg}")
    if not out:
        try:
            ClusterConfig(**processed)
        except (TypeError, ValueError) as e:  # what ClusterConfig refuses that the checks above do not know
            out.append(f"{path}: {e}")
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
