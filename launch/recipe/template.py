"""The optional sections of the canonical train script, templates/train.py, as the template itself marks them.

Each section is written between a `# begin section NAME` and an `# end section NAME` line, around its RecipeArguments
fields, its lines in main() and its functions. Read from the template here: each section's fields and functions, and
the template rendered with some sections kept and the others left out, without the section lines (what a recipe's
copy holds, `launch.recipe.copies`). Which config turns on which section is `launch.recipe.sections`.

This module imports nothing of the launcher, so that the training arguments' merge (`launch.config.training_args`) can
tell a section's field from an unknown key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from launch import REPO_ROOT

TEMPLATE = REPO_ROOT / "templates" / "train.py"
_BEGIN = re.compile(r"^\s*# begin section (?P<name>[\w-]+)\s*$")
_END = re.compile(r"^\s*# end section (?P<name>[\w-]+)\s*$")
_FIELD = re.compile(r"^    (?P<key>\w+): [^=]+= field\(")  # a RecipeArguments field
_FUNCTION = re.compile(r"^def (?P<name>\w+)\(")


@dataclass(frozen=True)
class Line:
    text: str
    section: str | None  # the section it belongs to; None: the main path
    boundary: str | None = None  # "begin" or "end" for a section line


@dataclass(frozen=True)
class Parts:
    """The template's sections in order, with the RecipeArguments fields and the functions of each."""

    names: tuple[str, ...]
    keys: dict[str, tuple[str, ...]]
    functions: dict[str, tuple[str, ...]]


def lines(template: Path = TEMPLATE) -> list[Line]:
    """The template's lines with the section each belongs to. A section inside another, an end line that closes no
    open section, or a section left open is a ValueError naming the line: the template is ours, not user input."""
    out, current = [], None
    for number, text in enumerate(template.read_text().splitlines(keepends=True), start=1):
        begin, end = _BEGIN.match(text), _END.match(text)
        if begin:
            if current is not None:
                raise ValueError(f"{template}:{number}: section {begin['name']} begins inside section {current}")
            current = begin["name"]
            out.append(Line(text, current, "begin"))
        elif end:
            if end["name"] != current:
                raise ValueError(f"{template}:{number}: `# end section {end['name']}` closes no open section")
            out.append(Line(text, current, "end"))
            current = None
        else:
            out.append(Line(text, current))
    if current is not None:
        raise ValueError(f"{template}: section {current} has no `# end section {current}` line")
    return out


@lru_cache(maxsize=4)
def _parts(template: Path, mtime_ns: int) -> Parts:
    names: list[str] = []
    keys: dict[str, list[str]] = {}
    functions: dict[str, list[str]] = {}
    for line in lines(template):
        if line.section is None or line.boundary == "end":
            continue
        if line.boundary == "begin":
            if line.section not in names:
                names.append(line.section)
                keys[line.section], functions[line.section] = [], []
        elif m := _FIELD.match(line.text):
            keys[line.section].append(m["key"])
        elif m := _FUNCTION.match(line.text):
            functions[line.section].append(m["name"])
    return Parts(tuple(names), {n: tuple(v) for n, v in keys.items()}, {n: tuple(v) for n, v in functions.items()})


def parts(template: Path = TEMPLATE) -> Parts:
    return _parts(template, template.stat().st_mtime_ns)


def section_of_key(key: str, template: Path = TEMPLATE) -> str | None:
    """The section whose RecipeArguments field `key` is, or None."""
    return next((name for name, keys in parts(template).keys.items() if key in keys), None)


def render(sections, template: Path = TEMPLATE) -> str:
    """The template with `sections` kept and the others left out, without the section lines. A left-out section
    that follows a blank line takes the blank lines after it along, so that no gap of blank lines is left."""
    out: list[str] = []
    skip_blank = False
    for line in lines(template):
        if line.boundary == "end" and line.section not in sections:
            skip_blank = not out or not out[-1].strip()
        if line.boundary or (line.section is not None and line.section not in sections):
            continue
        if skip_blank and not line.text.strip():
            continue
        skip_blank = False
        out.append(line.text)
    return "".join(out)
