"""Test harness only: fault injection from outside the recipe's train.py and the launcher's code.

The tests put this folder on PYTHONPATH (helpers.launcher.test_env(fault=...), tests/test_interrupt.py), so Python
imports this module at the start of every process that inherits it: the launcher, `accelerate launch`, and each rank.
It does nothing unless one of its variables is set:

- RECIPES_TEST_FAULT="RANK:STEP:ACTION": once `transformers.trainer` is imported (by the rank's train.py), every
  Trainer gets a callback that, at the end of optimizer step STEP on global rank RANK, either raises (ACTION=raise: a
  dying rank) or stops making progress (ACTION=hang: sleeps, alive but silent).
- RECIPES_TEST_SIGINT_AT=POINT: the process sends itself SIGINT (what a Ctrl-C in a terminal delivers) at a named
  point of its start-up, so that a test hits that point exactly instead of sleeping and hoping: `import:MODULE` as
  soon as MODULE starts executing (inside the import that reached it: `import:numpy.lib` is in the middle of numpy's
  own `__init__`), `call:MODULE.FUNCTION` when FUNCTION of MODULE is called (patched right after MODULE is executed,
  so that a `from MODULE import FUNCTION` made later gets the patched one too).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

SPEC = os.environ.get("RECIPES_TEST_FAULT")
SIGINT_AT = os.environ.get("RECIPES_TEST_SIGINT_AT")


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


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs `before(module)` when the module `name` starts executing and `after(module)` right after (no eager
    import of anything); once."""

    def __init__(self, name: str, before=None, after=None):
        self.name, self.before, self.after, self.done = name, before, after, False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done:
            return None
        self.done = True  # (not removed from sys.meta_path: the import system is iterating over it)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_hook(module):
            if self.before:
                self.before(module)
            exec_module(module)
            if self.after:
                self.after(module)

        spec.loader.exec_module = exec_and_hook
        return spec


def _sigint(*_) -> None:
    import signal

    signal.raise_signal(signal.SIGINT)


def _sigint_on_call(function: str):
    def patch(module) -> None:
        original = getattr(module, function)

        def interrupted(*args, **kwargs):
            _sigint()
            return original(*args, **kwargs)

        setattr(module, function, interrupted)

    return patch


if SPEC:
    sys.meta_path.insert(0, _OnImport("transformers.trainer", after=_patch_trainer))
if SIGINT_AT:
    kind, _, where = SIGINT_AT.partition(":")
    if kind == "import":
        sys.meta_path.insert(0, _OnImport(where, before=_sigint))
    elif kind == "call":
        module_name, _, function_name = where.rpartition(".")
        sys.meta_path.insert(0, _OnImport(module_name, after=_sigint_on_call(function_name)))
    else:
        raise ValueError(f"RECIPES_TEST_SIGINT_AT={SIGINT_AT}: give import:MODULE or call:MODULE.FUNCTION")
