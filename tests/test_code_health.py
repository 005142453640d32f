"""The launcher's code stays whole: every import of `launch...` in the repository resolves (the ones inside functions
too, which nothing else runs until their branch is taken: a moved module must not survive as a broken lazy import),
and no top-level definition in launch/ is left unreferenced (vulture, pinned in requirements/cpu.lock).

Both checks read every tracked Python file: launch/, the recipes' train.py copies, templates/, tests/, benchmarks/,
ci/. A definition referenced only by a test or a benchmark counts as referenced."""

from __future__ import annotations

import ast
import importlib
import subprocess
from pathlib import Path

import pytest
import vulture

from launch import REPO_ROOT

# Entry points that nothing references by name. A decorator registers a function: `@rule` (launch/checks/rules:
# the preflight's registry) and `@command` (launch/commands: `python -m launch NAME`).
ENTRY_DECORATORS = ["@rule", "@command"]
# Names that are referenced from outside Python (none today); each with the reason it stays.
ALLOWED: dict[str, str] = {}
# Folders that are not the launcher's code: the CPU path's sitecustomize is imported by Python itself.
NOT_SCANNED = ("launch/cpu/site/",)


def tracked_python() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    return [REPO_ROOT / n for n in names if (REPO_ROOT / n).is_file()]


def launch_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for each import of `launch...` in a file, wherever it stands; name None for `import m`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "launch"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "launch":
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def unresolved(path: Path) -> list[str]:
    problems = []
    for line, module, name in launch_imports(path):
        where = f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}:{line}"
        try:
            imported = importlib.import_module(module)
        except ImportError as e:
            problems.append(f"{where}: {module}: {e}")
            continue
        if name is not None and name != "*" and not hasattr(imported, name):
            try:  # `from launch.pkg import module`
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                problems.append(f"{where}: {module} has no {name}")
    return problems


def test_every_import_of_the_launcher_resolves():
    problems = [p for path in tracked_python() if not str(path.relative_to(REPO_ROOT)).startswith(NOT_SCANNED)
                for p in unresolved(path)]
    assert problems == [], "imports that would fail when their line runs:\n" + "\n".join(problems)


def test_the_import_check_sees_a_broken_lazy_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from launch.memory_plan import plan_memory\n    import launch.nowhere\n"
                   "    from launch.memory import no_such_name\n    from launch.memory import plan\n")
    found = unresolved(bad)
    assert [p.split(": ", 1)[1].split(":")[0] for p in found] == [
        "launch.memory_plan", "launch.nowhere", "launch.memory has no no_such_name"]


def _top_level_names(path: Path) -> set[tuple[int, str]]:
    """(line, name) of what a module defines at its top level: functions, classes, assigned names."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add((node.lineno, node.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {(t.lineno, t.id) for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    return names


def unreferenced(paths: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """The top-level definitions of launch/ that no scanned file references (vulture's 60%-confidence findings,
    which are exactly the unused names; attributes and methods are left out: a top-level name is the unit here)."""
    scanner = vulture.Vulture(ignore_decorators=ENTRY_DECORATORS, ignore_names=list(ALLOWED))
    scanner.scavenge([str(p) for p in paths])
    tops: dict[Path, set] = {}
    found = []
    for item in scanner.get_unused_code(min_confidence=60):
        path = Path(item.filename).resolve()
        if not path.is_relative_to(root):
            continue
        rel = str(path.relative_to(root))
        if not rel.startswith("launch/") or rel.startswith(NOT_SCANNED):
            continue
        if path not in tops:
            tops[path] = _top_level_names(path)
        if (item.first_lineno, item.name) in tops[path]:
            found.append(f"{rel}:{item.first_lineno}: {item.typ} {item.name}")
    return sorted(found)


@pytest.fixture(scope="module")
def python_files() -> list[Path]:
    return tracked_python()


def test_no_top_level_definition_in_launch_is_unreferenced(python_files):
    found = unreferenced(python_files)
    assert found == [], ("definitions nothing in the repository uses (remove them, or add an entry point to "
                         "ALLOWED in tests/test_code_health.py with the reason):\n" + "\n".join(found))


def test_the_dead_code_check_finds_an_unused_function(python_files, tmp_path):
    """The check can fail: a probe module beside the real code, its two definitions used nowhere."""
    dead = tmp_path / "launch" / "_dead_code_probe.py"
    dead.parent.mkdir()
    dead.write_text('"""Probe."""\n\n\ndef never_called():\n    return 1\n\n\nUNUSED = 2\n')
    found = unreferenced([*python_files, dead], root=tmp_path.resolve())
    assert found == [
        "launch/_dead_code_probe.py:4: function never_called", "launch/_dead_code_probe.py:8: variable UNUSED"]
