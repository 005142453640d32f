"""The subcommands of `python -m launch`, one module each (`launch.__main__` dispatches to their `main(argv)`)."""
