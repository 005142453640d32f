"""The final weights of an FSDP run with `fsdp_state_dict_type: SHARDED_STATE_DICT`: every rank writes its shard,
then the shards become plain safetensors files (with config.json and the tokenizer) that `from_pretrained` loads.

Why: transformers 5.23's `Trainer.save_model` writes weights under FSDP only with FULL_STATE_DICT, which gathers
the whole model on the first process (in its host memory: 4 bytes per parameter, FSDP2 keeping fp32 parameters);
with SHARDED_STATE_DICT it writes nothing at all, not even config.json. train.py's section `sharded-final-save` calls
`save_final` instead (every rank, after training):

1. Every rank writes its own shard of the model into a torch.distributed.checkpoint (DCP) folder,
   `final/pytorch_model_fsdp_0`: Accelerate's `save_fsdp_model` layout (its folder name, the `model` key), which its
   `load_fsdp_model` and `accelerate merge-weights` read, as the Trainer's SHARDED checkpoints hold. Written by
   `dcp.save` of torch's sharded `get_model_state_dict` directly rather than through `save_fsdp_model`, because
   Accelerate's SHARDED config has `offload_to_cpu=True`: it would first copy each rank's whole shard into host memory
   (a machine of 8 processes out of 24 would hold a third of the model), where DCP's writer copies a GPU tensor to
   the host as it writes it (torch's `_OverlappingCpuLoader`: 10 MB ahead).
2. Rank 0 writes what the Trainer writes beside the weights (config.json, generation_config.json, the tokenizer,
   training_args.bin): the Trainer's own `_save` with an empty state dict, as transformers itself does for ZeRO-3
   without gathered weights (`Trainer.save_model`), and removes any weights file an earlier attempt left.
3. The ranks share the consolidation. The tensors, in the model's order, are cut into output files of at most
   SHARD_BYTES (a tensor larger than that alone in its file), and no larger than 1/world of the model, so that the
   work spreads over the ranks; rank r writes files r, r + world, ...: each file's tensors read from the DCP shards
   that hold their pieces (DCP's own reader, `no_dist`: only those byte ranges are read), then written with
   safetensors. A process holds one output file at a time (plus the piece being read; a MoE file up to twice while
   its fused experts are split back), never the model.
4. Rank 0 writes model.safetensors.index.json (for more than one file), checks every file's safetensors header
   against the plan, and only then removes the DCP folder. A failure before that leaves the DCP folder whole.

Names are what `save_pretrained` writes: tied weights once (transformers' `all_tied_weights_keys`: the target of a
tie is dropped when its source is saved), `_keys_to_ignore_on_save` left out, and transformers' loading conversions
reverted (`revert_weight_conversion`, e.g. MoE experts fused at load time written back one per expert), per output
file as transformers does for offloaded models; the plan checks on meta tensors that per-file reverting gives what
reverting the whole model gives. The dtype is the checkpoint's, as FULL_STATE_DICT writes it (FSDP2 under mixed
precision keeps fp32 parameters: fp32 files).

A LoRA / QLoRA run (adapter only) needs no consolidation: only the trainable tensors are gathered, onto the first
process (torch's `get_model_state_dict` with `ignore_frozen_params`, what Accelerate's adapter-only save does for full
state dicts: a few hundred MB), and written by the Trainer's `_save` (PEFT's adapter files, the tokenizer), exactly
as under FULL_STATE_DICT, but without gathering the frozen base.

Why not upstream's consolidation: Accelerate's `merge_fsdp_weights` (`accelerate merge-weights`) and torch's
`format_utils.dcp_to_torch_save` load the whole checkpoint into one dict in one process (`_EmptyStateDictLoadPlanner`)
and write it as one file: host memory = the whole model. torch's streaming consolidation
(`torch.distributed.checkpoint._consolidate_hf_safetensors`, behind `HuggingFaceStorageWriter(enable_consolidation=
True)` and transformers' `consolidate_distributed_checkpoint`) is private, reads only DCP's Hugging Face safetensors
layout (not the .distcp files Accelerate and the Trainer's checkpoints write), runs on the coordinator alone while
the other ranks wait in a collective, and, through transformers, writes one file.

Why in the train script and not a launcher step after the ranks end: plain `accelerate launch` gets the weights too;
the ranks are still up to share the work (each about 1/world of the model), and the "saved" line comes after the
files are checked. Several machines need the output folder on storage they all see (every rank writes
its shard there, and any rank may read any shard): a rank that cannot see every shard stops every rank with that
message before anything is consolidated. `python -m launch.rank.consolidate FOLDER` (`main`) runs the same
consolidation in one process: for a final save whose consolidation stopped, or a SHARDED_STATE_DICT checkpoint.

Imported by train.py's section (rank side: no import of the launcher's other modules).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass

# Accelerate's name for the model's DCP folder (accelerate.utils.constants FSDP_MODEL_NAME + "_0", as
# save_fsdp_model writes it); not imported so that `plan` runs without Accelerate's import.
CHECKPOINT = "pytorch_model_fsdp_0"
STATE_KEY = "model"  # the top-level key save_fsdp_model saves the state dict under
# The largest output file (a tensor larger than that alone in its file): the size the Hub's large models are split
# into (transformers' default max_shard_size before 5.0, "5GB"). A consolidating process holds one file at a time.
SHARD_BYTES = 5 * 10**9
# transformers' names (transformers.utils SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, the shard pattern of
# save_pretrained), spelled here so that the plan needs no transformers import
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD = "model-{:05d}-of-{:05d}.safetensors"


@dataclass
class OutputFile:
    name: str
    keys: list[str]  # the DCP keys read into it
    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype), after reverting conversions
    nbytes: int


def save_final(trainer, final_dir: str, adapter_only: bool) -> None:
    """The final save under SHARDED_STATE_DICT, on every rank (module docstring)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    accelerator = trainer.accelerator
    if adapter_only:
        # The Trainer's _save hands the gathered tensors to PEFT's save_pretrained, which picks the adapter's (as
        # from FULL_STATE_DICT's gather). FSDP2: the trainable tensors only, gathered onto the first process. FSDP1:
        # the gather FULL_STATE_DICT does (Accelerate's get_state_dict): torch's ignore_frozen_params gathers FSDP1's
        # whole model before dropping the frozen part, and fails on the other ranks, whose offloaded state dict is
        # empty (torch 2.13 `_get_model_state_dict`: `state_dict.pop(fqn)`).
        if getattr(accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2:
            state = get_model_state_dict(trainer.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))
        else:
            state = accelerator.get_state_dict(trainer.model)
        trainer._save(final_dir, state_dict=state)
        accelerator.wait_for_everyone()
        return

    import torch.distributed.checkpoint as dcp

    checkpoint = os.path.join(final_dir, CHECKPOINT)
    os.makedirs(checkpoint, exist_ok=True)
    dcp.save({STATE_KEY: get_model_state_dict(trainer.model)}, storage_writer=dcp.FileSystemWriter(checkpoint))
    problems = storage_problems(checkpoint)
    if dist.is_initialized():  # every rank stops with the same message when any one cannot see every shard
        found: list = [None] * dist.get_world_size()
        dist.all_gather_object(found, (accelerator.process_index, problems))
        problems = [f"rank {rank}: {p}" for rank, ps in found for p in ps]
    if problems:
        raise RuntimeError(
            f"The sharded final save in {checkpoint} cannot be consolidated: " + "; ".join(problems[:4])
            + ". Every rank writes its shard into the output folder and any rank may read any shard: on several "
            "machines the output folder must be on storage they all see (a shared file system or bucket mounted at "
            "the same path), or use fsdp_state_dict_type: FULL_STATE_DICT (gathered on the first process).")
    model = accelerator.unwrap_model(trainer.model)
    if accelerator.is_main_process:
        trainer._save(final_dir, state_dict={})  # config, generation config, tokenizer, training_args.bin
        for stale in (SINGLE, INDEX):  # _save's empty weights file; an index a failed earlier save left
            if os.path.isfile(os.path.join(final_dir, stale)):
                os.remove(os.path.join(final_dir, stale))
    accelerator.wait_for_everyone()
    try:
        files = plan(checkpoint, model, accelerator.num_processes)
        for f in files[accelerator.process_index::accelerator.num_processes]:
            write_file(checkpoint, final_dir, f, model)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            finish(final_dir, files)
    except Exception as e:
        raise RuntimeError(f"Consolidating {checkpoint} failed ({type(e).__name__}: {e}). The shards are kept there: "
                           f"`python -m launch.rank.consolidate {final_dir}` finishes it in one process.") from e
    if accelerator.is_main_process:
        shutil.rmtree(checkpoint)
    accelerator.wait_for_everyone()


