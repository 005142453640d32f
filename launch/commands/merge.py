"""`python -m launch merge RUN_DIR [--out DIR] [--base DIR_OR_ID]`: a LoRA / QLoRA run's adapter (RUN_DIR/final, PEFT's
files) merged into its base weights with PEFT's `merge_and_unload`, written with the tokenizer as a full model that
plain transformers loads (`AutoModelForCausalLM.from_pretrained(DIR)`), without PEFT.

The base is the one PEFT recorded in the adapter's adapter_config.json (`base_model_name_or_path`, `revision`), loaded
unquantized in its own dtype in this one process (CPU, or what transformers picks): a QLoRA adapter is merged into the
bf16 base, not into the 4-bit weights it trained against (PEFT's FSDP-QLoRA guide does the same; merging into 4-bit
storage would round the merged weights to 4 bits again).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from launch.run import interrupt
from launch.run.checkpoints import complete, file_problem
from launch.commands import command
from launch.errors import LaunchError
from launch.config.options import Parser
from launch.results.outdir import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, RunFolder, expand, holder_alive, read_lock,
                                   read_manifest, record_entry)
from launch.checks.rules import merge_problems

ADAPTER_WEIGHT_FILES = (ADAPTER_WEIGHTS, "adapter_model.bin")  # PEFT's safetensors file, or its older torch.save one
TOKENIZER_CONFIG = "tokenizer_config.json"  # what every tokenizer's save_pretrained writes


@command("merge", "merge a LoRA run's adapter (RUN_DIR/final) into its base: a full model for plain transformers",
         reads_first=True)
def main(argv: list[str]) -> int:
    p = Parser(
        prog="python -m launch merge",
        description="Merge the adapter a LoRA / QLoRA run saved in RUN_DIR/final into its base weights (PEFT's "
                    "merge_and_unload) and write the full model and the tokenizer, loadable by plain transformers.")
    p.add_argument("run", metavar="RUN_DIR", help="the run's output folder (its final/ holds the adapter)")
    p.add_argument("--out", metavar="DIR", help="where the merged model goes (default: RUN_DIR/merged); must not "
                   "exist or be empty")
    p.add_argument("--base", metavar="DIR_OR_ID", help="the base model (default: the one adapter_config.json names)")
    p.add_argument("--allow-quantized", action="store_true", help="merge a QLoRA adapter into the unquantized base "
                   "although the merged model then differs from the trained one by the quantization error")
    ns = p.parse_args(argv)

    folder = RunFolder(expand(ns.run))
    final = adapter_folder(folder, allow_quantized=ns.allow_quantized)
    out = expand(ns.out) if ns.out else folder.merged
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LaunchError(f"--out {out} already exists and is not an empty folder; the merged model is written only "
                          "into a new or empty folder. Delete it or pass another --out.")
    base = merge(final, out, base=ns.base)
    if out.parent == folder.path:  # the run folder's own entry from now on: --overwrite deletes it with the run
        record_entry(folder.path, out.name)
    print(f"merged {final} into {base}: {out}")
    return 0


def adapter_folder(folder: RunFolder, allow_quantized: bool = False) -> Path:
    """RUN_DIR/final, checked to hold an adapter that may be merged (launch.checks.rules.merge_problems, on the
    identity the launcher recorded for the run; a folder of plain `accelerate launch` has none, and only its files are
    checked), in a folder no run is writing to."""
    if not folder.path.is_dir():
        raise LaunchError(f"{folder.path} does not exist; give the output folder of a LoRA / QLoRA run.")
    identity = (read_manifest(folder.path) or {}).get("run")
    if isinstance(identity, dict) and (problems := merge_problems(identity, allow_quantized=allow_quantized)):
        raise LaunchError(f"{folder.path}: " + " ".join(problems))
    info = read_lock(folder.lock(0))
    if info and holder_alive(info):
        raise LaunchError(f"A run is still using {folder.path} (process {info.get('pid')}): merge its adapter once "
                          "the run has finished.")
    if not folder.final.is_dir():
        raise LaunchError(f"{folder.final} does not exist: the run has not finished (its adapter is saved at the end) "
                          f"or {folder.path} is not a run's output folder. A checkpoint's adapter can be merged with "
                          "`--base` and the checkpoint folder's adapter files copied into a folder named final.")
    if not folder.final_is_adapter:
        raise LaunchError(f"{folder.final} holds no adapter ({ADAPTER_CONFIG} is missing): it is a full fine-tune's "
                          "final model, which plain transformers already loads; there is nothing to merge.")
    if problem := adapter_files_problem(folder):
        raise LaunchError(problem)
    return folder.final


def adapter_files_problem(folder: RunFolder) -> str | None:
    """PEFT's adapter files in final/ cut short or missing (unchecked, each is a traceback from PEFT or
    safetensors after the base has loaded): its config must be a JSON object, its weights whole."""
    final = folder.final
    found = []
    try:
        config = json.loads((final / ADAPTER_CONFIG).read_text())
        if not isinstance(config, dict) or "peft_type" not in config:
            found.append(f"{ADAPTER_CONFIG} is not PEFT's adapter config (no peft_type)")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        found.append(f"{ADAPTER_CONFIG} is not valid JSON ({getattr(e, 'msg', e)}): cut short?")
    weights = [final / name for name in ADAPTER_WEIGHT_FILES if (final / name).is_file()]
    if not weights:
        found.append(f"its weights ({ADAPTER_WEIGHTS}) are missing")
    found += [f"{w.name}: {msg}" for w in weights if (msg := file_problem(w))]
    saved = [c for c in folder.checkpoints() if complete(c) and (c / ADAPTER_CONFIG).is_file()]
    fixes = []
    if found:
        fixes.append(f"The newest complete checkpoint holds the same kind of files: copy {ADAPTER_CONFIG} and "
                     f"{ADAPTER_WEIGHTS} of {saved[-1]} into {final} (the adapter at step "
                     f"{saved[-1].name.rsplit('-', 1)[-1]}), or run the training again" if saved else
                     "Run the training again (no complete checkpoint holds an adapter)")
    if not (final / TOKENIZER_CONFIG).is_file():  # the run saves the tokenizer beside the adapter; merge copies it
        found.append(f"its tokenizer ({TOKENIZER_CONFIG}) is missing")
        fixes.append(tokenizer_fix(final, folder.checkpoints()))
    if not found:
        return None
    return f"The adapter in {final} cannot be merged: " + "; ".join(found) + ". " + ". ".join(fixes) + "."


def tokenizer_fix(final: Path, checkpoints: list[Path]) -> str:
    """How to put the tokenizer back beside the adapter: the files of a checkpoint that holds them (the trainer saves
    the tokenizer the run trained with into every checkpoint), else the base model's tokenizer saved there."""
    with_tokenizer = [c for c in checkpoints if (c / TOKENIZER_CONFIG).is_file()]
    if with_tokenizer:
        newest = with_tokenizer[-1]
        names = sorted(p.name for p in newest.iterdir() if p.name.startswith(("tokenizer", "special_tokens",
                                                                                 "chat_template", "vocab", "merges")))
        return (f"The tokenizer is the run's, not part of the adapter: copy the tokenizer files of {newest} "
                f"({', '.join(names) or TOKENIZER_CONFIG + ' and the files beside it'}) into {final}")
    try:
        base = json.loads((final / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        base = None
    return ("The tokenizer is the run's, not part of the adapter, and no checkpoint holds it: save the base model's "
            f"tokenizer there, `python -c \"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained("
            f"'{base or 'BASE_MODEL'}').save_pretrained('{final}')\"` (the run trained with it unless it changed "
            "the tokenizer, e.g. its chat template)")


def merge(final: Path, out: Path, base: str | None = None) -> str:
    """Write base + adapter (merged) and the tokenizer into `out` (through a temporary folder beside it, renamed at the
    end, so that a failed merge leaves no half-written model). Returns the base it merged into."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        config = PeftConfig.from_pretrained(str(final))
    except (ValueError, TypeError, KeyError) as e:  # a config that is JSON but not PEFT's
        raise LaunchError(f"{final / ADAPTER_CONFIG} is not a PEFT adapter config PEFT can read ({e}).") from None
    given = base is not None
    base = base or config.base_model_name_or_path
    try:
        model = AutoModelForCausalLM.from_pretrained(base, revision=config.revision, dtype="auto")
    except (OSError, ValueError) as e:  # ValueError: a folder that is no model, a name that is no Hub id
        if given:
            raise LaunchError(f"The base model {base} (given with --base) cannot be loaded ({e}). Give --base the "
                              "folder or Hub id of the model the adapter was trained on, or leave it out to use the "
                              f"one {final / ADAPTER_CONFIG} names ({config.base_model_name_or_path}).") from None
        raise LaunchError(f"The base model {base} (named in {final / ADAPTER_CONFIG}) cannot be loaded ({e}). Pass "
                          "--base with the folder or Hub id of the model the adapter was trained on.") from None
    try:
        merged = PeftModel.from_pretrained(model, str(final)).merge_and_unload()
    except RuntimeError as e:
        if "size mismatch" not in str(e):
            raise
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), "")
        raise LaunchError(
            f"The adapter in {final} does not fit the base {base}: its weights have another model's shapes ({first}). "
            + ("That base was given with --base. " if given else f"That base is the one {ADAPTER_CONFIG} names. ")
            + "An adapter merges only into the base it was trained on (the run's model_name_or_path, recorded in its "
            "output folder's .launch/manifest.json): pass --base with that model's folder or Hub id.") from None
    interrupt.writing()  # from here a Ctrl-C raises, so that the finally below removes the half-written model
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(final)).save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty (checked)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base
