"""The output folder belongs to the run, and only to the run.

- A folder is the launcher's when it holds `.launch/manifest.json`, which lists the top-level entries that runs
  created there. A folder that holds anything else (a repository, a recipe folder, a home folder, a file someone put
  there) is refused: TRL writes `OUTPUT_DIR/README.md` at every save and rotates `checkpoint-*` folders, so a run must
  never share a folder with files it did not create.
- An earlier run's checkpoints or final weights are kept unless the user says `--resume` (continue) or
  `--overwrite` (which names what it deletes, and deletes only entries the manifest lists).
- While a run is in the folder it holds `.launch/lock-machine<RANK>` (one per machine, for shared file systems);
  a second launcher is refused with the holder's process id, start time and command; a lock whose holder is dead
  is taken over with a message, and what the dead run left (entries newer than its start) is adopted as its output.
- Nothing is created until every check has passed: `check()` only reads, `claim()` creates.
- `RunFolder` is where every path inside the folder comes from (the bare names are in `launch.rank.run_files`, which
  the ranks read too), and it holds the checks of the folder itself: free space (part of `check()`) and, once
  claimed, writability.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from launch.rank import run_files
from launch.errors import LaunchError

# An earlier run's results, which a new run keeps unless told --resume or --overwrite.
EARLIER_RUN = re.compile(rf"^({re.escape(run_files.CHECKPOINT_PREFIX)}\d+|{re.escape(run_files.FINAL)})$")
_CHECKPOINT = re.compile(rf"^{re.escape(run_files.CHECKPOINT_PREFIX)}(\d+)$")
# PEFT's names (peft.utils.constants CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME), not imported from there (the launcher
# reads them before any rank starts): an adapter run's `final` and checkpoints hold these instead of model weights.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED = "merged"  # `python -m launch merge`'s default output, inside the run folder


@dataclass(frozen=True)
class RunFolder:
    """A run's output folder: where each of its files lives, and the checks of the folder itself. The launcher's
    modules take every path inside the folder from here."""

    path: Path

    # --- what a run writes ---------------------------------------------------------------------------------------
    @property
    def log(self) -> Path:
        return self.path / run_files.LOG

    @property
    def summary(self) -> Path:
        return self.path / run_files.SUMMARY

    @property
    def trainer_state(self) -> Path:
        return self.path / run_files.TRAINER_STATE

    @property
    def final(self) -> Path:
        return self.path / run_files.FINAL

    @property
    def final_is_adapter(self) -> bool:
        """`final` holds a LoRA / QLoRA adapter (PEFT's files, to load on its base or merge), not full weights."""
        return (self.final / ADAPTER_CONFIG).is_file()

    @property
    def merged(self) -> Path:
        """Where `python -m launch merge` writes the adapter merged into its base, by default."""
        return self.path / MERGED

    @property
    def trackio(self) -> Path:
        return self.path / run_files.TRACKIO

    def checkpoint(self, step: int) -> Path:
        return self.path / f"{run_files.CHECKPOINT_PREFIX}{step}"

    def checkpoints(self) -> list[Path]:
        """The Trainer's checkpoint-N folders, oldest first."""
        if not self.path.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.path.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
        return [p for _, p in sorted(found)]

    # --- the launcher's own ----------------------------------------------------------------------------------------
    @property
    def meta(self) -> Path:
        return self.path / run_files.META

    @property
    def manifest(self) -> Path:
        return self.meta / run_files.MANIFEST

    def lock(self, machine_rank: int) -> Path:
        return self.meta / run_files.lock_file(machine_rank)

    @property
    def monitor(self) -> Path:
        """The ranks' heartbeats and sentinel verdict (passed to them in run_files.MONITOR_ENV)."""
        return self.meta / run_files.MONITOR

    @property
    def bench(self) -> Path:
        """The ranks' bench measurements (their sentinel verdict is in `monitor` too:
        launch.results.sentinel.read_verdict)."""
        return self.monitor / run_files.BENCH

    # --- checks ----------------------------------------------------------------------------------------------------
    def existing_parent(self) -> Path:
        """The folder itself, or its nearest ancestor that exists (where it will be created)."""
        existing = self.path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        return existing

    def check_free_space(self, min_free: int) -> None:
        """A full output file system is found now, not after an hour of training (reads only)."""
        free = shutil.disk_usage(self.existing_parent()).free
        if free < min_free:
            raise LaunchError(
                f"Only {free / 2**20:.0f} MiB are free under {self.path}; checkpoints, logs and the final weights need "
                f"more (at least {min_free / 2**20:.0f} MiB, LAUNCH_MIN_FREE_MB). Free space or pass another "
                "--output-dir."
            )

    def check_writable(self) -> None:
        """Once the folder is claimed: a file can really be written in it (`check()` only asked `os.access`)."""
        try:
            probe = self.meta / run_files.WRITE_PROBE
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise LaunchError(f"The output folder {self.path} is not writable ({e.strerror}). "
                              "Pass --output-dir.") from None


@dataclass
class Claim:
    """What `check()` found and `claim()` will do."""

    path: Path
    machine_rank: int = 0
    new: bool = True  # the folder does not exist yet or is empty
    delete: list[str] = field(default_factory=list)  # --overwrite: manifest entries to delete
    stale_lock: dict | None = None  # a dead holder's lock, taken over
    before: set[str] = field(default_factory=set)  # top-level entries before the run
    lock_path: Path | None = None
    notes: list[str] = field(default_factory=list)  # what to tell the user before starting


def expand(path: str | os.PathLike) -> Path:
    """`~` expanded (also in `--output-dir=~/x`, which the shell leaves alone), made absolute."""
    return Path(os.path.expanduser(str(path))).absolute()


def read_manifest(path: Path) -> dict | None:
    """The folder's `.launch/manifest.json` (None when absent or unreadable)."""
    file = RunFolder(path).manifest
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), list) else None


