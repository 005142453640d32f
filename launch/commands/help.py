"""`python -m launch help [COMMAND]`: the overview (= `python -m launch --help`), or one command's options."""

from __future__ import annotations

from launch.commands import command, registered, run
from launch.config.options import Parser


@command("help", "this overview, or one command's options: help COMMAND", reads_first=True)
def main(argv: list[str]) -> int:
    commands = registered()
    p = Parser(prog="python -m launch help", description="The commands and the run options, or one command's options.")
    p.add_argument("command", nargs="?", choices=list(commands), metavar="COMMAND",
                   help=f"one of: {', '.join(commands)}")
    ns = p.parse_args(argv)
    # argparse prints the help and exits 0 (launch.__main__ turns that into the exit status)
    return commands[ns.command].main(["--help"]) if ns.command else run.main(["--help"])
