"""An upstream import that the launcher and the ranks it starts keep out: peft's eager import of bitsandbytes.

transformers imports peft with every `TrainingArguments` when peft is installed (`transformers/trainer_utils.py`:
`if is_peft_available(): from peft import PeftMixedModel, PeftModel`), so the launcher imports it whenever it builds
a recipe's parser (`launch.config.training_args`: the run form, plan, bench, record). peft then imports bitsandbytes at
its own import (`peft/helpers.py`: `try: import bitsandbytes as bnb except ImportError: bnb = None`, used only by
`find_kappa_target_modules`, which the launcher never calls). That import cost about 0.8 s of a dry run, and on a CPU
with AVX512-BF16 bitsandbytes printed, from its import, "Failed to load CPU gemm_4bit_forward from kernels-community:
No module named 'kernels'. Please make sure you already `pip install kernels` ..." (`bitsandbytes/backends/cpu/ops.py`
looks for an optional kernel on the Hub; without it bitsandbytes uses its own compiled CPU kernel, so the message asks
for a package nothing needs). The launcher quantizes nothing (the ranks load the 4-bit model), so while it runs
(`kept_out`), that one import inside peft is refused, as on a machine without bitsandbytes, and peft imports without
it. Everything else that imports bitsandbytes gets it as usual (doctor's 4-bit check, `launch.checks.image`; in a
rank, transformers' 4-bit and 8-bit loading and its bitsandbytes optimizers, which import it themselves).

peft itself stays: transformers imports it without a way around short of hiding the installed package from
transformers, which would change what its trainer utilities believe for the rest of the process.

The ranks a launcher starts do the same while train.py builds its parser (its `__main__` block, when
`LAUNCH_MONITOR_DIR` says `python -m launch` started it; this module is rank-side: it imports nothing of the launcher):
0.8 s of CPU per rank, and the message once per rank. Under plain `accelerate launch` a rank imports as upstream does.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys

IMPORTER = "peft.helpers"  # the module whose import of bitsandbytes is refused
REFUSED = "bitsandbytes"


class _Refuse(importlib.abc.Loader):
    """A loader whose module cannot be created: `import REFUSED` raises ModuleNotFoundError, as when not installed."""

    def create_module(self, spec):
        raise ModuleNotFoundError(f"{spec.name} is not imported by {IMPORTER} in the launcher "
                                  "(launch.upstream_imports)",
                                  name=spec.name)

    def exec_module(self, module):  # never reached
        raise AssertionError


class _KeepOut(importlib.abc.MetaPathFinder):
    """While IMPORTER executes, its first look-up of REFUSED gets a spec that cannot load (a spec, not None: a
    query such as `importlib.util.find_spec` would still say, truthfully, that it is installed). Once."""

    def __init__(self):
        self.inside = self.done = False

    def find_spec(self, name, path, target=None):
        if name == REFUSED and self.inside and not self.done:
            self.done = True
            return importlib.machinery.ModuleSpec(name, _Refuse())
        if name != IMPORTER or self.done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_watched(module):
            self.inside = True
            try:
                exec_module(module)
            finally:
                self.inside = False

        spec.loader.exec_module = exec_watched
        return spec


@contextlib.contextmanager
def kept_out():
    """While the block runs, peft (when it is first imported in it) imports without bitsandbytes."""
    if IMPORTER in sys.modules or REFUSED in sys.modules:  # already imported: nothing to keep out
        yield
        return
    finder = _KeepOut()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
