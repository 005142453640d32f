"""Copies of the canonical train script (`templates/train.py`) in the recipe folders.

A recipe folder is self-contained, so it holds its own `train.py`. A copy that starts with the marker line
`# Copied from templates/train.py` promises to equal the template below that line (as transformers' `# Copied from`
comments do): `check_copies` finds a copy that drifted and names its first differing line, and `sync_copies`
(`python -m launch sync-scripts`) rewrites the marked copies from the template. Deleting the marker line forks the
script: the check and the sync then leave that file alone, and the recipe's README says why it differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launch import REPO_ROOT

TEMPLATE = REPO_ROOT / "templates" / "train.py"
MARKER = "# Copied from templates/train.py (python -m launch sync-scripts keeps it equal; delete this line to fork it)"
MARKER_PREFIX = "# Copied from templates/train.py"


@dataclass
class Copy:
    path: Path
    marked: bool


def copy_text(template: Path = TEMPLATE) -> str:
    """What a marked copy must contain: the marker line, then the template."""
    return MARKER + "\n" + template.read_text()


def is_marked(path: Path) -> bool:
    with open(path) as f:
        return f.readline().startswith(MARKER_PREFIX)


def train_scripts(recipes_dir: Path) -> list[Copy]:
    return [Copy(p, is_marked(p)) for p in sorted(recipes_dir.glob("*/train.py"))]


def drift(path: Path, template: Path = TEMPLATE) -> str | None:
    """None if the marked copy equals the template; else where it first differs, as `file:line: ...`."""
    want = copy_text(template).splitlines()
    have = path.read_text().splitlines()
    for i, (w, h) in enumerate(zip(want, have)):
        if w != h:
            return f"{path}:{i + 1}: has {h.strip()!r}, {template.name} has {w.strip()!r}"
    if len(want) != len(have):
        line = min(len(want), len(have)) + 1
        longer = "the copy" if len(have) > len(want) else str(template.relative_to(REPO_ROOT))
        return f"{path}:{line}: {longer} continues past the other's end"
    return None


def check_copies(recipes_dir: Path, template: Path = TEMPLATE) -> list[str]:
    """One line per marked copy that differs from the template."""
    return [d for c in train_scripts(recipes_dir) if c.marked and (d := drift(c.path, template))]


def sync_copies(recipes_dir: Path, template: Path = TEMPLATE, out=print) -> int:
    """Rewrite every marked copy that differs; forks (no marker) are left alone and listed."""
    text = copy_text(template)
    for c in train_scripts(recipes_dir):
        if not c.marked:
            out(f"left alone (forked: no `{MARKER_PREFIX}` line): {c.path}")
        elif c.path.read_text() != text:
            c.path.write_text(text)
            out(f"updated {c.path}")
    return 0