def consolidate(checkpoint: str, out_dir: str, model) -> list[OutputFile]:
    """The whole consolidation in this one process: `checkpoint` (a DCP folder of the model, as save_fsdp_model
    writes it) into safetensors files and their index in `out_dir`. `model`: the model (or the same architecture on
    the meta device), for its tied weights, the keys it never saves and transformers' conversions."""
    if problems := storage_problems(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a whole distributed checkpoint: " + "; ".join(problems[:4]))
    files = plan(checkpoint, model, world=1)
    os.makedirs(out_dir, exist_ok=True)
    for f in files:
        write_file(checkpoint, out_dir, f, model)
    finish(out_dir, files)
    return files


def storage_problems(checkpoint: str) -> list[str]:
    """What this process cannot read of a DCP folder: its .metadata, or a shard file the metadata names."""
    from torch.distributed.checkpoint import FileSystemReader

    if not os.path.isfile(os.path.join(checkpoint, ".metadata")):
        return [f"{checkpoint}/.metadata is missing"]
    metadata = FileSystemReader(checkpoint).read_metadata()
    shards = sorted({info.relative_path for info in metadata.storage_data.values()})
    missing = [s for s in shards if not os.path.isfile(os.path.join(checkpoint, s))]
    if missing:
        return [f"{len(missing)} of its {len(shards)} shard files are not in {checkpoint} ({', '.join(missing[:3])}"
                + (", ..." if len(missing) > 3 else "") + ")"]
    return []


def plan(checkpoint: str, model, world: int) -> list[OutputFile]:
    """The output files: the checkpoint's tensors in order, without those save_pretrained leaves out, cut into files
    of at most min(SHARD_BYTES, 1/world of the model) bytes. Every rank computes the same plan."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(checkpoint).read_metadata()
    paths = metadata.planner_data or {}
    entries = {}  # DCP key -> (name in the model, its storage metadata)
    for key, md in metadata.state_dict_metadata.items():
        path = paths.get(key, (key,))
        if path[0] != STATE_KEY:
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"{checkpoint}: `{key}` is not a tensor ({type(md).__name__}); a model's state dict "
                             "consolidated into safetensors holds tensors only.")
        entries[key] = (".".join(map(str, path[1:])), md)
    if not entries:
        raise ValueError(f"{checkpoint} holds no `{STATE_KEY}` tensors: not a model saved by save_fsdp_model.")
    names = {name for name, _ in entries.values()}
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    dropped = {target for target, source in tied.items() if source in names}
    dropped |= set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    kept = [(key, name, md) for key, (name, md) in entries.items() if name not in dropped]

    sizes = [math.prod(md.size) * md.properties.dtype.itemsize for _, _, md in kept]
    groups = [[kept[i] for i in indexes] for indexes in file_groups(sizes, world)]

    def meta(items) -> dict:
        return {name: torch.empty(tuple(md.size), dtype=md.properties.dtype, device="meta") for _, name, md in items}

    whole = _reverted(model, meta(kept))
    files = []
    for i, group in enumerate(groups, start=1):
        tensors = _reverted(model, meta(group))
        files.append(OutputFile(SINGLE if len(groups) == 1 else SHARD.format(i, len(groups)), [k for k, _, _ in group],
                                {n: (tuple(t.shape), str(t.dtype)) for n, t in tensors.items()},
                                sum(t.numel() * t.element_size() for t in tensors.values())))
    per_file = {n: spec for f in files for n, spec in f.tensors.items()}
    if per_file != {n: (tuple(t.shape), str(t.dtype)) for n, t in whole.items()}:
        raise ValueError(f"{type(model).__name__}'s weight conversions (transformers' revert_weight_conversion) need "
                         "tensors from more than one output file; raise SHARD_BYTES in launch/rank/consolidate.py.")
    return files


def file_groups(sizes: list[int], world: int) -> list[list[int]]:
    """The tensors (their sizes in bytes, in the model's order) of each output file, by index: contiguous runs of at
    most min(SHARD_BYTES, 1/world of the total) bytes, a tensor larger than that alone."""
    limit = max(1, min(SHARD_BYTES, math.ceil(sum(sizes) / world)))
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(sizes):
        if not groups or size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups


def _reverted(model, tensors: dict) -> dict:
    """transformers' loading conversions undone, as save_pretrained writes the weights (identity for most models)."""
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, tensors)


def write_file(checkpoint: str, out_dir: str, f: OutputFile, model) -> None:
    """Read one output file's tensors from the DCP shards (only their byte ranges), write it with safetensors
    (under a temporary name, renamed once whole)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    metadata = dcp.FileSystemReader(checkpoint).read_metadata()
    paths = metadata.planner_data or {}
    state = {}
    for key in f.keys:
        md = metadata.state_dict_metadata[key]
        state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is, on every rank
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(checkpoint), no_dist=True)
    named = {".".join(map(str, paths.get(k, (k,))[1:])): t for k, t in state.items()}
    del state
    tensors = {n: t.contiguous() for n, t in _reverted(model, named).items()}
    del named
    partial = os.path.join(out_dir, f".{f.name}.partial")
    save_file(tensors, partial, metadata={"format": "pt"})  # save_pretrained's metadata
    os.replace(partial, os.path.join(out_dir, f.name))


def finish(out_dir: str, files: list[OutputFile]) -> None:
    """Check every output file's header against the plan, then write the index (for more than one file)."""
    from safetensors import safe_open

    for f in files:
        path = os.path.join(out_dir, f.name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} was not written.")
        with safe_open(path, framework="pt") as st:
            held = {n: (tuple(st.get_slice(n).get_shape()), st.get_slice(n).get_dtype()) for n in st.keys()}
        want = {n: (shape, _SAFETENSORS_DTYPES.get(dtype, dtype)) for n, (shape, dtype) in f.tensors.items()}
        if held != want:
            raise ValueError(f"{path} does not hold the tensors planned for it: "
                             f"{sorted(set(held) ^ set(want)) or 'shapes or dtypes differ'}.")
    if len(files) > 1:
        index = {"metadata": {"total_parameters": sum(math.prod(s) for f in files for s, _ in f.tensors.values()),
                              "total_size": sum(f.nbytes for f in files)},
                 "weight_map": {n: f.name for f in files for n in f.tensors}}
        partial = os.path.join(out_dir, f".{INDEX}.partial")
        with open(partial, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(index, indent=2, sort_keys=True) + "\n")  # as save_pretrained writes it
        os.replace(partial, os.path.join(out_dir, INDEX))


# torch dtype (str) -> safetensors' dtype name, as `safe_open(...).get_slice(n).get_dtype()` reports it
_SAFETENSORS_DTYPES = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8", "torch.uint8": "U8",
    "torch.bool": "BOOL", "torch.float8_e4m3fn": "F8_E4M3", "torch.float8_e5m2": "F8_E5M2",
}


