"""One-GPU check: environment, synthetic throughput and memory against the planner, and ALST's longest length.

Runs the launcher as a user would (`python -m launch ...` subprocesses, from the repository root) and writes one
Markdown report to benchmarks/results/<gpu>-<date>.md (and the raw rows as .json next to it), rewritten after the
doctor and after every row: a check stopped by a time limit keeps what finished, and lists the rows it had not run.
Needs no network: the models are the config.json files of docs/model_configs/ (synthetic runs: random weights,
random tokens), and no run tracks or saves anything (`TRAINING_ARGS`).

    python benchmarks/gpu/check.py --quick              # doctor and 7 rows, at most 8 minutes (--budget-s 480)
    python benchmarks/gpu/check.py                      # everything (hours with the ALST search, see README.md)
    python benchmarks/gpu/check.py --only doctor,throughput --models Qwen3-0.6B,Qwen3-1.7B --budget-s 540
    python benchmarks/gpu/check.py --only alst --alst-timeout 540
    python benchmarks/gpu/check.py --cpu --tiny          # CPU, a tiny config, ddp and zero3, 2 steps: end to end

Sections (`--only`):
- doctor: `python -m launch doctor`;
- throughput: the rows of `ROWS` (a model of docs/model_configs/, a recipe, a max_length, and launcher options
  beyond the defaults; one line each), most informative first, one process each: `python -m launch RECIPE
  --num-processes 1 --bench ...` on synthetic inputs, 2 warm-up + 10 measured steps (--quick: + 6). `--quick` runs
  the `QUICK` rows; --models, --recipes and --lengths keep the rows that match. The recipes (`RECIPES`) are the
  layouts that mean something on one GPU: ddp (one process: Accelerate wraps nothing, the baseline), zero3
  (DeepSpeed's engine wraps), fsdp2 (fully_shard wraps, a shard group of one) and lora (DDP layout, a LoRA adapter).
  Each row says its recipe and layout, what the rank ran (attention implementation and the SDPA backend its
  dispatcher picked, checkpointing mode, Liger; `launch.rank.measure.run_setup`), the median and min-max of the
  per-step time and tokens/s per GPU, MFU in both conventions, peak memory against the planner, and the published
  figure it is set against (`PUBLISHED`: a published figure, with its public source and its convention; "none
  published" where there is none). A run the planner predicts does not fit is refused by the launcher and reported
  as such (`--force` runs it anyway);
- alst: Llama-3.1-8B's architecture on alst-ulysses-8gpu with one process and sp 1 (ZeRO-3 with the optimizer in
  host memory, tiled MLP, checkpoint offload): `python -m launch bench ... --max-length auto` searches the longest
  length that trains, beside ALST's published 500K tokens on one H100 and the planner's figure (`python -m launch
  plan ... --json`). On CPU the search is replaced by the planner's figure and a `--dry-run` (said in the report).

`--budget-s S`: the check's wall time from its start. A row starts only when its estimate (`Budget.estimate`: the
start-up and the speed measured by this check's earlier rows, the row's FLOPs per step) fits the time left; a row
that starts is stopped at the end of the budget; the rows not started are in the report, "skipped", with the time
they needed (and the reserve kept to stop a run).

Bad input is refused before anything is written (exit 2): an unknown section, model, recipe or length (the message
names the valid ones), a budget or timeout that is not a positive number (`nan`, `inf`, 0). Ctrl-C stops the launcher
run in progress through its own stop sequence (SIGINT to its process group; after STOP_WAIT_S a second SIGINT, which
makes it kill its ranks at once; then SIGKILL), writes the report with what finished, removes the temporary folder
of the runs and exits 130, in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from launch.memory.architecture import Architecture  # noqa: E402 - a config.json read as the planner reads it
from launch.rank import run_files  # noqa: E402 - names only (where a run's rank files lie); imports nothing
from launch.recipe.discovery import find_recipe  # noqa: E402 - a recipe's config.yaml (yaml only)
from launch.run.supervise import GRACE_SECONDS  # noqa: E402 - how long the launcher lets its ranks stop
from launch.speed.measured import flops_params, flops_per_token  # noqa: E402 - the MFU formulas the rows use

CONFIGS = REPO / "docs" / "model_configs"
RESULTS = REPO / "benchmarks" / "results"
MODELS = {"Qwen3-0.6B": "Qwen--Qwen3-0.6B", "Qwen3-1.7B": "Qwen--Qwen3-1.7B", "Qwen3-4B": "Qwen--Qwen3-4B",
          "Qwen3-8B": "Qwen--Qwen3-8B"}
ALST_MODEL = "meta-llama--Llama-3.1-8B-Instruct"
ALST_RECIPE = "alst-ulysses-8gpu"
ALST_PUBLISHED = (500_000, "ALST (arXiv 2506.13996): Llama-3.1-8B, 500K tokens on 1 H100 80GB")
# The throughput section's recipes: on GPU every layout that wraps the model on one GPU, beside ddp (which at one
# process Accelerate does not wrap: the unwrapped baseline). --tiny keeps the two that prove the script end to end on
# CPU (a plain and a DeepSpeed-wrapped run; fsdp2 and lora add no code path of this script), so CI does not grow.
RECIPES = ("ddp", "zero3", "fsdp2", "lora")
TINY_RECIPES = ("ddp", "zero3")
LENGTHS = (2048, 8192)
FULL_FINE_TUNES = {"ddp", "zero3", "fsdp2"}
# Every run of this check trains random weights on random tokens to measure them: nothing is tracked (trackio may
# be absent on a GPU machine) and nothing is saved. The one place the check sets training arguments of its own.
TRAINING_ARGS = ["--report_to", "none", "--save_strategy", "no"]


@dataclass(frozen=True)
class Row:
    """One throughput row: a model of MODELS (or "tiny"), a recipe, a max_length, and launcher options beyond the
    check's own (e.g. a faster variant of the same row: one more line in QUICK or ROWS); `training`: training
    arguments of its own after `--`, and `variant`: what they are, in a few words (the report's label)."""

    model: str
    recipe: str
    max_length: int
    options: tuple[str, ...] = ()
    training: tuple[str, ...] = ()
    variant: str = ""

    @property
    def label(self) -> str:
        return " ".join([self.recipe, *self.options] + ([f"({self.variant})"] if self.variant else []))


# The speed settings the H100 rows of launch/facts/calibration.py (MEASURED_ROWS; reports in benchmarks/results/) were
# measured with: activation checkpointing on, Liger off, each recipe's batch layout then, which the recipes' GPU
# defaults no longer use (`plan --fastest` chose others): pinned, so that these rows stay comparable with the measured
# ones. fsdp2 checkpointed FSDP's way then (an Accelerate setting no training argument reaches); transformers' way
# here: the same recomputation.
AS_MEASURED = ("--activation_checkpointing", "true", "--use_liger_kernel", "false")

# --quick, in this order: one row per recipe family at one size, three of them the rows measured on an H100 before
# (calibration.py's MEASURED_ROWS: Qwen3-1.7B ddp 2K, Qwen3-4B fsdp2 4K, Qwen3-8B lora 4K, so a new GPU or stack is
# set against a known figure at once), each followed by the same row with `--fastest` (the speed settings the
# planner and the throughput model choose for this GPU: the speed-up measured, not predicted), and the two set
# against a published one-H100 figure (`PUBLISHED`: NeMo's 8B LoRA at 4K, the Ulysses blog's Qwen3-4B ZeRO-3 at 8K).
QUICK = [
    Row("Qwen3-1.7B", "ddp", 2048, training=AS_MEASURED, variant="as measured"),
    Row("Qwen3-1.7B", "ddp", 2048, ("--fastest",)),
    Row("Qwen3-4B", "fsdp2", 4096, training=AS_MEASURED, variant="as measured"),
    Row("Qwen3-4B", "fsdp2", 4096, ("--fastest",)),
    Row("Qwen3-8B", "lora", 4096, training=AS_MEASURED + ("--per_device_train_batch_size", "2",
                                                          "--gradient_accumulation_steps", "2"), variant="as measured"),
    Row("Qwen3-8B", "lora", 4096, ("--fastest",)),
    Row("Qwen3-4B", "zero3", 8192),
]


def ordered(rows: list[Row]) -> list[Row]:
    """The rows in the order they run, each once: the QUICK rows first (their order), then the rows set against a
    published figure, then the rest, each group in the given order (smaller models first: cheaper)."""
    unique = list(dict.fromkeys(rows))
    return sorted(unique, key=lambda r: (0 if r in QUICK else 1 if published(r.model, r.recipe, r.max_length) else 2,
                                         QUICK.index(r) if r in QUICK else 0))


# Everything: the QUICK rows, then every model x length x recipe of the one-GPU layouts.
ROWS = QUICK + [Row(model, recipe, length) for model in MODELS for length in LENGTHS for recipe in RECIPES]
_FOUNDRY = ("llm-foundry's {size} model, bf16, 8 x H100, FSDP (github.com/mosaicml/llm-foundry, "
            "scripts/train/benchmarking/README.md); another model of the nearest published size, on 8 GPUs")
# The published figure each throughput row is set against: (models, recipes, max_length, kind, value, source), ONLY
# published figures, each with its public source in `source` (printed under the report's table). kind "mfu": a
# non-causal MFU (torchtitan's convention), set against our "MFU non-causal" column; "tokens/s": tokens per second
# per GPU, against our tokens/s/GPU column.
# A row no entry matches prints "none published".
PUBLISHED = [
    ({"Qwen3-1.7B"}, FULL_FINE_TUNES, 2048, "mfu", 0.418, _FOUNDRY.format(size="1B")),
    ({"Qwen3-1.7B"}, FULL_FINE_TUNES, 8192, "mfu", 0.377, _FOUNDRY.format(size="1B")),
    ({"Qwen3-4B"}, {"zero3"}, 8192, "tokens/s", 2436, "Hugging Face Ulysses blog: Qwen3-4B, 1 x H100 80GB at 8K, "
     "ZeRO-3 + gradient checkpointing + FA2, 76.4 GB (huggingface.co/blog/ulysses-sp; its text says CPU optimizer "
     "offload, its numbers imply the optimizer on the GPU)"),
    ({"Qwen3-4B"}, {"ddp", "fsdp2"}, 8192, "mfu", 0.403, _FOUNDRY.format(size="3B")),
    ({"Qwen3-8B"}, FULL_FINE_TUNES, 2048, "mfu", 0.464, _FOUNDRY.format(size="7B")),
    ({"Qwen3-8B"}, FULL_FINE_TUNES, 8192, "mfu", 0.371, _FOUNDRY.format(size="7B")),
    ({"Qwen3-8B"}, {"lora"}, 4096, "tokens/s", 12473, "NeMo Automodel performance summary: Llama-3-8B LoRA, 1 x H100 "
     "at 4,096 tokens, 402 TFLOP/s (docs.nvidia.com/nemo/automodel, Performance Summary); another 8B model"),
]
PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "trl", "datasets", "flash-attn", "kernels")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# The tiny model of --tiny: the smoke model's shape (Qwen3, 4 query and 2 KV heads), a vocabulary of 256
TINY_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "max_position_embeddings": 4096, "vocab_size": 256, "tie_word_embeddings": True,
               "rope_theta": 1000000.0, "torch_dtype": "bfloat16"}

