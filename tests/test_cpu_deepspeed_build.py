"""launch/cpu/deepspeed_build.py: on the CPU path DeepSpeed's `cpu_adam` op is compiled as one translation unit,
without debug information.

The first case shows DeepSpeed's own flags (with `-g`) and sources (two files) and the fix's (the same flags less
`-g`; one file that #includes the two) in a fresh process, whose imports the patch cannot leak out of; the last reads
what the zero3-offload smoke run's `cpu_adam` was built with (torch's JIT build file), the run CI makes anyway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

from torch.utils.cpp_extension import _get_build_directory

from launch.cpu.deepspeed_build import ONE_UNIT, one_unit_source

SCRIPT = textwrap.dedent("""
    import json, os
    from deepspeed.ops.op_builder import CPUAdamBuilder
    from launch.cpu import deepspeed_build

    def build():
        builder = CPUAdamBuilder()
        sources = [os.path.abspath(builder.deepspeed_src_path(path)) for path in builder.sources()]
        return {"flags": builder.cxx_args(), "sources": sources}

    seen = {"upstream": build()}
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "false"  # not a DeepSpeed run: nothing to patch
    seen["patched without DeepSpeed"] = [deepspeed_build.drop_debug_info(), deepspeed_build.one_translation_unit()]
    seen["untouched"] = build()
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # as `accelerate launch` sets it for a DeepSpeed config
    seen["patched"] = [deepspeed_build.drop_debug_info(), deepspeed_build.drop_debug_info(),
                       deepspeed_build.one_translation_unit(), deepspeed_build.one_translation_unit()]
    seen["fixed"] = build()
    seen["one unit"] = open(seen["fixed"]["sources"][0]).read()
    print(json.dumps(seen))
""")


def test_cpu_adam_builds_one_unit_of_its_own_sources_without_the_debug_flag(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="",  # one fresh process: the patch cannot leak into this one
               TORCH_EXTENSIONS_DIR=str(tmp_path))  # the generated file goes to this build root, not the real one
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    upstream, fixed = seen["upstream"], seen["fixed"]
    # DeepSpeed's own: what the fix has to change
    assert "-g" in upstream["flags"] and "-O3" in upstream["flags"]
    assert [os.path.basename(path) for path in upstream["sources"]] == ["cpu_adam.cpp", "cpu_adam_impl.cpp"]
    assert seen["patched without DeepSpeed"] == [False, False] and seen["untouched"] == upstream
    assert seen["patched"] == [True, True, True, True]  # idempotent
    assert fixed["flags"] == [arg for arg in upstream["flags"] if arg != "-g"]
    # one file, in the op's build folder under the build root, that includes exactly DeepSpeed's two, in order
    [one_unit] = fixed["sources"]
    assert one_unit == os.path.join(tmp_path, "cpu_adam", ONE_UNIT)  # torch's build folder of the op under that root
    assert re.findall(r'^#include "(.*)"$', seen["one unit"], re.M) == upstream["sources"]


def test_the_one_unit_file_is_rewritten_only_when_its_text_changes(tmp_path):
    first = one_unit_source(["/a.cpp", "/b.cpp"], tmp_path / "cpu_adam")
    os.utime(first, (1, 1))  # an old file: one written again would carry a new time
    assert one_unit_source(["/a.cpp", "/b.cpp"], tmp_path / "cpu_adam") == first and first.stat().st_mtime == 1
    assert one_unit_source(["/a.cpp", "/c.cpp"], tmp_path / "cpu_adam") == first and first.stat().st_mtime > 1
    assert '#include "/c.cpp"' in first.read_text()
    assert sorted(path.name for path in first.parent.iterdir()) == [ONE_UNIT]  # no partial file left


def test_the_offload_smoke_runs_cpu_adam_is_built_as_one_unit_without_debug_info(smoke_runs):
    proc, _ = smoke_runs.run("zero3-offload")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ninja = open(os.path.join(_get_build_directory("cpu_adam", verbose=False), "build.ninja")).read()
    cflags = next(line for line in ninja.splitlines() if line.startswith("cflags ="))
    assert "-O3" in cflags.split() and "-g" not in cflags.split(), cflags
    compiled = re.findall(r"^build (\S+\.o): compile (\S+)$", ninja, re.M)
    assert [os.path.basename(source) for _, source in compiled] == [ONE_UNIT], compiled
