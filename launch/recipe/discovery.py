"""Discovering recipe folders and reading their two configs (TRL's `--config` YAML and Accelerate's YAML).

A recipe is a folder under recipes/ holding config.yaml, train.py, expected_metrics.json and README.md. Its
config.yaml names the Accelerate config it runs with (`accelerate_config:`), relative to the repository root
or to the recipe folder.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

from launch import REPO_ROOT
from launch.errors import LaunchError

RECIPES_DIR = REPO_ROOT / "recipes"
RECIPE_FILES = ("config.yaml", "train.py", "expected_metrics.json", "README.md")
COMMANDS_DIR = Path(__file__).resolve().parent.parent / "commands"


def command_sources(folder: Path = COMMANDS_DIR) -> dict[str, tuple[str, str]]:
    """The commands in launch/commands/, read from the modules' source (ast) without importing them (they import
    most of the launcher, which imports this module): NAME -> (its module's name, HELP) for each
    `@command(NAME, HELP)`. `python -m launch NAME` then imports that one module only, and the overview of the
    commands needs none of them."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    if (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "command" and d.args
                            and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
                        help_text = d.args[1].value if len(d.args) > 1 and isinstance(d.args[1], ast.Constant) else ""
                        found[d.args[0].value] = (path.stem, help_text)
    return dict(sorted(found.items()))


def command_names(folder: Path = COMMANDS_DIR) -> tuple[str, ...]:
    """The words of the commands in launch/commands/ (`command_sources`): the one list of the words `python -m
    launch WORD` reads as a command; `launch.commands.command` refuses a name not found here (e.g. one that is not a
    literal string)."""
    return tuple(command_sources(folder))


COMMAND_NAMES = command_names()


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key written twice in one mapping is an error naming both lines: PyYAML (and so
    Accelerate and TRL) silently keep the last one, e.g. an edited `accelerate_config:` with the old line left
    below it."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: PyYAML reports it itself
                continue
            if first is not key_node:
                raise _DuplicateKey(key, first.start_mark.line + 1, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def load_yaml(path: Path) -> dict:
    """Read a YAML mapping; a syntax error names the file and line, a key given twice both lines."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise LaunchError(f"{path} does not exist.") from None
    except IsADirectoryError:
        raise LaunchError(f"{path} is a directory, not a YAML file.") from None
    except OSError as e:
        raise LaunchError(f"{path} cannot be read ({e.strerror or e}).") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise LaunchError(f"{path}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8 (YAML files are read as UTF-8). "
                          "Save the file as UTF-8 (e.g. re-type the character, or "
                          "`iconv -f latin1 -t utf-8`).") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as e:
        raise LaunchError(f"{path}: the key `{e.key}` is given twice, on lines {e.first} and {e.second}; YAML readers "
                          "keep the last one without a word. Delete the line you do not mean.") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise LaunchError(f"{where}: malformed YAML ({problem}). Fix the file and run again.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: expected a YAML mapping of keys to values, got {type(data).__name__}.")
    return data


@dataclass
class Recipe:
    name: str
    path: Path
    config: dict = field(repr=False)

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def train_script(self) -> Path:
        return self.path / "train.py"

    @property
    def expected_metrics_path(self) -> Path:
        return self.path / "expected_metrics.json"

    @property
    def accelerate_config_path(self) -> Path:
        ref = self.config.get("accelerate_config")
        if not ref:
            raise LaunchError(
                f"{self.config_path} has no `accelerate_config:` key. Add the path of the Accelerate config this "
                "recipe runs with, e.g. `accelerate_config: accelerate_configs/multi_gpu.yaml`."
            )
        for base in (REPO_ROOT, self.path):
            candidate = (base / ref).resolve()
            if candidate.is_file():
                return candidate
            if candidate.is_dir():
                raise LaunchError(f"{self.config_path}: accelerate_config `{ref}` is a directory ({candidate}); name "
                                  "the Accelerate config file in it, e.g. `accelerate_configs/multi_gpu.yaml`.")
        raise LaunchError(
            f"{self.config_path}: accelerate_config `{ref}` was found neither under {REPO_ROOT} nor under {self.path}."
        )

    @cached_property
    def accelerate(self) -> dict:
        return load_yaml(self.accelerate_config_path)

    @property
    def description(self) -> str:
        """The first sentence of the README's first paragraph after the title: what the recipe is for."""
        readme = self.path / "README.md"
        if not readme.is_file():
            return ""
        paragraph: list[str] = []
        raw = readme.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # `list` and README.md's table read every recipe's README
            line = raw[: e.start].count(b"\n") + 1
            raise LaunchError(f"{readme}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8 "
                              "(a recipe's README is read as UTF-8). Save it as UTF-8.") from None
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("#") or (not line and not paragraph):
                continue
            if not line:
                break
            paragraph.append(line)
        text = " ".join(paragraph)
        return text.split(". ")[0].rstrip(".") + "." if text else ""

    def load_train_module(self):
        """Import the recipe's train.py (cheap: its heavy imports live inside functions)."""
        spec = importlib.util.spec_from_file_location(f"recipe_train_{self.name.replace('-', '_')}", self.train_script)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - a broken script (the ranks would fail the same way): named, with its line
            raise LaunchError(script_error(self.train_script, e)) from None
        if not callable(getattr(module, "make_parser", None)):
            raise LaunchError(f"{self.train_script}:1: defines no make_parser() (is it empty?). A recipe's train.py is "
                              "a copy of templates/train.py: `python -m launch sync-scripts` rewrites a marked copy.")
        return module


def script_error(path: Path, e: BaseException) -> str:
    """`path:line: what` for an exception raised while importing the script at `path` (its own line, not ours)."""
    import traceback

    line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) and e.filename == str(path) else None
    if line is None:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        line = frames[-1].lineno if frames else 1
    what = e.msg if isinstance(e, SyntaxError) else str(e)
    return (f"{path}:{line}: {type(e).__name__}: {what}. The script cannot be imported, so neither the launcher "
            "nor the ranks can run it: fix that line (a marked copy of templates/train.py is rewritten by `python "
            "-m launch sync-scripts`), or install the missing module.")


def _candidate_dirs() -> list[Path]:
    if not RECIPES_DIR.is_dir():
        return []
    return sorted(p for p in RECIPES_DIR.iterdir() if p.is_dir() and (p / "config.yaml").is_file())


def recipe_dirs() -> list[Path]:
    """The recipe folders under recipes/, without those named like a command (`refused_dirs`)."""
    return [p for p in _candidate_dirs() if p.name not in COMMAND_NAMES]


def refused_dirs() -> list[Path]:
    """Folders under recipes/ that hold a config.yaml but are named like a command of `python -m launch`."""
    return [p for p in _candidate_dirs() if p.name in COMMAND_NAMES]


def refusal(folder: Path) -> str:
    return (f"The recipe folder {folder} is named like the command `python -m launch {folder.name}`, so it cannot be "
            f"run by its name. Rename the folder, e.g. `mv {folder} {folder.with_name(folder.name + '-recipe')}`.")


def recipe_names() -> list[str]:
    return [p.name for p in recipe_dirs()]


def find_recipe(name: str, optional: tuple[str, ...] = ()) -> Recipe:
    """Resolve a recipe by name (a folder under recipes/) or by a path to a recipe folder. `optional`: files of
    RECIPE_FILES that may be missing (`record` writes expected_metrics.json)."""
    path = Path(name)
    if path.is_dir() and (path / "config.yaml").is_file():
        folder = path.resolve()
    elif (RECIPES_DIR / name / "config.yaml").is_file():
        folder = RECIPES_DIR / name
    else:
        names = recipe_names()
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise LaunchError(
            f"Unknown recipe `{name}`.{hint} Recipes are the folders under {RECIPES_DIR} that hold a config.yaml; "
            "`python -m launch list` shows them all."
        )
    if folder.name in COMMAND_NAMES and folder.parent.resolve() == RECIPES_DIR.resolve():
        raise LaunchError(refusal(folder))
    missing = [f for f in RECIPE_FILES if not (folder / f).is_file() and f not in optional]
    if missing == ["expected_metrics.json"]:
        raise LaunchError(
            f"Recipe folder {folder} has no expected_metrics.json yet. The record command writes it from a smoke run: "
            f"`python -m launch record {folder.name if folder.parent == RECIPES_DIR else folder} --smoke --cpu` "
            "(add --num-processes N for the layout you want recorded)."
        )
    if missing:
        raise LaunchError(
            f"Recipe folder {folder} lacks {', '.join(missing)}. A recipe folder holds {', '.join(RECIPE_FILES)}; "
            "copy an existing recipe folder to start a new one."
        )
    return Recipe(name=folder.name, path=folder, config=load_yaml(folder / "config.yaml"))
