"""The names of the files in a run's output folder, for both sides of a run: the launcher joins them to a folder
through `launch.results.outdir.RunFolder` (which also owns every check of the folder), and the training ranks write
their heartbeat, bench and sentinel files under the folder the launcher passes them in MONITOR_ENV. Names only: this
module imports nothing, so the ranks may import it without importing the launcher.

    OUTPUT_DIR/
      launch.log              everything the job printed (launch.run.supervise)
      run_summary.json        the run's figures and verdict (launch.run.runner)
      trainer_state.json      the per-step log_history (the Trainer, at the end of train.py)
      final/                  the full weights and tokenizer (train.py; not for a synthetic run)
      checkpoint-N/           the Trainer's checkpoints
      trackio/                a smoke run's metrics store (launch.run.tracking)
      .launch/                the launcher's own: manifest.json, lock-machine<R>
        heartbeat/            MONITOR_ENV: rank<R>.json heartbeats, sentinel.json
          bench/              rank<R>.json measurements (launch.speed.measured)

The recipes' train.py spells `final` itself: a recipe's script runs under plain `accelerate launch` too, without
this package.
"""

META = ".launch"  # the launcher's own entries; never a run's output (launch.results.outdir)
MANIFEST = "manifest.json"  # in META: the entries runs created in the folder
WRITE_PROBE = ".write-test"  # in META: written and removed once, to prove the folder writable
MONITOR = "heartbeat"  # in META: the folder the ranks write into (its path reaches them in MONITOR_ENV)
MONITOR_ENV = "LAUNCH_MONITOR_DIR"
BENCH = "bench"  # in MONITOR
SENTINEL_VERDICT = "sentinel.json"  # in MONITOR, by rank 0 (launch.results.sentinel)
RANK_FILES = "rank*.json"  # the pattern of rank_file's names

LOG = "launch.log"
SUMMARY = "run_summary.json"
# transformers' own names (transformers.trainer.TRAINER_STATE_NAME, trainer_utils.PREFIX_CHECKPOINT_DIR), not
# imported from there: importing transformers takes seconds, and the launcher reads these before any rank starts.
TRAINER_STATE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"
FINAL = "final"
TRACKIO = "trackio"


def lock_file(machine_rank: int) -> str:
    """In META: the lock of the launcher of machine `machine_rank` (one per machine, for shared file systems)."""
    return f"lock-machine{machine_rank}"


def rank_file(rank: int) -> str:
    """A rank's file: its heartbeat in MONITOR, its measurements in BENCH."""
    return f"rank{rank}.json"