def synthetic(model_dir: Path) -> tuple[list[str], list[str]]:
    """(launcher options, training arguments after `--`) of a synthetic run of the model in model_dir."""
    return ["--synthetic", "--model", str(model_dir)], list(TRAINING_ARGS)


# ---- running the launcher -------------------------------------------------------------------------------------------
# After SIGTERM the launcher stops its ranks within GRACE_SECONDS (then SIGKILLs them); it gets 10 s more to exit.
STOP_WAIT_S = GRACE_SECONDS + 10


def launch(args: list[str], timeout: float, echo=None) -> tuple[int | None, str, float]:
    """`python -m launch ARGS` from the repository root: (exit status or None on timeout, output, seconds). Output
    is passed line by line to `echo` (e.g. print) as it comes. On Ctrl-C (KeyboardInterrupt) the launcher is stopped
    through its own stop sequence (`_interrupt`) before the KeyboardInterrupt goes on."""
    import threading

    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "launch", *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **OFFLINE},
                            start_new_session=True)
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if echo:
                echo(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        rc = None
    except KeyboardInterrupt:
        _interrupt(proc)
        reader.join(timeout=10)
        raise
    reader.join(timeout=10)
    return rc, "".join(lines), time.monotonic() - started


HURRY_WAIT_S = 10  # after the second SIGINT the launcher SIGKILLs its ranks at once; this long for it to exit


def _interrupt(proc: subprocess.Popen, waits: tuple[float, float] = (STOP_WAIT_S, HURRY_WAIT_S)) -> None:
    """Ctrl-C during a launcher run: the launcher's own stop sequence. SIGINT to its process group (it started in a
    session of its own, so the terminal's Ctrl-C did not reach it): it stops its ranks, writes its summary and exits
    130, within STOP_WAIT_S; then a second SIGINT (it SIGKILLs its ranks at once), HURRY_WAIT_S; then SIGKILL to the
    group. A further Ctrl-C meanwhile goes on to the next step at once instead of raising."""
    hurry: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda *_: hurry.append(1))
    try:
        for sig, wait in ((signal.SIGINT, waits[0]), (signal.SIGINT, waits[1]), (signal.SIGKILL, None)):
            if proc.poll() is not None:
                return
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            if wait is None:
                proc.wait()
                return
            hurry.clear()
            deadline = time.monotonic() + wait
            while proc.poll() is None and time.monotonic() < deadline and not hurry:
                time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher (it stops its ranks), SIGKILL to its process group after STOP_WAIT_S."""
    try:
        proc.terminate()
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def last_lines(text: str, n: int = 3) -> str:
    keep = [ln.strip() for ln in text.splitlines() if ln.strip() and "Warning" not in ln and "return func" not in ln]
    return " / ".join(keep[-n:])


# ---- environment ----------------------------------------------------------------------------------------------------
def environment(cpu: bool) -> dict:
    env = {"date": dt.date.today().isoformat(), "host": os.uname().nodename, "python": sys.version.split()[0],
           "versions": {}}
    for name in PACKAGES:
        try:
            env["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env["versions"][name] = None
    env["cuda"] = env["cudnn"] = env["gpu"] = None
    if not cpu:
        probe = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps([torch.version.cuda, "
                                "torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None]))"],
                               capture_output=True, text=True)
        env["cuda"], env["cudnn"] = json.loads(probe.stdout) if probe.returncode == 0 else (None, None)
    if not cpu and shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,memory.total",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True)
        if q.returncode == 0 and q.stdout.strip():
            name, driver, power, mem = [x.strip() for x in q.stdout.strip().splitlines()[0].split(",")]
            env["gpu"] = {"name": name, "driver": driver, "power_limit_w": power, "memory_mib": mem,
                          "count": len(q.stdout.strip().splitlines())}
    return env


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---- sections -------------------------------------------------------------------------------------------------------
def run_doctor(cpu: bool, timeout: float) -> dict:
    rc, out, secs = launch(["doctor"] + (["--cpu"] if cpu else []), timeout)
    problems = [ln.strip() for ln in out.splitlines() if "PROBLEM" in ln or ln.strip().startswith("problem")]
    return {"rc": rc, "seconds": round(secs, 1), "problems": problems, "tail": last_lines(out, 4)}


def _figure(bench: dict, what: str, measured_key: str, legacy_key: str | None):
    """(measured, predicted, ratio) of one memory figure: from the launcher's memory_vs_plan rows when it has them,
    else from the older run_summary fields."""
    for row in bench.get("memory_vs_plan") or []:
        if row["what"] == what:
            return row["measured_gib"], row["predicted_gib"], row["ratio"]
    measured = (bench.get("overall") or {}).get(measured_key)
    predicted = (bench.get("predicted") or {}).get(legacy_key) if legacy_key else None
    return measured, predicted, (measured / predicted if measured and predicted else None)


def row_folder(row: Row) -> str:
    variant = " ".join([*row.options, row.variant]).strip()
    return f"{row.recipe}-{slug(row.model)}-{row.max_length}" + (f"-{slug(variant)}" if variant else "")


def run_throughput(spec: Row, model_dir: Path, a, work: Path, timeout: float | None = None) -> dict:
    """One row: the launcher run, then what its run_summary.json says. timeout: this run's (default --timeout)."""
    model, recipe, length = spec.model, spec.recipe, spec.max_length
    timeout = a.timeout if timeout is None else timeout
    out = work / row_folder(spec)
    options, training = synthetic(model_dir)
    args = [recipe, "--num-processes", "1", "--output-dir", out, "--overwrite", "--bench", "--bench-warmup",
            a.warmup, "--bench-steps", a.steps, *options, *spec.options]
    args += ["--cpu"] if a.cpu else []
    args += ["--force"] if a.force else []
    args += ["--", *training, "--max_length", length, "--logging_steps", "1", *spec.training]
    if a.batch:
        args += ["--per_device_train_batch_size", a.batch]
    rc, text, secs = launch(args, timeout, echo=print if a.verbose else None)
    row = {"model": model, "recipe": recipe, "max_length": length, "options": list(spec.options),
           "variant": spec.variant, "label": spec.label, "rc": rc,
           "seconds": round(secs, 1), "command": "python -m launch " + " ".join(map(str, args))}
    summary_path = out / "run_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() and rc is not None else {}
    bench = summary.get("bench") or {}
    o = bench.get("overall") or {}
    row["tied_embeddings"] = json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings")
    row["published"] = published(model, recipe, length)
    if rc == 0 and o:
        row.update(result="trains", tokens_per_s_per_gpu=o.get("tokens_per_s_per_gpu"), mfu=o.get("mfu"),
                   mfu_causal=o.get("mfu_causal"), step_s=o.get("step_time_s_mean"), mfu_note=o.get("mfu_note"),
                   tokens_per_step=_tokens_per_step(bench), timing=o.get("timing"), spread=spread(bench),
                   setup=rank_setup(out), layout=layout(summary))
        gpu = o.get("device") != "cpu"
        figures = ([("peak allocated (torch)", "peak_allocated_gib", "gpu_allocated_peak_gib"),
                    ("peak reserved (torch)", "peak_reserved_gib", None),
                    ("device memory in use (driver)", "device_used_gib", "gpu_peak_gib")] if gpu else
                   [("peak RSS per process", "peak_rss_gib_per_process", "cpu_rss_gib")])
        row["memory"] = {what: _figure(bench, what, key, legacy) for what, key, legacy in figures}
    elif rc is None:
        row["result"] = f"timed out after {timeout:.0f} s" + (" (the end of --budget-s)" if timeout < a.timeout else "")
    elif any(m in text for m in ("OutOfMemoryError", "CUDA out of memory")):
        row["result"] = "out of memory"
    elif m := REFUSED.search(text):
        row["result"] = f"refused: the planner predicts {m.group(1)} GiB, the GPU has {m.group(2)} (--force runs it)"
    else:
        row["result"] = f"failed (exit {rc}): {last_lines(text, 2)}"
    return row


