"""The training processes import nothing of the launcher: `launch/rank/` and `launch/cpu/` (what they import) and the
train scripts reach no module of `launch` outside those two packages, so a recipe under plain `accelerate launch`
(or `trl sft`) loads none of the launcher, and a launcher change cannot break a running rank."""

import ast
from pathlib import Path

import pytest

from launch import REPO_ROOT

RANK_SIDE = ("launch.rank", "launch.cpu")


def launch_imports(path: Path) -> set[str]:
    """The `launch...` modules a file imports, anywhere in it (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "launch"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "launch":
            if node.module == "launch":  # `from launch import x`: x is a module of the package (or a name of its face)
                found |= {f"launch.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return found


def rank_side_files() -> list[Path]:
    files = [p for pkg in ("rank", "cpu") for p in sorted((REPO_ROOT / "launch" / pkg).rglob("*.py"))]
    return files + [REPO_ROOT / "templates" / "train.py", *sorted((REPO_ROOT / "recipes").glob("*/train.py"))]


@pytest.mark.parametrize("path", rank_side_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_the_rank_side_imports_nothing_of_the_launcher(path):
    outside = sorted(m for m in launch_imports(path) if not m.startswith(RANK_SIDE))
    assert outside == [], f"{path.relative_to(REPO_ROOT)} imports launcher modules {outside}: the ranks must not"


def test_the_check_sees_an_import_of_the_launcher(tmp_path):
    """The check can fail: a rank-side file importing the launcher's runner is caught, whatever the import's form."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from launch.run import runner\n    import launch.results.outdir\n"
                   "    from launch.rank import monitor\n")
    assert launch_imports(bad) == {"launch.run", "launch.results.outdir", "launch.rank"}
