"""The one exception the launcher raises for the user: a problem found before any process starts."""

from __future__ import annotations


class LaunchError(Exception):
    """A problem found before any process starts; its message is one paragraph meant for the user (exit status 2)."""
