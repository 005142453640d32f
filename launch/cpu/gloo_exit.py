"""Gloo only: a rank that aborts at exit after training and saving succeeded.

PyTorch behaviour worked around (torch 2.13, C++ `ProcessGroupGloo::runLoop`): a gloo worker thread drops its
reference to a finished collective only after the caller has been woken. When that Work holds tensors Python also
references (DeepSpeed's and FSDP2's gathers at save time, CP's K/V all-gather), dropping it takes the GIL
(`TensorImpl::decref_pyobject`); if the main thread has reached interpreter finalization by then (a rank exits
right after the last collective), the worker dies inside that destructor and the process aborts with "terminate
called without an active exception" (SIGABRT): seen in about 1 run in 3 with cp=4 and 4 of 17 DeepSpeed CPU runs,
also with plain DTensor redistributes and no Accelerate (pytorch PR #179291 describes it; abandoned). An `atexit`
hook that sleeps 50 ms releases the GIL while the interpreter is still alive, so the worker finishes first
(measured: 2 of 10 bare reproductions failed without it, 0 of 16 with it).
"""

from __future__ import annotations

import atexit
import time

_registered = False


def let_gloo_workers_finish_at_exit(seconds: float = 0.05) -> None:
    """Register (once) an atexit hook that releases the GIL for a moment before interpreter finalization."""
    global _registered
    if not _registered:
        atexit.register(time.sleep, seconds)
        _registered = True
