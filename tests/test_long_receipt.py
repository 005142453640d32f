"""The long tier's receipt: CI does not run the tests marked `long` (tests/conftest.py deselects them), so it checks
that `bash ci/long.sh` ran them on this very tree and that they all passed (ci/long_receipt.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

from helpers.launcher import REPO

spec = importlib.util.spec_from_file_location("long_receipt", REPO / "ci" / "long_receipt.py")
long_receipt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(long_receipt)


def test_the_long_tests_ran_on_this_tree_and_passed():
    assert not long_receipt.problems(), "\n".join(long_receipt.problems())


def test_the_receipt_lists_every_long_test_of_this_tree(request):
    """The receipt's tests are the ones pytest collects as long now (none added or renamed since): this session's
    own collection when it collected the whole suite (tests/conftest.py), else a collection of its own."""
    collected = getattr(request.config, "_long_tests", None)
    if collected is None:
        # this interpreter (the venv's: ci/test.sh runs it without activating the venv, so `python` may be another)
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--long", "-m", "long",
                              "-p", "no:cacheprovider", "-p", "no:xdist"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    receipt = json.loads(long_receipt.RECEIPT.read_text())
    assert {t["test"] for t in receipt["tests"]} == collected


def test_a_change_to_an_input_makes_the_receipt_stale(tmp_path):
    """The check can fail: a copy of the tree with one input changed (a byte of a recipe config) is refused, a change
    to prose only (docs, a README) is not."""
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(tmp_path / "tree")], check=True)
    tree = tmp_path / "tree"
    for name in long_receipt.inputs(REPO) + [str(long_receipt.RECEIPT.relative_to(REPO))]:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tree / name)  # the working tree's files, committed or not
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True)
    assert long_receipt.inputs_sha256(tree) == long_receipt.inputs_sha256(REPO)
    (tree / "README.md").write_text((tree / "README.md").read_text() + "\nprose\n")
    assert long_receipt.inputs_sha256(tree) == long_receipt.inputs_sha256(REPO)
    config = tree / "recipes" / "ddp" / "config.yaml"
    config.write_text(config.read_text() + "\n")
    assert long_receipt.inputs_sha256(tree) != long_receipt.inputs_sha256(REPO)
    assert any("another tree" in p for p in long_receipt.problems(tree))
