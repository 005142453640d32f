"""The documentation holds together: README.md stays a front page that states the project's test command, every
link between the pages (and to the repository's files) resolves, every page under docs/ is reachable from README,
and the generated tables say what the code says: the floors of launch/ (docs/architecture.md) from its imports, the
recipe table (README) from the recipe folders. That every generated block is current is checked with the recipes'
own blocks (tests/test_recipe_layout.py, `readme_blocks.check`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch import REPO_ROOT
from launch.catalog import blocks as readme_blocks, floors
from launch.errors import LaunchError

README = REPO_ROOT / "README.md"
PAGES = readme_blocks.pages()
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
MAX_README_LINES = 200


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())  # a link inside a code block is not a link
    return [m.group(1) or m.group(2) for m in LINK.finditer(text)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (f"README.md has {lines} lines; it is the front page (at most "
                                       f"{MAX_README_LINES}): "
                                       "move the details into a page under docs/ and link it")


def test_readme_states_the_test_command_that_ci_runs():
    """.ci/run runs the project's test command; README.md must state that very command."""
    [command] = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
                 if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert command == "bash ci/test.sh"
    assert f"`{command}` is the project's test command" in README.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading with the anchor #{anchor}")
    assert broken == [], f"{page.relative_to(REPO_ROOT)}: broken links: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    missing = [str(p.relative_to(REPO_ROOT)) for p in PAGES if p != README and p.resolve() not in linked]
    assert missing == [], f"pages nobody reaches from README.md: {missing}"


def test_the_floor_table_is_generated_from_the_imports():
    page = REPO_ROOT / "docs" / "architecture.md"
    assert "<!-- generated: floors -->" in page.read_text()
    assert readme_blocks.page_problems([page]) == []


def test_launch_has_no_import_cycle_and_at_most_nine_floors():
    # Nine since launch/ was grouped into concern packages (a package is one room): the entry point, commands/,
    # catalog/, run/, speed/, checks/ memory/ results/, config/, recipe/, and the rooms that import nothing.
    floor = floors.floors()  # raises on a cycle
    top = sorted(floor, key=lambda name: -floor[name])
    assert floor["__main__.py"] == max(floor.values()) <= 9, (
        "launch/ should have at most 9 floors, with the entry point on top: "
        + ", ".join(f"{n} {floor[n]}" for n in top))


def test_no_import_cycle_between_the_modules_of_launch_inside_a_folder_either():
    assert floors.module_cycle() == []


def test_a_cycle_inside_a_folder_is_found(tmp_path):
    pkg = write(tmp_path / "pkg", {"__init__.py": "", "sub/__init__.py": "from pkg.sub import a\n",
                                   "sub/a.py": "def f():\n    from pkg.sub.b import g\n",
                                   "sub/b.py": "from . import a\n"})
    assert floors.floors(pkg) == {"sub/": 1}  # one room: the floors cannot see it
    assert floors.module_cycle(pkg) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_floors_follow_every_form_of_import(tmp_path):
    pkg = write(tmp_path / "pkg", {
        "__init__.py": "ROOT = 1\n",
        "a.py": "import os\n",
        "b.py": "from pkg import a\n",
        "c.py": "import pkg.b as b\n",
        "d.py": "from pkg import ROOT\n",  # the package's face: no arrow
        "sub/__init__.py": '"""A folder is one room."""\n',
        "sub/x.py": "def f():\n    from pkg.c import g\n",  # inside a function too
        "sub/y.py": "from . import x\nfrom ..a import z\n",  # inside its own folder: no arrow; `..a` is a.py
    })
    assert floors.floors(pkg) == {"a.py": 1, "b.py": 2, "c.py": 3, "d.py": 1, "sub/": 4}
    assert floors.rooms(pkg)["sub/"].imports == {"c.py", "a.py"}
    assert floors.rooms(pkg)["sub/"].doc == "A folder is one room."


def test_an_import_cycle_is_an_error_that_names_it(tmp_path):
    pkg = write(tmp_path / "pkg", {"__init__.py": "", "a.py": "from pkg.b import f\n", "b.py": "import pkg.a\n",
                                   "c.py": "from pkg import a\n"})
    with pytest.raises(LaunchError, match=r"import cycle: a\.py -> b\.py -> a\.py"):
        floors.floors(pkg)


def test_the_recipe_table_holds_the_recipes_it_lists_to_their_folders():
    """The README's table is checked row by row against the folders: a recipe you add (copied or forked) needs no
    row, a listed one whose facts changed or whose folder is gone does."""
    full = readme_blocks.recipe_table(None)
    without_zero3 = "\n".join(line for line in full.splitlines() if "recipes/zero3/" not in line) + "\n"
    assert readme_blocks.recipe_table(without_zero3) == without_zero3  # an unlisted folder: no row required
    assert readme_blocks.recipe_table(full) == full
    gone = full.replace("recipes/ddp/", "recipes/no-such-recipe/")
    assert readme_blocks.recipe_table(gone) != gone
    block = "<!-- generated: recipe-table -->\n{}<!-- end generated -->\n"
    changed = block.format(full.replace("| DeepSpeed ZeRO-3 | 8 |", "| DeepSpeed ZeRO-3 | 4 |"))
    assert changed != block.format(full)
    assert readme_blocks.render_page(changed, checking=True) != changed
    assert readme_blocks.render_page(block.format(full), checking=True) == block.format(full)