def read_lock(lock: Path) -> dict | None:
    try:
        return json.loads(lock.read_text())
    except (OSError, json.JSONDecodeError):
        return {} if lock.exists() else None


def holder_alive(info: dict) -> bool:
    """The lock's process still runs (same host; a recycled pid started after the lock is not its holder)."""
    if info.get("host") != socket.gethostname():
        return True  # cannot tell from here: treat as held
    pid = info.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.create_time() <= float(info.get("started", 0)) + 1.0
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied, psutil missing
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _when(epoch) -> str:
    return datetime.datetime.fromtimestamp(float(epoch)).isoformat(sep=" ", timespec="seconds")


def check(path: Path, resume: bool, overwrite: bool, machine_rank: int = 0, min_free: int | None = None) -> Claim:
    """Everything that must hold before the folder may be used, `min_free` bytes free on its file system included
    (when given); reads only."""
    folder = RunFolder(path)
    claim = _check(folder, resume, overwrite, machine_rank)
    if min_free is not None:
        folder.check_free_space(min_free)
    return claim


def _check(folder: RunFolder, resume: bool, overwrite: bool, machine_rank: int) -> Claim:
    path = folder.path
    claim = Claim(path=path, machine_rank=machine_rank)
    if path.is_symlink() and not path.exists():
        raise LaunchError(f"The output folder {path} is a symbolic link to {os.readlink(path)}, which does not exist. "
                          "Create the folder it points to, remove the link, or pass another --output-dir.")
    if path.exists() and not path.is_dir():
        raise LaunchError(f"The output folder {path} is a file. Pass another --output-dir.")
    existing = folder.existing_parent()
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is a file" if not existing.is_dir() else "is not writable"
        raise LaunchError(f"The output folder {path} cannot be created: {existing} {why}. Pass another --output-dir.")
    entries = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    claim.before = set(entries)
    lock = folder.lock(machine_rank)
    info = read_lock(lock)
    if info is not None:
        if holder_alive(info):
            raise LaunchError(
                f"Another launcher is using {path}: process {info.get('pid')} on {info.get('host')}, started "
                f"{_when(info.get('started', 0))} ({info.get('command', '?')}). Wait for it to finish, stop it, or "
                f"pass another --output-dir. (If that process is gone, delete {lock}.)"
            )
        claim.stale_lock = info
        claim.notes.append(f"taking over the lock of process {info.get('pid')} (started "
                           f"{_when(info.get('started', 0))}), which is no longer running")
    content = [e for e in entries if e != run_files.META]  # every entry but the launcher's own
    if not content:
        if resume:
            raise LaunchError(f"--resume: {path} holds no earlier run to continue.")
        return claim
    claim.new = False
    manifest = read_manifest(path)
    if manifest is None and folder.manifest.exists():
        raise LaunchError(
            f"{folder.manifest} is corrupted (not the JSON object with an `entries` list this launcher writes), so "
            f"which files of {path} an earlier run wrote cannot be told. Move the folder's contents elsewhere (or "
            "delete them) and start again, or pass another --output-dir.")
    if manifest is None:
        shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
        raise LaunchError(
            f"The output folder {path} already holds files this launcher did not write there ({shown}). A run writes "
            "checkpoints, weights and a README.md model card into its output folder and rotates old checkpoints, so "
            "it only uses an empty folder or one an earlier run of this launcher made. Pass a new --output-dir."
        )
    known = set(manifest["entries"]) | _adoptable(path, entries, claim.stale_lock)
    foreign = [e for e in content if e not in known]
    if foreign:
        raise LaunchError(
            f"The output folder {path} holds files no run of this launcher created: {', '.join(foreign[:6])}. "
            "Move them elsewhere, or pass another --output-dir: a run never shares its folder with other files."
        )
    earlier = [e for e in entries if EARLIER_RUN.match(e)]
    if overwrite:
        claim.delete = sorted(e for e in content if e in known)
        if claim.delete:
            claim.notes.append(f"--overwrite: deleting the earlier run's {', '.join(claim.delete)} in {path}")
    elif earlier and not resume:
        raise LaunchError(
            f"The output folder {path} holds an earlier run's checkpoints or final weights ({', '.join(earlier)}). "
            f"Pass --resume to continue it, --overwrite to delete that run's files ({', '.join(sorted(content))}) and "
            "start again, or another --output-dir."
        )
    return claim


