"""What `python -m launch` watches inside the training ranks, as Trainer callbacks the train script adds only when the
launcher asks (it sets LAUNCH_MONITOR_DIR; under plain `accelerate launch` nothing is added).

- Heartbeats: each rank rewrites `<dir>/rank<RANK>.json` with its last event (train_begin, step_begin, step_end,
  train_end) and step, so the launcher can tell a rank that stopped making progress from one that waits for it
  (`launch.run.supervise.Watchdog`).
- With LAUNCH_BENCH=<warm-up steps>: `launch.rank.measure.measure_callback`, into `<dir>/bench/`: tokens/s, MFU and
  memory per rank, cheap enough for every run (no per-step device sync unless LAUNCH_BENCH_SYNC=1; see
  launch/speed/measured.py).
- With LAUNCH_FIRST_LOSS_BAND=<band as JSON>: `launch.rank.sentinel.sentinel_callback`, which stops the run (every rank
  raises) when a first logged loss is outside the band recorded in the recipe's expected_metrics.json.

Rank side: no import of the launcher's other modules but bench, sentinel, tracking (trackio's dashboard hint, which
lacks the run's TRACKIO_DIR, is silenced: the launcher prints the right command) and run_files (names only), nothing
that can fail a training run (a write error is ignored: a missing heartbeat can only make the launcher's hang timeout
fire later, never earlier) except the sentinel, whose purpose is to stop a run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from launch.rank import run_files  # names only
from launch.rank.measure import measure_callback  # measure and sentinel import nothing heavy at module level
from launch.rank.sentinel import ENV as SENTINEL_ENV  # LAUNCH_FIRST_LOSS_BAND
from launch.rank.sentinel import sentinel_callback

# LAUNCH_MONITOR_DIR: the run folder's monitor folder (launch.results.outdir.RunFolder.monitor)
ENV = run_files.MONITOR_ENV
BENCH_ENV = "LAUNCH_BENCH"
PHASES = {"train_begin": 0, "step_begin": 1, "step_end": 2, "train_end": 3}


def add_callbacks(trainer) -> None:
    """Called by train.py when LAUNCH_MONITOR_DIR is set."""
    folder = Path(os.environ[ENV])
    quiet_dashboard_hint()  # trackio's hint lacks the run's TRACKIO_DIR; the launcher prints the right command
    trainer.add_callback(_heartbeat_callback(folder))
    if os.environ.get(BENCH_ENV):
        trainer.add_callback(measure_callback(folder / run_files.BENCH, int(os.environ[BENCH_ENV])))
    if os.environ.get(SENTINEL_ENV):
        trainer.add_callback(sentinel_callback(folder=folder))


def _heartbeat_callback(folder: Path):
    from transformers import TrainerCallback

    rank = int(os.environ.get("RANK", "0"))
    path = folder / run_files.rank_file(rank)

    def beat(event: str, step: int) -> None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"rank": rank, "event": event, "step": step, "time": time.time()}))
            os.replace(tmp, path)
        except OSError:
            pass

    class Heartbeat(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            beat("train_begin", state.global_step)

        def on_step_begin(self, args, state, control, **kwargs):
            beat("step_begin", state.global_step + 1)

        def on_step_end(self, args, state, control, **kwargs):
            beat("step_end", state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            beat("train_end", state.global_step)

    return Heartbeat()


def read_heartbeats(folder: Path) -> dict[int, dict]:
    """The launcher's side: {rank: last heartbeat}."""
    out = {}
    for path in folder.glob(run_files.RANK_FILES):
        try:
            beat = json.loads(path.read_text())
            out[int(beat["rank"])] = beat
        except (OSError, ValueError, KeyError):
            continue
    return out


def quiet_dashboard_hint() -> None:
    """trackio 0.43 prints, at `trackio.init` (transformers' TrackioCallback, at the start of training, on the main
    process), `trackio show --project "P"` in terminal colour codes (`trackio.utils.print_dashboard_instructions`)
    and without the TRACKIO_DIR the launcher gave the run, so the command shown opens another store. Replace that one
    function with nothing; trackio's other lines (project, store, run) are true and stay. Only where the Trainer has
    imported trackio already (report_to trackio): nothing is imported for it."""
    trackio = sys.modules.get("trackio")
    if trackio is not None and hasattr(trackio, "utils"):
        trackio.utils.print_dashboard_instructions = lambda project: None