def spread(bench: dict) -> dict | None:
    """Median, min and max of the per-step time and tokens/s per GPU over the measured steps (the bench's per_step
    rows; exact per step under --bench, which synchronises every step)."""
    steps = bench.get("per_step") or []
    if not steps:
        return None
    out = {"steps": len(steps)}
    for key, name in (("time_s", "step_s"), ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu")):
        values = sorted(s[key] for s in steps)
        out[name] = {"median": statistics.median(values), "min": values[0], "max": values[-1]}
    return out


def rank_setup(out: Path) -> dict | None:
    """What rank 0 recorded it ran (`launch.rank.measure.run_setup`): attention, SDPA backend, checkpointing, Liger,
    adapter. None when the rank wrote no setup."""
    path = out / run_files.META / run_files.MONITOR / run_files.BENCH / run_files.rank_file(0)
    try:
        return json.loads(path.read_text()).get("setup")
    except (OSError, json.JSONDecodeError):
        return None


def layout(summary: dict) -> str | None:
    """The run's layout as the launcher resolved it: strategy and process count."""
    lay = summary.get("layout") or {}
    if not lay.get("strategy"):
        return None
    n = lay.get("world_size")
    text = f"{lay['strategy']}, {n} process" + ("es" if n != 1 else "")
    if lay.get("kind") == "ddp" and n == 1:
        text += " (Accelerate wraps nothing)"
    return text


def published(model: str, recipe: str, length: int) -> dict | None:
    """The PUBLISHED entry a row is set against, or None."""
    for models, recipes, at, kind, value, source in PUBLISHED:
        if model in models and recipe in recipes and length == at:
            return {"kind": kind, "value": value, "source": source}
    return None


REFUSED = re.compile(r"The planner predicts ([\d.]+) GiB per GPU and the GPUs here have ([\d.]+) GiB")


def _tokens_per_step(bench: dict) -> float | None:
    steps = bench.get("per_step") or []
    if not steps:
        return None
    s = steps[-1]
    return round(s["tokens_per_s_per_gpu"] * s["time_s"])


def plan_json(recipe: str, model_dir: Path, length: int | str, a, gpus: int = 1, extra: list | None = None) -> dict:
    args = ["plan", recipe, "--gpus", gpus, "--model", model_dir, "--max-length", length, "--json", *(extra or [])]
    if a.gpu_memory:
        args += ["--gpu-memory", a.gpu_memory]
    rc, text, _ = launch(args, 300)
    try:
        start = text.index("{")
        return json.loads(text[start:text.rindex("}") + 1])
    except ValueError:
        return {"error": last_lines(text, 2), "rc": rc}


BENCH_TRY = re.compile(r"\[launch\] bench: ([\d,]+) tokens: (.*)")
BENCH_LONGEST = re.compile(r"longest length that trains here: ([\d,]+) \(planner: ([\d,]+)\)")


def run_alst(model_dir: Path, a, work: Path) -> dict:
    mesh = ["--num-processes", "1", "--sp-size", "1"]
    planner = plan_json(ALST_RECIPE, model_dir, "auto", a, gpus=1, extra=["--sp-size", "1"])
    row = {"recipe": ALST_RECIPE, "model": "Llama-3.1-8B", "planner": planner, "published": ALST_PUBLISHED}
    if a.cpu:
        # No search on CPU: out-of-memory on a GPU is what it looks for. A dry run shows the one-GPU layout is valid.
        tiny, _ = tiny_model(work)
        options, training = synthetic(tiny)
        args = [ALST_RECIPE, *mesh, "--cpu", "--dry-run", "--output-dir", work / "alst-dry", *options, "--",
                *training, "--max_length", 256]
        rc, text, secs = launch(args, a.timeout)
        row.update(mode="cpu: planner's figure and a dry run (no search: it needs a GPU)", rc=rc,
                   seconds=round(secs, 1), dry_run_tail=last_lines(text, 2), command="python -m launch " +
                   " ".join(map(str, args)))
        return row
    options, training = synthetic(model_dir)
    if a.alst_lengths:
        return run_alst_lengths(row, mesh, options, training, a, work)
    args = ["bench", ALST_RECIPE, "--max-length", "auto", *mesh, "--bench-warmup", "0", *options, "--", *training]
    tries = []

    def echo(line):
        if m := BENCH_TRY.search(line):
            tries.append((int(m.group(1).replace(",", "")), m.group(2)))
            print(f"  alst: {line.strip()}", flush=True)

    rc, text, secs = launch(args, a.alst_timeout, echo=echo)
    m = BENCH_LONGEST.search(text)
    trained = [n for n, d in tries if d.startswith("trains")]
    row.update(mode="gpu: python -m launch bench --max-length auto", rc=rc, seconds=round(secs, 1), tries=tries,
               longest=int(m.group(1).replace(",", "")) if m else (max(trained) if trained else None),
               complete=m is not None, command="python -m launch " + " ".join(map(str, args)))
    return row


def run_alst_lengths(row: dict, mesh: list, options: list, training: list, a, work: Path) -> dict:
    """--alst-lengths: one real step at each given length (no search), each within --timeout."""
    tries, longest = [], None
    for length in map(int, a.alst_lengths.split(",")):
        out = work / f"alst-{length}"
        args = [ALST_RECIPE, *mesh, "--output-dir", out, "--overwrite", "--bench", "--bench-warmup", "0",
                "--bench-steps", "1", "--force", *options, "--", *training, "--max_length", length]
        rc, text, secs = launch(args, a.timeout)
        summary = json.loads((out / "run_summary.json").read_text()) if (out / "run_summary.json").is_file() else {}
        o = (summary.get("bench") or {}).get("overall") or {}
        if rc == 0:
            detail = (f"trains ({o.get('step_time_s_mean') or 0:.0f} s/step, {o.get('peak_reserved_gib') or 0:.1f} "
                      f"GiB reserved)")
            longest = max(longest or 0, length)
        elif rc is None:
            detail = f"no step within {a.timeout:.0f} s"
        elif any(m in text for m in ("OutOfMemoryError", "CUDA out of memory")):
            detail = "out of memory"
        else:
            detail = f"failed (exit {rc})"
        tries.append((length, detail))
        print(f"  alst: {length:,} tokens: {detail} ({secs:.0f} s)", flush=True)
    row.update(mode="gpu: one step per length of --alst-lengths (no search)", tries=tries, longest=longest,
               complete=True, rc=0, seconds=None)
    return row


def tiny_model(work: Path) -> tuple[Path, str]:
    folder = work / "tiny-qwen3"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))
    return folder, "tiny Qwen3 (2 layers, hidden 64)"


