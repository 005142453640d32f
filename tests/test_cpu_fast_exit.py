"""launch/cpu/fast_exit.py: a CPU rank's objects are frozen before interpreter finalization, once, and what the rank
wrote is intact.

A fresh interpreter registers a probe atexit hook first, then the fix: atexit runs hooks last-registered first, so the
probe runs after the fix's hook, at the moment finalization would begin, and reports what it sees. No torch import:
the hook is plain CPython.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, gc, sys

    class Cycle:  # an object kept alive only by a reference cycle, as library objects often are
        def __init__(self):
            self.me = self

    def probe():
        print("frozen at exit:", gc.get_freeze_count() > 0, flush=True)

    atexit.register(probe)
    objects = [Cycle() for _ in range(1000)]
    if sys.argv[1] == "fix":
        from launch.cpu import fast_exit

        fast_exit.skip_collection_at_exit()
        fast_exit.skip_collection_at_exit()  # idempotent
    with open(sys.argv[2], "w") as f:  # a file the rank writes and closes, as train.py's outputs are
        f.write("written")
""")


def _run(mode: str, tmp_path) -> tuple[str, str]:
    out = tmp_path / f"{mode}.txt"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, out.read_text()


def test_without_the_fix_nothing_is_frozen_at_exit(tmp_path):
    assert _run("upstream", tmp_path) == ("frozen at exit: False\n", "written")


def test_the_fix_freezes_every_object_before_finalization_and_the_rank_output_is_intact(tmp_path):
    assert _run("fix", tmp_path) == ("frozen at exit: True\n", "written")
