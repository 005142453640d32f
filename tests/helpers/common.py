"""Small helpers shared by the tests and by the helper scripts they spawn (which cannot import the test modules)."""

from __future__ import annotations

import socket

# Every test runs offline: the smoke model and data are built locally, and nothing may reach the hub.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
