"""Which optional sections of templates/train.py a recipe needs, and which a recipe's train.py holds.

A recipe's train.py holds the template's main path plus the sections its configs turn on (SECTIONS), so that a DDP
or ZeRO recipe's script holds no ALST code (the sections themselves: `launch.recipe.template`). A copy says which it
holds on its first line, the marker line `# Copied from templates/train.py [sections: ...]`; a fork (a copy whose
marker line was deleted) holds the sections whose functions it still defines. Used by `launch.recipe.copies`, which
writes and checks the copies, and by `rules.script_holds_its_sections`, which refuses a run whose script lacks a section
the run needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launch.recipe import template as train_template
from launch.errors import LaunchError
from launch.constants import MESH_KEYS
from launch.switches import is_on

MARKER_PREFIX = "# Copied from templates/train.py"
_MARKER = re.compile(re.escape(MARKER_PREFIX) + r"(?: \[sections: (?P<sections>[^\]]*)\])?")


def _number(value) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0  # not a number: the training arguments' parser or Accelerate's own classes refuse it


@dataclass(frozen=True)
class Section:
    name: str  # as in the template's `# begin section NAME` lines
    turned_on_by: str  # said in messages
    on: Callable[[dict, dict], bool]  # (config.yaml, Accelerate config) -> whether the recipe uses the section


# In template order. The synthetic-run code stays in the main path: `--synthetic` is a launcher option of every recipe.
SECTIONS = (
    Section("tiled-mlp", "`tiled_mlp: true` in config.yaml",
            lambda config, accelerate: is_on(config.get("tiled_mlp"))),
    Section("join-documents", "`join_documents_min_chars` above 0 in config.yaml",
            lambda config, accelerate: _number(config.get("join_documents_min_chars")) > 0),
    # The size as the config writes it (launch.config.layout, which validates the mesh, stands above this module). The
    # patch runs only when a sequence-parallel run resumes, but the recipes that can resume one are those with SP.
    Section("ulysses-resume", "`parallelism_config_sp_size` above 1 in the Accelerate config",
            lambda config, accelerate: _number((accelerate.get("parallelism_config") or {}).get(MESH_KEYS["sp"])) > 1),
    Section("fsdp1-adapter", "`use_peft: true` in config.yaml with an FSDP1 Accelerate config (fsdp_version 1)",
            lambda config, accelerate: is_on(config.get("use_peft")) and accelerate.get("distributed_type") == "FSDP"
            and _number((accelerate.get("fsdp_config") or {}).get("fsdp_version") or 1) == 1),
    # Every FSDP config, not only those that say SHARDED_STATE_DICT: the type can also be switched where the recipe
    # cannot see it (`accelerate launch --fsdp_state_dict_type`, FSDP_STATE_DICT_TYPE), and a one-word edit of the
    # config must not need a sync-scripts to keep the final weights; the section decides at run time.
    Section("sharded-final-save", "an FSDP Accelerate config (distributed_type: FSDP), whose final save is sharded "
            "with fsdp_state_dict_type: SHARDED_STATE_DICT",
            lambda config, accelerate: accelerate.get("distributed_type") == "FSDP"),
)
SECTION_NAMES = tuple(s.name for s in SECTIONS)


def section(name: str) -> Section:
    return next(s for s in SECTIONS if s.name == name)


def wanted_sections(config: dict, accelerate: dict) -> tuple[str, ...]:
    """The sections a recipe's config.yaml and Accelerate config turn on: what `sync-scripts` writes into its copy."""
    return tuple(s.name for s in SECTIONS if s.on(config, accelerate))


# ---- the marker line and what a train.py holds ----------------------------------------------------------------------
def marker(sections) -> str:
    names = [n for n in SECTION_NAMES if n in sections]
    # two lines, each within the line length the repository's lint holds (pyproject.toml [tool.ruff])
    return (f"{MARKER_PREFIX} [sections: {', '.join(names) or 'none'}]\n"
            "# (`python -m launch sync-scripts` keeps it equal to the template; delete these two lines to fork it)")


def copy_text(sections, template: Path = train_template.TEMPLATE) -> str:
    """What a marked copy holding `sections` contains: the marker line, then the template rendered with them."""
    return marker(sections) + "\n" + train_template.render(sections, template)


def _first_line(path: Path) -> str:
    # every train.py of recipes/ is read here first (sync-scripts, list, the checks): a broken one is named, with
    # its line, not a traceback
    try:
        with open(path, "rb") as f:
            raw = f.readline()
    except IsADirectoryError:
        raise LaunchError(f"{path} is a folder, not a train script: move it away and put the recipe's train.py "
                          "back (from version control, or a copy of another recipe's: `python -m launch sync-scripts` "
                          "then gives it this recipe's sections).") from None
    except OSError as e:
        raise LaunchError(f"{path} cannot be read ({e.strerror or e}).") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LaunchError(f"{path}:1: byte 0x{raw[e.start]:02x} is not UTF-8 (scripts are read as UTF-8). Save "
                          "it as UTF-8.") from None


def is_marked(path: Path) -> bool:
    return _first_line(path).startswith(MARKER_PREFIX)


def marked_sections(path: Path) -> tuple[str, ...] | None:
    """The sections a copy's marker line names (a marker line without a list, as written before there were sections,
    stands for all of them); None for a fork."""
    m = _MARKER.match(_first_line(path))
    if not m:
        return None
    if m["sections"] is None:
        return SECTION_NAMES
    return tuple(s.strip() for s in m["sections"].split(",") if s.strip() not in ("", "none"))


def held_sections(path: Path, template: Path = train_template.TEMPLATE) -> tuple[str, ...]:
    """The sections a train.py holds: those its marker line names; for a fork, those whose functions it still
    defines (a section's RecipeArguments fields are what the fork's parser reports)."""
    named = marked_sections(path)
    if named is not None:
        return named
    text = path.read_text()
    return tuple(name for name, functions in train_template.parts(template).functions.items()
                 if all(re.search(rf"^def {f}\(", text, re.M) for f in functions))
