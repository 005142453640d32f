"""Finding the checkpoint to resume from, and making sure it is whole.

The Trainer writes a checkpoint folder piece by piece (weights, optimizer and scheduler, RNG states) and writes
trainer_state.json last, after every rank has saved its part; so a checkpoint-N folder without
trainer_state.json is one whose run died while saving it, and it is never picked. A file can still be cut short
later (a full disk, a copy interrupted): `problems()` reads each weight file's own framing, cheaply (the header of
a safetensors file, the central directory of a torch.save zip), so a truncated file is refused before the ranks
start, and the failure summary never advises such a checkpoint.

A checkpoint must also belong to a run like the one resuming it (`resume_problems`): each run records its identity
(recipe, model, strategy, ZeRO stage, mesh, world size) in its output folder's manifest, and a checkpoint saved by
another strategy, mesh, model or recipe is refused: DDP does not read a ZeRO checkpoint's optimizer state, and the
mixed run would diverge and write over the other run's results.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from launch.config.adapter import Adapter
from launch.errors import LaunchError
from launch.results.outdir import ADAPTER_CONFIG, RunFolder, read_manifest


def complete(folder: Path) -> bool:
    return RunFolder(folder).trainer_state.is_file() and not problems(folder)


def problems(folder: Path) -> list[str]:
    """What is cut short or unreadable in a checkpoint folder (empty when every file checks out)."""
    out = []
    state = RunFolder(folder).trainer_state  # a checkpoint holds its own, as the output folder does
    if not state.is_file():
        return [f"{state.name} is missing (the run died while saving)"]
    try:
        json.loads(state.read_text())
    except (OSError, json.JSONDecodeError):
        out.append(f"{state.name} is not valid JSON")
    for path in sorted(folder.rglob("*")):
        if path.is_file() and (msg := file_problem(path)):
            out.append(f"{path.relative_to(folder)}: {msg}")
    return out


def file_problem(path: Path) -> str | None:
    """A weight file cut short or unreadable, from its own framing (None: it checks out, or is not a weight file)."""
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".pth", ".bin") and path.stat().st_size and not zipfile.is_zipfile(path):
        # torch.save writes a zip archive; a cut-off one has no end-of-central-directory record
        with open(path, "rb") as f:
            if f.read(2) == b"PK":
                return "truncated (its zip directory is missing)"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header with every tensor's byte range, then the data."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > size:
                return f"truncated ({size} bytes, its header alone needs {8 + n})"
            header = json.loads(f.read(n))
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError):
        return "not a safetensors file (unreadable header)"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"truncated ({size} bytes, its tensors need {8 + n + end})"
    return None


def checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    return RunFolder(output_dir).checkpoints()


def newest_complete(output_dir: Path) -> Path | None:
    for folder in reversed(checkpoints(output_dir)):
        if complete(folder):
            return folder
    return None


def resolve_resume(output_dir: Path, resume: str) -> Path:
    """`--resume` (newest complete checkpoint in the output folder) or `--resume PATH` (that one)."""
    if resume != "latest":
        path = Path(resume).expanduser().absolute()
        if not path.is_dir():
            raise LaunchError(f"--resume {resume}: no such checkpoint folder.")
        if problem := not_a_checkpoint(path):
            raise LaunchError(f"--resume {resume}: {problem}")
        if found := problems(path):
            raise LaunchError(f"--resume {resume}: not a complete checkpoint ({'; '.join(found)}). Resume from an "
                              "earlier checkpoint, or start again.")
        return path
    found = newest_complete(output_dir)
    if found is None:
        broken = [f"{c.name} ({'; '.join(problems(c))})" for c in checkpoints(output_dir)]
        raise LaunchError(
            f"--resume: no complete checkpoint under {output_dir}"
            + (f" (incomplete: {', '.join(broken)})" if broken else "")
            + ". Checkpoints are saved every --save-steps steps (or per the recipe's save_strategy/save_steps)."
        )
    return found


def not_a_checkpoint(path: Path) -> str | None:
    """A run's final/ or merged/ folder given as a checkpoint: it holds the trained model (or adapter) only, none of
    what resuming needs (optimizer, scheduler, RNG states, trainer_state.json), and did not die while saving."""
    run = RunFolder(path.parent)
    if path.resolve() not in (run.final.resolve(), run.merged.resolve()):
        return None
    what = "final model (or adapter)" if path.resolve() == run.final.resolve() else "merged model (`launch merge`)"
    saved = [c.name for c in run.checkpoints() if complete(c)]
    where = (f"resume from one of its checkpoints ({', '.join(saved[-3:])}: `--resume {path.parent / saved[-1]}`), or "
             f"pass --resume alone, which takes the newest complete one") if saved else (
             f"{path.parent} holds no complete checkpoint-N folder to resume from (checkpoints are saved every "
             "--save-steps steps): start a new run in a new --output-dir")
    return (f"{path} is the run's {what}, not a checkpoint: it holds the weights only, not the optimizer, scheduler "
            f"and RNG states nor trainer_state.json that resuming needs. A run is resumed from a checkpoint-N folder: "
            f"{where}.")


def identity(setup) -> dict:
    """What a checkpoint must share with the run that resumes it (recorded in the output folder's manifest); `adapter`
    is the LoRA / QLoRA adapter's (method, rank, targets, quantization: launch.config.adapter), None for a full
    fine-tune."""
    layout = setup.layout
    adapter = Adapter.from_training(setup.training)
    return {"recipe": setup.recipe.name, "model": str(setup.training.get("model_name_or_path")),
            "strategy": layout.kind, "zero_stage": layout.zero_stage, "mesh": dict(layout.mesh),
            "world_size": layout.world_size, "adapter": adapter.identity() if adapter else None}


def saved_format(folder: Path) -> dict:
    """What a checkpoint's files say about the run that saved it, for checkpoints without a recorded identity (saved
    by plain `accelerate launch`): its strategy and, from the Trainer's per-process RNG files, its world size."""
    if any(p.is_dir() and p.name.startswith("global_step") for p in folder.iterdir()):
        kind = "deepspeed"
    elif any(p.name.startswith(("pytorch_model_fsdp", "optimizer_0")) for p in folder.iterdir()):
        kind = "fsdp2"
    elif (folder / "optimizer.pt").is_file():
        kind = "ddp"
    else:
        kind = None
    rng = [p for p in folder.glob("rng_state_*.pth")]
    world = len(rng) if rng else (1 if (folder / "rng_state.pth").is_file() else None)
    # PEFT saves an adapter checkpoint's weights as adapter_config.json + adapter_model.safetensors (no model weights)
    adapter = True if (folder / ADAPTER_CONFIG).is_file() else None
    return {"strategy": kind, "world_size": world, "adapter": adapter}


