"""One run: resolve the setup, build the command, start and supervise it, checkpoints, tracking, Ctrl-C."""