# ---- which rows, and the time budget -----------------------------------------------------------------------------
def select_rows(a) -> list[Row]:
    """The rows this check runs, in order: --tiny's, --quick's or all, less those --models/--recipes/--lengths leave
    out."""
    rows = [Row("tiny", recipe, 64) for recipe in TINY_RECIPES] if a.tiny else QUICK if a.quick else ROWS
    keep = {"model": a.models, "recipe": a.recipes, "max_length": a.lengths}
    for field, wanted in keep.items():
        if wanted:
            values = {int(v) if field == "max_length" else v.strip() for v in wanted.split(",")}
            rows = [r for r in rows if getattr(r, field) in values]
    return ordered(rows)


def model_dir(row: Row, work: Path) -> Path:
    return tiny_model(work)[0] if row.model == "tiny" else CONFIGS / MODELS[row.model]


def flops_per_step(row: Row, folder: Path, a) -> float:
    """Training FLOPs of one optimizer step of the row (non-causal, as the MFU column): the tokens of a step
    (per_device_train_batch_size x gradient_accumulation_steps x max_length, from the recipe's config.yaml or --batch)
    times the FLOPs per token of the model's config.json (launch.speed.measured)."""
    config = find_recipe(row.recipe).config
    batch = a.batch or int(config.get("per_device_train_batch_size") or 8)  # TRL's default where a recipe sets none
    tokens = batch * int(config.get("gradient_accumulation_steps") or 1) * row.max_length
    arch = Architecture.from_config(json.loads((folder / "config.json").read_text()))
    return tokens * flops_per_token(flops_params(arch), arch.num_layers, arch.num_attention_heads, arch.head_dim,
                                    row.max_length)


