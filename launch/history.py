"""Reading a run's per-step log: OUTPUT_DIR/trainer_state.json as the Trainer writes it."""

from __future__ import annotations

import json
from pathlib import Path

from launch.stepdiff import METRICS


def read_history(output_dir: Path) -> list[dict]:
    path = Path(output_dir) / "trainer_state.json"
    if not path.is_file():
        return []
    return json.loads(path.read_text()).get("log_history", [])


def step_metrics(history: list[dict]) -> dict[str, list[float]]:
    """Per-step values of METRICS, from the log entries that carry a training loss."""
    rows = sorted((h for h in history if "loss" in h and "step" in h), key=lambda h: h["step"])
    return {m: [float(h[m]) for h in rows if m in h] for m in METRICS} | {"step": [int(h["step"]) for h in rows]}


def run_totals(history: list[dict]) -> dict:
    final = next((h for h in reversed(history) if "train_runtime" in h), {})
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    runtime = final.get("train_runtime")
    return {
        "train_runtime_s": runtime,
        "num_tokens": tokens,
        "tokens_per_second": (tokens / runtime) if runtime else None,
    }
