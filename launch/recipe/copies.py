"""The copies of the canonical train script (`templates/train.py`) in the recipe folders: written and checked.

A recipe folder is self-contained, so it holds its own `train.py`: the template with the optional sections its
configs turn on (`launch.recipe.sections`), without the template's section lines, so that it reads top to bottom as a
plain script. Its first line, the marker line `# Copied from templates/train.py [sections: ...]`, names those sections
(the second line says how to fork) and promises that the rest equals the template rendered with them (as transformers'
`# Copied from` comments do): `check_copies` names a copy that drifted and its first differing line, or a copy whose
configs now turn on other sections; `sync_copies` (`python -m launch sync-scripts`) rewrites every marked copy with the
sections its configs turn on. Deleting the marker line forks the script: the check and the sync then leave that file
alone, and the recipe's README says why it differs. A run whose script lacks a section it needs, copy or fork, is
refused before it starts (`rules.script_holds_its_sections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launch import REPO_ROOT
from launch.errors import LaunchError
from launch.recipe.discovery import Recipe, load_yaml
from launch.recipe.sections import MARKER_PREFIX, copy_text, is_marked, marked_sections, wanted_sections
from launch.recipe.template import TEMPLATE


@dataclass
class Copy:
    path: Path
    marked: bool


def train_scripts(recipes_dir: Path) -> list[Copy]:
    return [Copy(p, is_marked(p)) for p in sorted(recipes_dir.glob("*/train.py"))]


def _wanted(folder: Path) -> tuple[str, ...]:
    recipe = Recipe(name=folder.name, path=folder, config=load_yaml(folder / "config.yaml"))
    return wanted_sections(recipe.config, recipe.accelerate)


def drift(path: Path, template: Path = TEMPLATE) -> str | None:
    """None if the marked copy equals the template rendered with the sections its marker line names; else where it
    first differs, as `file:line: ...` (the line of the copy)."""
    want = copy_text(marked_sections(path), template).splitlines()
    have = path.read_text().splitlines()
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            return f"{path}:{i + 1}: has {h.strip()!r}, {template.name} (rendered) has {w.strip()!r}"
    if len(want) != len(have):
        line = min(len(want), len(have)) + 1
        longer = "the copy" if len(have) > len(want) else f"{template.relative_to(REPO_ROOT)} (rendered)"
        return f"{path}:{line}: {longer} continues past the other's end"
    return None


def stale_sections(path: Path) -> str | None:
    """None if the marked copy holds the sections its recipe's configs turn on; else what differs, as `file:1: ...`.
    A folder without config.yaml is no recipe: only its drift is checked."""
    if not (path.parent / "config.yaml").is_file():
        return None
    try:
        wanted = _wanted(path.parent)
    except LaunchError as e:
        return f"{path}:1: its recipe's configs cannot be read ({e})"
    held = marked_sections(path)
    if set(held) == set(wanted):
        return None
    return (f"{path}:1: holds the sections [{', '.join(held) or 'none'}], but its configs turn on "
            f"[{', '.join(wanted) or 'none'}]")


def check_copies(recipes_dir: Path, template: Path = TEMPLATE) -> list[str]:
    """One line per marked copy that differs from the template, or holds other sections than its configs turn on."""
    return [problem for c in train_scripts(recipes_dir)
            if c.marked and (problem := drift(c.path, template) or stale_sections(c.path))]


def sync_script(path: Path, template: Path = TEMPLATE, out=print) -> None:
    """Rewrite one marked copy with the sections its recipe's configs turn on (in a folder without config.yaml: the
    sections its marker line names); a fork (no marker line) is left alone, and said so."""
    if not is_marked(path):
        out(f"left alone (forked: no `{MARKER_PREFIX}` line): {path}")
        return
    sections = _wanted(path.parent) if (path.parent / "config.yaml").is_file() else marked_sections(path)
    text = copy_text(sections, template)
    if path.read_text() != text:
        path.write_text(text)
        out(f"updated {path} [sections: {', '.join(sections) or 'none'}]")


def sync_copies(recipes_dir: Path, template: Path = TEMPLATE, out=print) -> int:
    """Rewrite every marked copy that differs; forks (no marker line) are left alone and listed."""
    for c in train_scripts(recipes_dir):
        sync_script(c.path, template, out)
    return 0