# A row's wall time before this check has measured one: the longest launcher run per row on an H100 so far
# (the H100 run of launch/facts/calibration.py, reported in benchmarks/results/: 36-62 s per row, 2 warm-up + 6
# measured steps, 20-37 s of it before the first step).
FIRST_ROW_S = 62


class Budget:
    """--budget-s: the check's wall time, counted from its start. A row starts only when its estimate fits the time
    left; a row that starts gets the time left (less STOP_WAIT_S, the launcher's stop) as its timeout, so the check
    ends within the budget. The estimate is measured, not assumed, once a row has finished: the longest start-up
    (wall time less the row's steps at their measured speed) plus the row's steps at the slowest rate (training
    FLOP/s) measured so far."""

    def __init__(self, seconds: float | None, clock=time.monotonic):
        self.seconds, self.clock, self.start = seconds, clock, clock()
        self.startups: list[float] = []
        self.rates: list[float] = []

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (self.clock() - self.start)

    def estimate(self, row: Row, folder: Path, a) -> float:
        if not self.rates:
            return FIRST_ROW_S
        return max(self.startups) + (a.warmup + a.steps) * flops_per_step(row, folder, a) / min(self.rates)

    def learn(self, row: Row, folder: Path, result: dict, a) -> None:
        """What a finished row measured: its training FLOP/s and its start-up."""
        step_s = ((result.get("spread") or {}).get("step_s") or {}).get("median")
        if result.get("result") != "trains" or not step_s:
            return
        self.rates.append(flops_per_step(row, folder, a) / step_s)
        self.startups.append(max(0.0, result["seconds"] - (a.warmup + a.steps) * step_s))

    def timeout(self, a) -> float:
        """The timeout of the next run: --timeout, or less at the end of the budget."""
        return min(a.timeout, self.left() - STOP_WAIT_S)


PENDING = "not run yet (the check was still running when this report was written)"


def skipped(row: Row, reason: str) -> dict:
    return {"model": row.model, "recipe": row.recipe, "max_length": row.max_length, "options": list(row.options),
            "variant": row.variant, "label": row.label,
            "published": published(row.model, row.recipe, row.max_length), "result": reason}


# ---- the report -----------------------------------------------------------------------------------------------------
def _pct(x) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def _mem(fig) -> str:
    if not fig or fig[0] is None:
        return "-"
    measured, predicted, ratio = fig
    return f"{measured:.1f}" + (f" ({predicted:.1f}, {ratio:.2f})" if predicted else " (-)")


SDPA_BACKENDS = {"CUDNN_ATTENTION": "cuDNN", "FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "memory-efficient",
                 "MATH": "math"}  # torch.nn.attention.SDPBackend names, as the rank records them


def attention(setup: dict | None) -> str:
    """The attention cell: the implementation and, for SDPA, the backend the dispatcher picked in the run."""
    impl = (setup or {}).get("attn_implementation")
    if not impl:
        return "not recorded"
    if impl != "sdpa":
        return impl
    backend = setup.get("sdpa_backend")
    if not backend:
        return "sdpa (backend not recorded)"
    cpu = " (torch's CPU kernel)" if setup.get("sdpa_device") == "cpu" else ""
    return f"sdpa: {SDPA_BACKENDS.get(backend, backend)}{cpu}"


def checkpointing(setup: dict | None) -> str:
    mode = (setup or {}).get("checkpointing")
    if not mode:
        return "not recorded"
    return mode + (f" ({setup['checkpointing_by']})" if setup.get("checkpointing_by") == "FSDP" else "")


def liger(setup: dict | None) -> str:
    on = (setup or {}).get("liger")
    return "not recorded" if on is None else ("on" if on else "off")


def _range(fig: dict | None, fmt: str) -> str:
    if not fig:
        return "-"
    return f"{fig['median']:{fmt}} [{fig['min']:{fmt}}-{fig['max']:{fmt}}]"


