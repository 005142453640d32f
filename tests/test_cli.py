"""The command line itself: `python -m launch --help` and `help` list every registered command; every command turns a
bad argument into one paragraph and exit status 2; a recipe folder named like a command is refused at discovery; the
run parser is generated from the `Options` fields, with their defaults. All in-process (`launch.__main__.main`)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from launch.config import envvars
from launch.recipe import discovery as recipes
from launch.__main__ import main
from launch.commands import registered
from launch.commands.bench import without_max_length
from launch.errors import LaunchError
from launch.config.options import Options, options_from, parse_run, run_parser

COMMANDS = registered()


def launch(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_paragraph(err: str) -> str:
    """The error convention: `error: ...` on one line of stderr, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_scheduler_env(monkeypatch):
    """The multi-node options read scheduler variables when not given: clear them (the names from the fields)."""
    for f in dataclasses.fields(Options):
        if env := f.metadata.get("cli", {}).get("env"):
            monkeypatch.delenv(env, raising=False)


def test_help_lists_every_registered_command_and_the_run_options(capsys):
    rc, out, err = launch(capsys, "--help")
    assert rc == 0 and err == ""
    assert out.startswith("usage: python -m launch [-h] [--smoke]")  # the run form
    for name, command in COMMANDS.items():
        [line] = [line for line in out.splitlines() if line.split()[:1] == [name]]
        assert command.help in line, line
    assert {"list", "doctor", "plan", "bench", "compare", "record", "sync-scripts", "help"} <= set(COMMANDS)
    assert launch(capsys, "help") == (0, out, "")
    assert launch(capsys, "-h") == (0, out, "")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_command_shows_each_commands_options(capsys, name):
    rc, out, err = launch(capsys, "help", name)
    assert rc == 0 and err == "", err
    assert out.startswith(f"usage: python -m launch {name} ")
    assert launch(capsys, name, "--help") == (0, out, "")


def test_help_of_an_unknown_command_is_one_paragraph(capsys):
    rc, out, err = launch(capsys, "help", "nope")
    assert rc == 2 and out == ""
    assert "invalid choice: 'nope'" in one_paragraph(err) and "sync-scripts" in err


@pytest.mark.parametrize("argv", [[name, "--no-such-option"] for name in sorted(COMMANDS)]
                         + [["zero3", "--no-such-option"], [], ["zero3", "--num-processes", "two"]],
                         ids=lambda argv: " ".join(argv) or "(nothing)")
def test_a_bad_argument_exits_2_with_one_paragraph(capsys, argv):
    rc, out, err = launch(capsys, *argv)
    assert rc == 2 and out == "", out
    line = one_paragraph(err)
    # the option is named, or the argument it lacks (commands that take a positional report that one first)
    assert any(word in line for word in ("--no-such-option", "required", "'two'")), line
    assert "--help`" in line  # and where to read the right spelling


def test_bench_max_length_is_a_declared_option(capsys):
    rc, _, err = launch(capsys, "bench", "zero3")
    assert rc == 2 and "--max-length" in one_paragraph(err)
    rc, _, err = launch(capsys, "bench", "zero3", "--max-length", "4096")
    assert rc == 2 and "pass --max-length auto" in one_paragraph(err)
    # each try runs the recipe with the user's options, without the search's own --max-length (however spelt)
    for spelt in (["--max-length", "auto"], ["--max-length=auto"], ["--max-len", "auto"]):
        assert without_max_length(["zero3", *spelt, "--max-steps", "3"]) == ["zero3", "--max-steps", "3"]


def test_compare_and_sync_errors_are_launch_errors(capsys, tmp_path):
    rc, _, err = launch(capsys, "compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c.svg")
    assert rc == 2 and "give a name ending in .png" in one_paragraph(err)
    rc, _, err = launch(capsys, "sync-scripts", "extra")
    assert rc == 2 and "extra is not a recipe folder" in one_paragraph(err)
    rc, _, err = launch(capsys, "sync-scripts", "--no-such-flag")
    assert rc == 2 and "unrecognized arguments: --no-such-flag" in one_paragraph(err)


def test_every_command_claims_its_word_in_recipes():
    """launch.commands refuses to register a name that launch.recipe.discovery does not reserve, and every reserved
    name is a command: recipe discovery (a floor below the commands) refuses exactly the commands' names."""
    assert set(COMMANDS) == set(recipes.COMMAND_NAMES)
    # what the source says of each command is what it registers: its module and its help line
    sources = recipes.command_sources()
    assert {name: (c.main.__wrapped__.__module__, c.help) for name, c in COMMANDS.items()} == {
        name: (f"launch.commands.{module}", help_text) for name, (module, help_text) in sources.items()}


