"""launch/rank/upstream_imports.py: the launcher's own process, and the ranks it starts, import peft (transformers
does, with TRL's parser classes) but not bitsandbytes, and so print no message of bitsandbytes' import; a run that
quantizes still gets it."""

from __future__ import annotations

import json

import pytest
import subprocess
import sys
import textwrap

from helpers.launcher import REPO, explain, test_env
from launch.results.outdir import RunFolder

# `python -m launch ddp --smoke --cpu --dry-run`, run as Python runs it (runpy), then what it imported: a fresh
# process, since the test process may have imported bitsandbytes already
SCRIPT = textwrap.dedent("""
    import json, runpy, sys

    sys.argv = ["launch", "ddp", "--smoke", "--cpu", "--dry-run"]
    try:
        runpy.run_module("launch", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        status = e.code
    helpers = sys.modules.get("peft.helpers")
    print("IMPORTED " + json.dumps({"status": status, "peft": "peft" in sys.modules,
                                    "peft.helpers.bnb": repr(getattr(helpers, "bnb", "no peft.helpers")),
                                    "bitsandbytes": sorted(m for m in sys.modules
                                                           if m.split(".")[0] == "bitsandbytes")}))
""")

KERNELS_MESSAGE = "Failed to load CPU gemm_4bit_forward"  # bitsandbytes/backends/cpu/ops.py, from its import


def test_a_dry_run_imports_peft_without_bitsandbytes_and_prints_no_kernels_message():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=test_env(), capture_output=True, text=True,
                          timeout=300)
    report = json.loads(proc.stdout.rsplit("IMPORTED ", 1)[-1]) if "IMPORTED " in proc.stdout else None
    assert report and report["status"] == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # peft was imported (through transformers' trainer utilities), its own import of bitsandbytes refused: the test
    # would otherwise prove nothing the day the launcher stops importing peft
    assert report["peft"] and report["peft.helpers.bnb"] == "None", report
    assert report["bitsandbytes"] == [], report
    assert KERNELS_MESSAGE not in proc.stdout + proc.stderr
    assert "pip install kernels" not in proc.stdout + proc.stderr


@pytest.mark.slow


@pytest.mark.long
def test_the_ranks_of_a_run_print_no_kernels_message_and_a_quantized_run_still_loads_bitsandbytes(smoke_runs):
    """The shared ddp and qlora-fsdp smoke runs (tests/test_smoke_recipes.py judges both): the ddp ranks' log has no
    message of bitsandbytes' import; qlora-fsdp's ranks, which load a 4-bit model, import it and train."""
    proc, summary = smoke_runs.run("ddp")
    log = RunFolder(smoke_runs.output_dir("ddp")).log.read_text()
    assert proc.returncode == 0, explain(proc)
    assert KERNELS_MESSAGE not in log and "pip install kernels" not in log
    proc, summary = smoke_runs.run("qlora-fsdp")
    assert proc.returncode == 0 and summary["verdict"]["passed"], explain(proc)
