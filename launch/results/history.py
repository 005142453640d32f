"""Reading a run's per-step log: OUTPUT_DIR/trainer_state.json as the Trainer writes it."""

from __future__ import annotations

import json
from pathlib import Path

from launch.results.outdir import RunFolder
from launch.results.stepdiff import METRICS


def read_history(output_dir: Path) -> list[dict]:
    path = RunFolder(Path(output_dir)).trainer_state
    if not path.is_file():
        return []
    return json.loads(path.read_text()).get("log_history", [])


def step_metrics(history: list[dict]) -> dict[str, list[float]]:
    """Per-step values of METRICS, from the log entries that carry a training loss."""
    rows = sorted((h for h in history if "loss" in h and "step" in h), key=lambda h: h["step"])
    return {m: [float(h[m]) for h in rows if m in h] for m in METRICS} | {"step": [int(h["step"]) for h in rows]}


def run_totals(history: list[dict]) -> dict:
    """The Trainer's own totals: its train_runtime and the tokens TRL counted (padding excluded, warm-up included).
    Their ratio is not reported: the run's tokens/s is the bench's (launch.speed.measured), one figure under one
    name."""
    final = next((h for h in reversed(history) if "train_runtime" in h), {})
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    return {"train_runtime_s": final.get("train_runtime"), "num_tokens": tokens}
