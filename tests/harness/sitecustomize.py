"""Test harness only: fault injection into the training ranks, from outside the recipe's train.py.

The tests put this folder on PYTHONPATH (conftest.launch_cli(fault=...)), so Python imports this module at the start
of every process of the job: the launcher, `accelerate launch`, and each rank. It does nothing unless
RECIPES_TEST_FAULT="RANK:STEP:ACTION" is set. Then, once `transformers.trainer` is imported (by the rank's train.py),
every Trainer gets a callback that, at the end of optimizer step STEP on global rank RANK, either raises
(ACTION=raise: a dying rank) or stops making progress (ACTION=hang: sleeps, alive but silent).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

SPEC = os.environ.get("RECIPES_TEST_FAULT")


def _fault_callback(spec: str):
    import time

    from transformers import TrainerCallback

    rank, step, action = spec.split(":")

    class FaultInjection(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == int(step) and os.environ.get("RANK", "0") == rank:
                # the wall-clock time of the event, for the tests' bounds measured from it (not from the start)
                print(f"[fault injection] rank {rank} {action}s at step {step} (at unix time {time.time():.3f})",
                      flush=True)
                if action == "hang":
                    time.sleep(3600)
                raise RuntimeError(f"injected failure (RECIPES_TEST_FAULT={spec})")

    return FaultInjection()


def _patch_trainer(module) -> None:
    original_init = module.Trainer.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.add_callback(_fault_callback(SPEC))

    module.Trainer.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs _patch_trainer right after `transformers.trainer` is executed (no eager import of transformers)."""

    def find_spec(self, name, path, target=None):
        if name != "transformers.trainer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch_trainer(module)

        spec.loader.exec_module = exec_and_patch
        return spec


if SPEC:
    sys.meta_path.insert(0, _AfterImport())