def main(argv: list[str] | None = None) -> int:
    """`python -m launch.rank.consolidate FOLDER [--model DIR_OR_ID] [--out DIR]`: the same consolidation in one
    process, for a final save whose consolidation stopped (its shards stay in FOLDER/pytorch_model_fsdp_0) or a
    SHARDED_STATE_DICT checkpoint (checkpoint-N, which holds no config.json: --model names the model it trained)."""
    import argparse

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    parser = argparse.ArgumentParser(prog="python -m launch.rank.consolidate", description=(
        "Consolidate an FSDP sharded model (FOLDER/pytorch_model_fsdp_0) into safetensors files that from_pretrained "
        "loads, one output file in memory at a time."))
    parser.add_argument("folder", help=f"a folder holding {CHECKPOINT} (OUTPUT_DIR/final, or a checkpoint-N)")
    parser.add_argument("--model", help="the model's folder or Hub id, for its config.json (default: FOLDER's)")
    parser.add_argument("--out", help="where the safetensors files and their index go (default: FOLDER)")
    ns = parser.parse_args(argv)
    out = ns.out or ns.folder
    config = AutoConfig.from_pretrained(ns.model or ns.folder)
    with torch.device("meta"):  # the architecture only: names, tied weights, conversions
        model = AutoModelForCausalLM.from_config(config)
    files = consolidate(os.path.join(ns.folder, CHECKPOINT), out, model)
    if not os.path.isfile(os.path.join(out, "config.json")):
        config.save_pretrained(out)
    print(f"{len(files)} safetensors file(s) in {out}; {os.path.join(ns.folder, CHECKPOINT)} can be deleted.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
