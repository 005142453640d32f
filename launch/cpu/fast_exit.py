"""CPU path: a rank's interpreter teardown without the cyclic garbage collector's passes over every object.

CPython behaviour worked around (3.11): at exit the interpreter clears every module and runs the cyclic garbage
collector over all live objects. A rank has about 500,000 of them after importing torch, transformers, TRL and
DeepSpeed, and the teardown took 1.3 s of CPU per process here (a process that only imports TRL's SFTTrainer: 5.5 s
with the teardown, 4.2 s with this hook). A CPU smoke run trains its 12 steps in under a second, so its cost is start-up
and teardown: on a 2-core CI machine, 2 ranks of a DeepSpeed smoke run spent 17.2 CPU-s instead of 18.9 (two runs
each), about 9% of the whole suite's CPU.

`gc.freeze()` in an atexit hook moves every object into the permanent generation, which the collector never scans:
reference counting still frees what the module teardown releases; what is skipped are finalizers of objects kept alive
only by reference cycles at exit. Nothing a rank must write depends on those: train.py returns after
`trainer.save_model`, `save_state` and `trainer.end()` (the checkpoint, trainer_state.json and trackio's store are
written and closed by then), and the interpreter flushes stdout and stderr itself. The GPU path keeps Python's own
teardown: there a second more at exit is nothing beside a real run.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_collection_at_exit() -> None:
    """Register (once) an atexit hook that freezes every object before interpreter finalization."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True
