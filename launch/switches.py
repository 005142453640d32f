"""Whether a config switch is on: the one reading of an on/off value for the whole launcher.

A switch reaches us as a bool (YAML, or a training argument TRL's parser has typed), as None (not set), or as a
string: a flag written as text (an Accelerate config value, an override from the command line) or a DeepSpeed
offload device (`offload_optimizer_device` / `offload_param_device`: none, cpu or nvme, where naming a device turns
offloading on).
"""

from __future__ import annotations

# What upstream reads as true in a string: Accelerate's `str_to_bool` (y, yes, t, true, on, 1: how `accelerate launch`
# reads a config switch back from its environment) and transformers' `string_to_bool` (yes, true, t, y, 1: how TRL's
# parser reads a training flag). Every other word (false, no, off, 0, none, "") is off.
ON_WORDS = ("1", "true", "yes", "y", "t", "on")
# DeepSpeed's offload devices other than "none": naming one turns the offload on (deepspeed/runtime/offload_config.py).
OFFLOAD_DEVICES = ("cpu", "nvme")


def is_on(value) -> bool:
    """True for True, a non-zero number, an on-word (`ON_WORDS`) or an offload device (`OFFLOAD_DEVICES`), in any case
    and with surrounding blanks; False for None, False, 0 and every other string."""
    if isinstance(value, str):
        return value.strip().lower() in ON_WORDS + OFFLOAD_DEVICES
    return bool(value)