def convention(ref: dict, model: str, tied: bool | None) -> str:
    """The convention of a published figure and what it is compared with."""
    if ref["kind"] != "mfu":
        return "tokens per second per GPU, against our tokens/s/GPU column (no FLOP convention involved)"
    tie = ("untied embeddings, so the two conventions are equal" if tied is False else
           "tied embeddings, so they are NOT equal: our N also counts the LM head matmul, which torchtitan's N (all "
           "parameters less the embedding table, the shared matrix counted once) leaves out, and our column reads "
           "higher" if tied else "tie_word_embeddings unknown, so whether they are equal is not known")
    return ("non-causal MFU (torchtitan's convention: 6N + 12·L·H·d·S FLOPs per token), against our MFU non-causal "
            f"column, which equals torchtitan's only for a model with untied embeddings: {model} has {tie}")


def throughput_section(rows: list[dict], a) -> list[str]:
    """The throughput table: one row per run (recipe, layout, what the rank ran, spread, MFU, memory beside the
    planner, the published reference), then the references' sources and conventions."""
    timing = sorted({r["timing"] for r in rows if r.get("timing")})
    lines = ["", f"## Throughput and memory (synthetic inputs, one process, {a.warmup} warm-up + {a.steps} "
                 "measured steps)", "",
             "Step time and tokens/s per GPU: median [min-max] over the measured steps (bench timing: "
             + ("; ".join(timing) or "not recorded") + "). Memory cells: measured GiB (planner's prediction, "
             "measured / predicted). MFU from the synchronised total, against the GPU's dense BF16 peak; non-causal = "
             "6N + 12·L·H·d·S FLOPs per token (torchtitan, llm-foundry), causal = 6N + 6·L·H·d·S (TRL PR #6846); "
             "recomputation not counted. Attention: the model's implementation and, for SDPA, the backend its "
             "dispatcher picked for the run's first attention call. Checkpointing and Liger: the rank's resolved "
             "training arguments (FSDP: Accelerate's plugin).", ""]
    if any(r.get("memory", {}).get("peak RSS per process") for r in rows):
        mem_head, keys = "peak RSS per process |", ["peak RSS per process"]
    else:
        mem_head = "peak allocated | peak reserved | device in use |"
        keys = ["peak allocated (torch)", "peak reserved (torch)", "device memory in use (driver)"]
    head = ("| model | recipe | layout | attention | checkpointing | Liger | max_length | tokens/step | "
            "step (s) median [min-max] | tokens/s/GPU median [min-max] | MFU non-causal | MFU causal | " + mem_head
            + " published reference | result |")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    notes: list[str] = []
    for r in rows:
        mem = r.get("memory") or {}
        tokens = f"{r['tokens_per_step']:,}" if r.get("tokens_per_step") else "-"
        sp = r.get("spread") or {}
        setup = r.get("setup")
        lay = r.get("layout") or "-"
        if (setup or {}).get("adapter"):
            lay += f" + {setup['adapter']} adapter"
        ref = r.get("published")
        if ref:
            note = f"{ref['source']}; convention: {convention(ref, r['model'], r.get('tied_embeddings'))}."
            if note not in notes:
                notes.append(note)
            figure = f"{100 * ref['value']:.1f}% MFU non-causal" if ref["kind"] == "mfu" else \
                f"{ref['value']:,} tokens/s/GPU"
            cell = f"{figure} [{notes.index(note) + 1}]"
        else:
            cell = "none published"
        recipe = r.get("label") or " ".join([r["recipe"], *r.get("options", [])])
        cells = [r["model"], recipe, lay, attention(setup), checkpointing(setup), liger(setup),
                 f"{r['max_length']:,}", tokens, _range(sp.get("step_s"), ".3f"),
                 _range(sp.get("tokens_per_s_per_gpu"), ",.0f"), _pct(r.get("mfu")), _pct(r.get("mfu_causal")),
                 *(_mem(mem.get(k)) for k in keys), cell, r["result"]]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "Published references (each with its public source; \"none published\": none is known for that "
                      "model, recipe and length):"] + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    mfu_notes = {r["mfu_note"] for r in rows if r.get("mfu_note")}
    lines += [""] + [f"MFU not given: {n}." for n in sorted(mfu_notes)] if mfu_notes else []
    return lines


def markdown(env: dict, doctor: dict | None, rows: list[dict], alst: dict | None, a, argv: list[str],
             budget: dict | None = None) -> str:
    gpu = env["gpu"]
    title = gpu["name"] if gpu else "CPU (no GPU: the script's own check, no GPU figures)"
    v = env["versions"]
    lines = [f"# One-GPU check: {title}, {env['date']}", ""]
    if gpu:
        lines.append(f"GPU: {gpu['name']} x{gpu['count']} ({gpu['memory_mib']} MiB, power limit "
                     f"{gpu['power_limit_w']} W), driver {gpu['driver']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}.")
    lines.append("Versions: python " + env["python"] + ", " + ", ".join(f"{k} {v[k]}" for k in PACKAGES if v.get(k))
                 + ("; not installed: " + ", ".join(k for k in PACKAGES if not v.get(k)) if not all(v.values()) else "")
                 + ".")
    lines.append(f"Command: `python benchmarks/gpu/check.py {' '.join(argv)}` (host {env['host']}).")
    if budget:
        lines.append(f"Budget: {budget['seconds']:.0f} s (--budget-s); {budget['used']:.0f} s used"
                     + (f"; {budget['skipped']} row(s) not started: the time left was shorter than their estimate"
                        if budget["skipped"] else "") + ".")
    if doctor:
        lines.append(f"Doctor (`python -m launch doctor`): exit {doctor['rc']}"
                     + (f"; problems: {'; '.join(doctor['problems'])}" if doctor["problems"] else "; no problems"))
    if rows:
        lines += throughput_section(rows, a)
    if alst and alst.get("skipped"):
        lines += ["", f"## Longest length on one GPU (ALST setup): {alst['skipped']}"]
    elif alst:
        p = alst["planner"]
        lines += ["", "## Longest length on one GPU (ALST setup: Llama-3.1-8B architecture, alst-ulysses-8gpu with 1 "
                      "process and sp 1: ZeRO-3 with the optimizer in host memory, tiled MLP, checkpoint offload)", "",
                  "| source | longest max_length | note |", "|---|---|---|",
                  f"| published | {ALST_PUBLISHED[0]:,} | {ALST_PUBLISHED[1]} |"]
        if "max_length" in p:
            lines.append(f"| planner (`python -m launch plan {ALST_RECIPE} --gpus 1 --sp-size 1 --max-length auto "
                         f"--json`) | {p['max_length']:,} | {p['gpu_peak_gib']:.1f} GiB per GPU predicted, "
                         f"{p['host_peak_gib']:.0f} GiB host, target {p['target']['gpu_memory_gib']} GiB GPU |")
        else:
            lines.append(f"| planner | - | {p.get('error')} |")
        if alst["mode"].startswith("cpu"):
            lines.append(f"| measured | - | not searched on CPU (out-of-memory on a GPU is what the search looks "
                         f"for); `--dry-run` of the one-GPU layout on the tiny model: exit {alst['rc']} |")
        else:
            tries = ", ".join(f"{n:,} {d}" for n, d in alst["tries"]) or "none finished"
            state = "" if alst["complete"] else f" (search stopped after {alst['seconds']:.0f} s: --alst-timeout)"
            longest = f"{alst['longest']:,}" if alst["longest"] else "-"
            how = "--alst-lengths" if alst["mode"].startswith("gpu: one step") else "`python -m launch bench ... " \
                "--max-length auto`"
            lines.append(f"| measured ({how}) | {longest} | tries: {tries}{state} |")
    return "\n".join(lines) + "\n"