def _adoptable(path: Path, entries: list[str], stale: dict | None) -> set[str]:
    """Entries written by a run that died before updating the manifest: newer than its lock's start."""
    if not stale or "started" not in stale:
        return set()
    started = float(stale["started"]) - 1.0
    return {e for e in entries if e != run_files.META and (path / e).lstat().st_mtime >= started}


def claim(c: Claim, command: str, run: dict | None = None) -> Claim:
    """Create the folder, delete what --overwrite named, take the lock, record the run's identity (`run`, what a
    checkpoint here must share with a run that resumes it: launch.run.checkpoints). Call only after every check
    passed."""
    folder = RunFolder(c.path)
    folder.meta.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(c.path) or {"entries": []}
    if run is not None:
        manifest["run"] = run
    if c.stale_lock:
        manifest["entries"] = sorted(set(manifest["entries"]) | _adoptable(c.path, sorted(c.before), c.stale_lock))
    for name in c.delete:
        target = c.path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    manifest["entries"] = sorted(set(manifest["entries"]) - set(c.delete))
    _write_manifest(c.path, manifest)
    c.before = {p.name for p in c.path.iterdir()}
    lock = folder.lock(c.machine_rank)
    if c.stale_lock is not None:
        lock.unlink(missing_ok=True)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": command}
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        other = read_lock(lock) or {}
        raise LaunchError(f"Another launcher took {c.path} a moment ago (process {other.get('pid')}). Pass another "
                          "--output-dir.") from None
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    c.lock_path = lock
    return c


def release(c: Claim) -> None:
    """Record what the run created in the manifest, then drop the lock."""
    if c.lock_path is None:
        return
    try:
        manifest = read_manifest(c.path) or {"entries": []}
        now = {p.name for p in c.path.iterdir()} - {run_files.META}
        manifest["entries"] = sorted((set(manifest["entries"]) & now) | (now - c.before))
        _write_manifest(c.path, manifest)
    finally:
        c.lock_path.unlink(missing_ok=True)
        c.lock_path = None


def record_entry(path: Path, name: str) -> None:
    """Add `name` (written into the folder after its run, e.g. a merged model) to the manifest's entries, so that the
    next run accepts the folder and --overwrite deletes it with the run's other files. A folder without a manifest
    (not the launcher's) is left without one."""
    manifest = read_manifest(path)
    if manifest is None:
        return
    manifest["entries"] = sorted(set(manifest["entries"]) | {name})
    _write_manifest(path, manifest)


def _write_manifest(path: Path, manifest: dict) -> None:
    manifest["about"] = ("Written by `python -m launch`: the entries runs created in this folder. --overwrite deletes "
                         "only these; a folder without this file is never used as an output folder.")
    file = RunFolder(path).manifest
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, file)
