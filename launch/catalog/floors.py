"""The floors of `launch/`, computed from its own import statements, so that docs/architecture.md's table (a generated
block, `launch.catalog.blocks`) cannot drift from the code.

A room is a module directly in `launch/` or a folder of it (a package counts as one room: its modules are one concern,
e.g. `memory/`); an arrow A -> B is A importing B (`import launch.b`, `from launch.b import x`,
`from launch import b`, relative forms included, inside functions too). Floor 1 imports nothing of `launch/`; a room
stands one floor above the highest room it imports. Imports inside one folder are not arrows between rooms, and neither
is an import of the package itself (`from launch import REPO_ROOT`: launch/__init__.py is the package's face, on no
floor). An import cycle has no floors: it is an error naming the rooms in the cycle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from launch.errors import LaunchError

LAUNCH_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Room:
    name: str  # "errors.py" or "memory/"
    imports: frozenset[str]  # the other rooms it imports
    doc: str  # the first sentence of its docstring (a folder: its __init__.py's)
    modules: tuple[str, ...] = ()  # a folder's modules and subfolders ("plan.py", "rules/"); a module: none


def _sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)


def _room_paths(root: Path) -> dict[str, Path]:
    rooms = {}
    for path in sorted(root.iterdir()):
        if path.suffix == ".py" and path.name != "__init__.py":
            rooms[path.name] = path
        elif path.is_dir() and path.name != "__pycache__" and _sources(path):
            rooms[path.name + "/"] = path
    return rooms


def _room_of(parts: list[str], root: Path) -> str | None:
    """The room a dotted name inside the package falls in (["launch", "memory", "terms"] -> "memory/"); None for the
    package itself or a name outside it."""
    if len(parts) < 2 or parts[0] != root.name:
        return None
    if (root / parts[1]).is_dir():
        return parts[1] + "/"
    return parts[1] + ".py" if (root / f"{parts[1]}.py").is_file() else None


def _imported_rooms(source: Path, root: Path) -> set[str]:
    package = [root.name, *source.parent.relative_to(root).parts]  # the package the file is in
    found = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), filename=str(source))):
        if isinstance(node, ast.Import):
            found |= {_room_of(alias.name.split("."), root) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parts = base + (node.module.split(".") if node.module else [])
            if len(parts) == 1 and parts[0] == root.name:  # `from launch import x`: x is a room or a name of the face
                found |= {_room_of([root.name, alias.name], root) for alias in node.names}
            else:
                found.add(_room_of(parts, root))
    return found - {None}


def _first_sentence(path: Path) -> str:
    source = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) if source.is_file() else None
    paragraph = " ".join((doc or "").split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".:") + "." if paragraph else ""


def _modules(path: Path) -> tuple[str, ...]:
    if path.is_file():
        return ()
    return tuple(sorted(p.name for p in path.iterdir() if p.suffix == ".py" and p.name != "__init__.py")
                 + sorted(p.name + "/" for p in path.iterdir() if p.is_dir() and (p / "__init__.py").is_file()))


def rooms(root: Path = LAUNCH_DIR) -> dict[str, Room]:
    out = {}
    for name, path in _room_paths(root).items():
        imports = set().union(*(_imported_rooms(p, root) for p in _sources(path))) - {name}
        out[name] = Room(name, frozenset(imports), _first_sentence(path), _modules(path))
    return out


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(source: Path, root: Path, known: set[str]) -> set[str]:
    """The modules of the package a file imports: `from launch.memory import plan` is launch.memory.plan when that
    is a module, else the package's face launch.memory (its __init__.py)."""
    package = [root.name, *source.parent.relative_to(root).parts]
    found = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), filename=str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
    return {name for name in found if name in known}


def module_cycle(root: Path = LAUNCH_DIR) -> list[str]:
    """An import cycle between the modules of the package, inside a folder too (the names in it, the first one
    repeated at the end); [] when there is none. The floors see folders whole; this sees each module."""
    sources = {_module_name(p, root): p for p in _sources(root)}
    known = set(sources)
    graph = {name: _imported_modules(path, root, known) - {name} for name, path in sources.items()}
    state: dict[str, int] = {}  # 1 on the path being walked, 2 done
    path: list[str] = []

    def walk(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for other in sorted(graph[name]):
            if other.startswith(name + "."):  # a package's face importing its own modules: not a cycle
                continue
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (cycle := walk(other)):
                return cycle
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state and (cycle := walk(name)):
            return cycle
    return []


def floors(root: Path = LAUNCH_DIR) -> dict[str, int]:
    """Each room's floor; a LaunchError naming the rooms of an import cycle when there is one."""
    found = rooms(root)
    floor: dict[str, int] = {}
    path: list[str] = []  # the rooms being placed, for naming a cycle

    def place(name: str) -> int:
        if name in floor:
            return floor[name]
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise LaunchError(f"{root} has an import cycle: {' -> '.join(cycle)}. A module may import only modules on "
                              "lower floors (docs/architecture.md): move what both need into a module below them.")
        path.append(name)
        floor[name] = 1 + max((place(other) for other in found[name].imports), default=0)
        path.pop()
        return floor[name]

    for name in found:
        place(name)
    return floor


def floor_table(root: Path = LAUNCH_DIR) -> str:
    """The markdown table of docs/architecture.md: rooms from the top floor down."""
    found, floor = rooms(root), floors(root)
    order = sorted(found, key=lambda name: (-floor[name], name))
    lines = [f"{max(floor.values(), default=0)} floors, no import cycle between rooms or between modules (computed "
             "from the imports by `launch/catalog/floors.py`).", "",
             "| floor | room | its modules | imports (of `launch/`) | what it holds (its docstring) |",
             "|---|---|---|---|---|"]
    for name in order:
        imports = ", ".join(f"`{other}`" for other in sorted(found[name].imports, key=lambda o: (-floor[o], o)))
        modules = ", ".join(f"`{m.removesuffix('.py')}`" for m in found[name].modules)
        doc = found[name].doc.replace("|", "\\|")  # a pipe would end the table's cell
        lines.append(f"| {floor[name]} | `{name}` | {modules or '-'} | {imports or 'nothing'} | {doc} |")
    return "\n".join(lines) + "\n"