# ---- main -----------------------------------------------------------------------------------------------------------
QUICK_BUDGET_S = 480  # --quick's default --budget-s: 8 minutes (README.md: the estimate it is set from)
QUICK_STEPS = 6  # --quick's measured steps: as the H100 rows measured before (calibration.py: 2 warm-up + 6)


SECTIONS = ("doctor", "throughput", "alst")


def _positive(text: str) -> float:
    """An argparse type: a finite number above 0 (`float` alone takes nan, inf and negatives)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number above 0")
    return value


def _count(least: int):
    """An argparse type: an integer of at least `least`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: give at least {least}")
        return value
    return parse


def _names(p, option: str, text: str, valid) -> list[str]:
    """The comma-separated names of `option`, each one of `valid`; else argparse's error (exit 2), naming them."""
    names = [n.strip() for n in text.split(",")]
    valid = [str(v) for v in valid]
    if unknown := [n for n in names if n not in valid]:
        p.error(f"{option} {text}: unknown {', '.join(repr(n) for n in unknown)}; valid: {', '.join(valid)}")
    return names


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="run on CPU (with --tiny: the script's own end-to-end check)")
    p.add_argument("--tiny", action="store_true", help="a tiny model config instead of the Qwen3 ones, ddp and "
                   "zero3, 2 measured steps (no warm-up), 64 tokens")
    p.add_argument("--quick", action="store_true", help=f"doctor and the QUICK rows ({len(QUICK)}), 2 warm-up + "
                   f"{QUICK_STEPS} measured steps, within --budget-s (default {QUICK_BUDGET_S})")
    p.add_argument("--only", help="sections, comma-separated (default doctor,throughput,alst; --quick: "
                   "doctor,throughput)")
    p.add_argument("--models", help="only the rows of these models, of " + ", ".join(MODELS))
    p.add_argument("--lengths", help="only the rows of these max_length values (comma-separated)")
    p.add_argument("--recipes", help=f"only the rows of these recipes (default {','.join(RECIPES)}; with --tiny "
                   f"{','.join(TINY_RECIPES)})")
    p.add_argument("--warmup", type=_count(0), help="warm-up steps per run (not measured; default 2)")
    p.add_argument("--steps", type=_count(1), help=f"measured steps per run (median and min-max reported; default 10, "
                   f"--quick {QUICK_STEPS})")
    p.add_argument("--batch", type=_count(1), help="per_device_train_batch_size (default: the recipe's)")
    p.add_argument("--force", action="store_true", help="run also what the planner predicts does not fit")
    p.add_argument("--gpu-memory", type=_positive, help="plan for this GPU memory in GiB (default: the "
                   "planner's 79.1)")
    p.add_argument("--timeout", type=_positive, default=600, help="seconds per launcher run")
    p.add_argument("--budget-s", type=_positive, help="wall seconds for the whole check: rows whose estimate does "
                   "not fit the time left are not started (the report lists them); default none, --quick "
                   f"{QUICK_BUDGET_S}")
    p.add_argument("--alst-timeout", type=_positive, default=4 * 3600,
                   help="seconds for the whole ALST search")
    p.add_argument("--alst-lengths", help="instead of the search: one step at each of these lengths (comma-"
                   "separated), each within --timeout")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the report")
    p.add_argument("--work", type=Path, help="folder of the runs (default: a temporary one, removed)")
    p.add_argument("--verbose", action="store_true", help="stream the runs' output")
    a = p.parse_args(argv)
    a.only = a.only or ("doctor,throughput" if a.quick else "doctor,throughput,alst")
    # names are refused here, before anything is written: a typo would otherwise select nothing and run nothing
    _names(p, "--only", a.only, SECTIONS)
    if a.models:
        _names(p, "--models", a.models, [*MODELS, *(["tiny"] if a.tiny else [])])
    if a.recipes:
        _names(p, "--recipes", a.recipes, TINY_RECIPES if a.tiny else RECIPES)
    if a.lengths:
        _names(p, "--lengths", a.lengths, [64] if a.tiny else sorted({r.max_length for r in ROWS}))
    if a.alst_lengths:
        for n in a.alst_lengths.split(","):
            try:
                _count(1)(n.strip())
            except argparse.ArgumentTypeError as e:
                p.error(f"--alst-lengths {a.alst_lengths}: {e}")
    a.warmup = 2 if a.warmup is None else a.warmup
    a.steps = a.steps if a.steps is not None else QUICK_STEPS if a.quick else 10
    if a.quick and a.budget_s is None:
        a.budget_s = QUICK_BUDGET_S
    if a.budget_s is not None and a.budget_s <= STOP_WAIT_S:
        p.error(f"--budget-s {a.budget_s:g}: a run needs up to {STOP_WAIT_S} s to stop; give more")
    if a.tiny:
        # 2 steps as before this check had a spread (then 1 warm-up + 1), both measured: a median and a range at
        # no extra cost (a ZeRO-3 step of the tiny model takes about 1 s on the loaded 2-core CI machine)
        a.warmup, a.steps = 0, 2
    return a