def test_a_command_imports_only_its_own_module():
    """`python -m launch plan` imports plan's module, not the run form's (the runner, doctor, PEFT): a plan takes
    about half a second less (docs/planning.md's timings). Its --help goes through the same dispatch, cheaply."""
    import subprocess
    import sys

    from launch import REPO_ROOT

    code = ("import sys; from launch.__main__ import main; main(['plan', '--help']); "
            "print(sorted(m for m in ('launch.commands.run', 'launch.run.runner', 'launch.commands.bench') "
            "if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "[]"


@pytest.fixture
def recipes_dir(tmp_path, monkeypatch):
    """A recipes/ folder of our own: the shipped zero3 recipe copied as `mine`, `plan` and `help`."""
    folder = tmp_path / "recipes"
    for name in ("mine", "plan", "help"):
        shutil.copytree(recipes.RECIPES_DIR / "zero3", folder / name)
    monkeypatch.setattr(recipes, "RECIPES_DIR", folder)
    return folder


def test_a_recipe_folder_named_like_a_command_is_refused(capsys, recipes_dir):
    assert recipes.recipe_names() == ["mine"]
    assert recipes.refused_dirs() == [recipes_dir / "help", recipes_dir / "plan"]
    for how in ("plan", str(recipes_dir / "plan")):
        with pytest.raises(LaunchError, match=r"named like the command `python -m launch plan`.*Rename the folder"):
            recipes.find_recipe(how)
    # `list` shows the others, then names each refused folder in one paragraph (exit 2)
    rc, out, err = launch(capsys, "list")
    assert rc == 2
    assert [row.split()[0] for row in out.split("\n\n")[0].splitlines()[1:]] == ["mine"]
    line = one_paragraph(err)
    assert str(recipes_dir / "help") in line and str(recipes_dir / "plan") in line and "mv " in line
    # the run form reaches discovery through `record` (the first word `plan` is the command)
    rc, _, err = launch(capsys, "record", "plan", "--smoke", "--cpu", "--dry-run")
    assert rc == 2 and "Rename the folder" in one_paragraph(err)


def test_parser_generated_from_the_fields_has_their_defaults(no_scheduler_env):
    assert parse_run(["zero3"], "python -m launch") == Options(recipe="zero3")
    parser = run_parser("python -m launch")
    names = {f.name for f in dataclasses.fields(Options)}
    for action in parser._actions:
        if action.dest in names and action.dest != "recipe":
            assert action.default == Options.__dataclass_fields__[action.dest].default, action.dest
    # a value given on the command line reaches its field; training arguments after `--` stay verbatim
    given = parse_run(["zero3", "--sp-size", "2", "--bench-warmup", "0", "--resume", "--no-loss-sentinel",
                       "--rendezvous-timeout", "5", "--dry-run", "--", "--max_steps", "3"], "python -m launch")
    assert (given.mesh, given.bench_warmup, given.resume, given.loss_sentinel, given.rendezvous_timeout,
            given.dry_run, given.extra) == ({"sp": 2}, 0, "latest", False, 5.0, True, ["--max_steps", "3"])


def test_run_flags_keep_their_spelling():
    """The public spelling of the run options (what scripts and the docs type)."""
    flags = {s for a in run_parser("x")._actions for s in a.option_strings}
    assert flags == {
        "-h", "--help", "--smoke", "--cpu", "--num-processes", "--dp-replicate-size", "--dp-shard-size", "--cp-size",
        "--sp-size", "--output-dir", "--max-steps", "--save-steps", "--resume", "--overwrite", "--hang-timeout",
        "--gpu", "--force", "--bench", "--bench-steps", "--bench-warmup", "--synthetic", "--model",
        "--no-loss-sentinel", "--fastest", "--dry-run", "--pure-bf16", "--num-machines", "--machine-rank",
        "--main-process-ip", "--main-process-port",
        "--rendezvous-timeout"}


def test_multinode_options_not_given_stay_unset_for_the_rendezvous(no_scheduler_env, monkeypatch):
    """The parser fills in no scheduler variable: launch.config.envvars.rendezvous is the one place that does
    (tests/test_schedulers.py), so a flag and a variable are told apart there."""
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("MASTER_PORT", "29555")
    from_env = parse_run(["zero3"], "x")
    assert (from_env.num_machines, from_env.main_process_port) == (None, None)
    given = parse_run(["zero3", "--num-machines", "4", "--main-process-port", "29600"], "x")
    assert (given.num_machines, given.main_process_port) == (4, 29600)
    assert envvars.source(given, "main_process_port") == "--main-process-port"


def test_options_are_built_once():
    options = parse_run(["zero3"], "python -m launch record", record=True)
    assert options.record is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.record = False  # noqa
    assert options_from(run_parser("x").parse_args(["zero3"]), []).record is False
