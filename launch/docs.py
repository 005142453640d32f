"""Text in the recipe folders that is generated from the code, so that each fact is written once:

- `train.py` copies of `templates/train.py` (`launch.copies`);
- README blocks between `<!-- generated: NAME -->` and `<!-- end generated -->`: `rules-cp` / `rules-sp` (the
  rules a CP / SP configuration must keep, from `launch.rules`), and later blocks registered in GENERATORS.

`python -m launch sync-scripts` rewrites them; `check()` (run by tests/test_recipe_layout.py in CI) names every copy
or block that differs from what the code generates.
"""

from __future__ import annotations

import re
from pathlib import Path

from launch import copies
from launch.recipes import RECIPES_DIR, recipe_dirs

BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def rules_table(features: tuple[str, ...]) -> str:
    from launch.rules import RULES

    rows = ["| the configuration must keep | otherwise |", "|---|---|"]
    rows += [f"| {r.doc[0]} | {r.doc[1]} |" for r in RULES if r.doc and r.feature in features]
    return "\n".join(rows) + "\n"


# name -> function(recipe folder) -> the block's text
GENERATORS = {
    "rules-cp": lambda folder: rules_table(("parallel", "context_parallel")),
    "rules-sp": lambda folder: rules_table(("parallel", "sequence_parallel", "alst")),
}


def render(text: str, folder: Path) -> str:
    def fill(m):
        gen = GENERATORS.get(m.group("name"))
        return m.group(0) if gen is None else m.group(1) + gen(folder) + m.group(4)

    return BLOCK.sub(fill, text)


def readme_problems(folders=None) -> list[str]:
    out = []
    for folder in folders or recipe_dirs():
        readme = folder / "README.md"
        text = readme.read_text()
        for m in BLOCK.finditer(text):
            if m.group("name") not in GENERATORS:
                out.append(f"{readme}: unknown generated block `{m.group('name')}`")
        if render(text, folder) != text:
            names = [m.group("name") for m in BLOCK.finditer(text)
                     if render(m.group(0), folder) != m.group(0)]
            out.append(f"{readme}: generated block(s) {', '.join(names)} differ from the code")
    return out


def check(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    return copies.check_copies(recipes_dir) + readme_problems([p.parent for p in recipes_dir.glob("*/README.md")])


def sync(recipes_dir: Path = RECIPES_DIR, out=print) -> int:
    copies.sync_copies(recipes_dir, out=out)
    for readme in sorted(recipes_dir.glob("*/README.md")):
        text = readme.read_text()
        new = render(text, readme.parent)
        if new != text:
            readme.write_text(new)
            out(f"updated {readme}")
    return 0