def resume_problems(checkpoint: Path, run: dict) -> list[str]:
    """How `checkpoint` differs from the run that wants to resume it (`run`: `identity(setup)`); empty when it may."""
    manifest = read_manifest(checkpoint.parent) or {}
    saved = manifest.get("run")
    source = f"recorded in {RunFolder(checkpoint.parent).manifest}"
    if not isinstance(saved, dict):
        saved, source = saved_format(checkpoint), "read from its files"
    keys = ["recipe", "model", "strategy", "zero_stage", "mesh"]
    # DeepSpeed partitions the optimizer state per data-parallel rank (and FSDP2's sharded state per mesh), so the
    # world size must match; a DDP checkpoint holds the whole state and resumes on any world size.
    if run["strategy"] in ("deepspeed", "fsdp2", "fsdp1") or saved.get("strategy") in ("deepspeed", "fsdp2", "fsdp1"):
        keys.append("world_size")
    differences = [f"{key} {saved[key]!r} (this run: {run[key]!r})" for key in keys
                   if saved.get(key) is not None and key in run and saved[key] != run[key]]
    differences += _adapter_difference(saved, run)
    if not differences:
        return []
    return [f"the checkpoint {checkpoint} was saved by another kind of run ({source}): " + "; ".join(differences)]


def _adapter_difference(saved: dict, run: dict) -> list[str]:
    """An adapter checkpoint holds only the adapter's weights and optimizer state, a full fine-tune's every weight's:
    neither resumes the other kind of run; two adapters must share method, rank, targets and quantization. (A manifest
    written before adapters were recorded has no `adapter` key: nothing to compare.)"""
    if "adapter" not in saved or "adapter" not in run:
        return []
    was, now = saved["adapter"], run["adapter"]
    if bool(was) != bool(now):
        def kind(a):
            if isinstance(a, dict):
                return f"an adapter ({a['method']}) run"
            return "an adapter run" if a else "a full fine-tune"
        return [f"it is {kind(was)}'s checkpoint and this run is {kind(now)} (an adapter checkpoint holds only the "
                "adapter's weights and optimizer state, a full fine-tune's every weight's)"]
    if isinstance(was, dict) and isinstance(now, dict) and was != now:
        keys = [k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
        return ["adapter " + ", ".join(f"{k} {was.get(k)!r} (this run: {now.get(k)!r})" for k in keys)]
    return []
