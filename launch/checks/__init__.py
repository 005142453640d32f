"""Checks before any process starts: the validity rules, `doctor`, and the GPU image's performance traps."""