class Report:
    """The report, rewritten (Markdown and JSON) after the doctor and after every row: what finished, what was
    skipped, and the rows not run yet, so that a check stopped from outside keeps its rows."""

    def __init__(self, a, argv: list[str], env: dict, budget: Budget):
        self.a, self.argv, self.env, self.budget = a, argv, env, budget
        name = (slug(env["gpu"]["name"]) if env["gpu"] else "cpu" + ("-tiny" if a.tiny else "")) + f"-{env['date']}"
        a.out.mkdir(parents=True, exist_ok=True)
        self.md, self.json = a.out / f"{name}.md", a.out / f"{name}.json"
        self.doctor = self.alst = None
        self.rows: list[dict] = []
        self.pending: list[Row] = []  # the rows not finished yet, the one running first
        self.running: Row | None = None  # the row whose launcher run is in progress
        self.alst_pending = False  # the ALST section is asked for and has not finished
        self.writes = 0

    def budget_facts(self) -> dict | None:
        if self.budget.seconds is None:
            return None
        return {"seconds": self.budget.seconds, "used": round(self.budget.seconds - self.budget.left(), 1),
                "skipped": sum(1 for r in self.rows if r["result"].startswith("skipped"))}

    def write(self, pending: list[Row] = ()) -> None:
        rows = self.rows + [skipped(row, PENDING) for row in pending]
        budget = self.budget_facts()
        for path, text in ((self.md, markdown(self.env, self.doctor, rows, self.alst, self.a, self.argv, budget)),
                           (self.json, json.dumps({"environment": self.env, "doctor": self.doctor, "throughput": rows,
                                                   "alst": self.alst, "budget": budget, "argv": self.argv},
                                                  indent=2, default=str) + "\n")):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)  # never a half-written report
        self.writes += 1
        print(f"[check] report: {self.md} ({len(self.rows)} of {len(rows)} rows)", flush=True)

    def interrupted(self) -> None:
        """After a Ctrl-C: the report with what finished, every row not finished (the one running included) and the
        ALST section, if it had not run, marked as not run."""
        self.rows += [skipped(row, STOPPED if row == self.running else INTERRUPTED) for row in self.pending]
        self.pending, self.running = [], None
        if self.alst_pending:
            self.alst, self.alst_pending = {"skipped": INTERRUPTED}, False
        self.write()


INTERRUPTED = "not run: the check was interrupted (Ctrl-C)"
STOPPED = "stopped by Ctrl-C while it ran (the launcher's own stop: no figures)"


def row_line(spec: Row, row: dict) -> str:
    """The console line of a finished row: its figures when it measured any, else only what happened (a skipped row,
    a refused or failed run, never "0 tokens/s")."""
    head = f"[check] {spec.model} {spec.label} {spec.max_length}: {row['result']}"
    if not row.get("tokens_per_s_per_gpu"):
        return head + (f" ({row['seconds']} s)" if row.get("seconds") is not None else "")
    return (f"{head}, {row['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU {_pct(row.get('mfu'))} non-causal, "
            f"{_pct(row.get('mfu_causal'))} causal ({row.get('seconds', 0)} s)")


def skip_reason(need: float, left: float) -> str:
    """Why a row was not started: its estimate and the reserve kept to stop a run (STOP_WAIT_S) against the time
    left."""
    return f"skipped: about {need:.0f} s needed + {STOP_WAIT_S} s reserve, {max(left, 0):.0f} s of --budget-s left"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    work = report = None
    try:
        a = parse(argv)  # every refusal of bad input comes before anything is written or created
        budget = Budget(a.budget_s)
        only = set(a.only.split(","))
        env = environment(a.cpu)
        if not a.cpu and not env["gpu"]:
            print("no GPU found (nvidia-smi): pass --cpu --tiny to check the script on CPU", file=sys.stderr)
            return 2
        rows = select_rows(a) if "throughput" in only else []
        if "throughput" in only and not rows:
            print("no row matches --models, --recipes and --lengths", file=sys.stderr)
            return 2
        work = a.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
        print(f"[check] {env['gpu']['name'] if env['gpu'] else 'CPU'}; runs in {work}", flush=True)
        report = Report(a, argv, env, budget)
        return run_sections(a, only, rows, budget, work, report)
    except KeyboardInterrupt:
        with _no_ctrl_c():  # the report and the clean-up below are not cut short by another one
            print("\n[check] interrupted (Ctrl-C)" + ("; the report keeps what finished" if report is not None else ""),
                  file=sys.stderr, flush=True)
            if report is not None:
                report.interrupted()
        return 130
    finally:
        if work is not None and a.work is None:
            with _no_ctrl_c():
                shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _no_ctrl_c():
    """Inside: a Ctrl-C is ignored (the check is already writing its report and cleaning up after one)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_sections(a, only: set[str], rows: list[Row], budget: Budget, work: Path, report: Report) -> int:
    report.pending, report.alst_pending = list(rows), "alst" in only
    if "doctor" in only:
        report.doctor = run_doctor(a.cpu, budget.timeout(a))
        print(f"[check] doctor: exit {report.doctor['rc']}", flush=True)
        report.write(rows)
    for i, spec in enumerate(rows):
        report.pending = rows[i:]
        folder = model_dir(spec, work)
        need, left = budget.estimate(spec, folder, a), budget.left()
        if need > left - STOP_WAIT_S:
            row = skipped(spec, skip_reason(need, left))
        else:
            report.running = spec
            row = run_throughput(spec, folder, a, work, timeout=budget.timeout(a))
            report.running = None
            budget.learn(spec, folder, row, a)
        report.rows.append(row)
        report.pending = rows[i + 1:]
        print(row_line(spec, row), flush=True)
        report.write(rows[i + 1:])
    if "alst" in only:
        if budget.left() - STOP_WAIT_S < FIRST_ROW_S:
            report.alst = {"skipped": f"not run: about {FIRST_ROW_S} s needed + {STOP_WAIT_S} s reserve, "
                                      f"{max(budget.left(), 0):.0f} s of --budget-s left"}
        else:
            cap = budget.left() - STOP_WAIT_S  # inf without a budget
            a.alst_timeout, a.timeout = min(a.alst_timeout, cap), min(a.timeout, cap)
            report.alst = run_alst(CONFIGS / ALST_MODEL, a, work)
            print(f"[check] alst: {report.alst['mode']}; planner {report.alst['planner'].get('max_length')}, measured "
                  f"{report.alst.get('longest')}", flush=True)
        report.alst_pending = False
        report.write()
    if not report.writes:
        report.write()
    failed = [r for r in report.rows if r["result"] != "trains" and not r["result"].startswith(("refused", "skipped"))]
    return 1 if failed or (report.doctor and report.doctor["rc"] not in (0,)) else 0


if __name__ == "__main__":
    sys.exit(main())
