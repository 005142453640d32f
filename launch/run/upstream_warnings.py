"""Warnings that upstream libraries raise in the training ranks about their own calls, filtered out of a launched run.

Each filter names the upstream call it is about; none matches a warning our own code could cause (we call neither
function). The launcher passes them to the ranks as PYTHONWARNINGS (`env`), so they hold from the interpreter's
start, on CPU and GPU alike, and a plain `accelerate launch` is unchanged.

- torch 2.13 deprecates `torch.distributed.all_gather_into_tensor` and `reduce_scatter_tensor` (FutureWarning; their
  replacements are `all_gather_single` and `reduce_scatter_single`). DeepSpeed 0.19.8 calls both from
  `deepspeed/comm/torch.py` (`TorchBackend.get_all_gather_function` / `get_reduce_scatter_function`, used by
  `TorchBackend.all_gather_into_tensor` and `reduce_scatter_tensor`: ZeRO's parameter gathers and gradient
  reduce-scatters), and accelerate 1.15 the first from `accelerate/utils/operations.py` (`_gpu_gather`, every
  `gather` on NCCL). Python shows a warning once per place, but the Trainer's per-step code resets that memory (any
  change to the warning filters does), so a ZeRO-3 CPU smoke run printed both messages for every rank at every step:
  about 50 lines of the 240 it printed.
"""

from __future__ import annotations

import os

# (action, start of the message, category): PYTHONWARNINGS fields; the message is matched at its start, ignoring case.
FILTERS = [
    ("ignore", "`torch.distributed.all_gather_into_tensor` is deprecated", "FutureWarning"),
    ("ignore", "`torch.distributed.reduce_scatter_tensor` is deprecated", "FutureWarning"),
]


def env(environ: dict | None = None) -> dict:
    """PYTHONWARNINGS for the ranks: FILTERS, then whatever the user set (a later entry wins, so the user's own
    settings keep precedence)."""
    environ = os.environ if environ is None else environ
    ours = [f"{action}:{message}:{category}" for action, message, category in FILTERS]
    theirs = [environ["PYTHONWARNINGS"]] if environ.get("PYTHONWARNINGS") else []
    return {"PYTHONWARNINGS": ",".join(ours + theirs)}
