"""benchmarks/gpu/check.py end to end on CPU (`--cpu --tiny`: a tiny Qwen3 config, one process, 2 measured steps, 64
tokens; the ALST search replaced by the planner's figure and a dry run), and its report's format for GPU rows, which
this machine cannot produce.

--tiny runs the recipes ddp and zero3 only (`TINY_RECIPES`), not the GPU default's fsdp2 and lora: one run that
Accelerate leaves unwrapped and one that DeepSpeed wraps cover every code path of the script (launch, the rank's
recorded setup, the spread, the memory beside the planner, the report), and each more recipe is a `python -m launch`
subprocess of 30-60 s on the 2-core CI machine. The step count is as before the spread was added (2 steps), so this
test costs what it did (`time` of the tiny check on the loaded 2-core machine: 144 s wall / 44.4 s user before,
83 s wall / 43.5 s user after; the wall time follows the machine's load).

The report is rewritten after the doctor and after every row (a check stopped by a time limit keeps what finished):
the tiny run shows it in its output, and an in-process run with the launcher runs faked (no training) checks the
report on disk while a row runs, the --quick set and order, and that --budget-s stops starting rows that cannot
finish, with a fake clock."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu" / "check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--tiny", "--out", str(root / "results"),
                           "--work", str(root / "work")], cwd=REPO, capture_output=True, text=True, timeout=600)
    return proc, root


@pytest.mark.long
def test_the_tiny_check_runs_end_to_end_on_cpu(tiny_check):
    from launch.memory import Architecture

    proc, root = tiny_check
    check = load_check()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stem = f"cpu-tiny-{dt.date.today().isoformat()}"
    report = (root / "results" / f"{stem}.md").read_text()
    raw = json.loads((root / "results" / f"{stem}.json").read_text())
    # rewritten after the doctor, after each row and after the ALST section
    written = [line.split("(", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[check] report: ")]
    assert written == ["0 of 2 rows)", "1 of 2 rows)", "2 of 2 rows)", "2 of 2 rows)"], proc.stdout[-3000:]
    assert not list(root.glob("results/*.tmp"))
    # environment and doctor
    assert raw["environment"]["versions"]["torch"] and raw["doctor"]["rc"] == 0
    assert "Versions: python" in report and "Doctor (`python -m launch doctor`): exit 0" in report
    # throughput: ddp and ZeRO-3, one process each, through `python -m launch` on synthetic inputs
    rows = {r["recipe"]: r for r in raw["throughput"]}
    assert set(rows) == {"ddp", "zero3"}
    assert rows["ddp"]["layout"] == "DDP, 1 process (Accelerate wraps nothing)"
    assert rows["zero3"]["layout"] == "DeepSpeed ZeRO-3, 1 process"
    for recipe, row in rows.items():
        summary = json.loads((root / "work" / f"{recipe}-tiny-64" / "run_summary.json").read_text())
        # what the rank ran, recorded by the rank: SDPA, and the backend torch's dispatcher picked on CPU
        setup = row["setup"]
        assert setup["attn_implementation"] == "sdpa" and setup["sdpa_device"] == "cpu"
        assert setup["sdpa_backend"] == "FLASH_ATTENTION"  # torch's CPU flash kernel for these unmasked fp32 rows
        recipe_ckpt = "activation_checkpointing: true" in (REPO / "recipes" / recipe / "config.yaml").read_text()
        assert setup["checkpointing"] == ("on" if recipe_ckpt else "off")
        assert setup["liger"] is False and "--use_liger_kernel false" in " ".join(summary["command"])
        assert setup["adapter"] is None
        # spread: median and range of the measured steps, the bench's own per-step figures
        per_step = summary["bench"]["per_step"]
        spread = row["spread"]
        assert spread["steps"] == len(per_step) == 2
        times = sorted(s["time_s"] for s in per_step)
        assert spread["step_s"] == {"median": pytest.approx(sum(times) / 2), "min": times[0], "max": times[1]}
        tps = spread["tokens_per_s_per_gpu"]
        assert 0 < tps["min"] <= tps["median"] <= tps["max"]
        assert row["published"] is None  # nothing is published for a tiny CPU model
        assert (f"| tiny | {recipe} | {row['layout']} | sdpa: flash (torch's CPU kernel) | {setup['checkpointing']} "
                f"| off | 64 | 256 | {spread['step_s']['median']:.3f} [{times[0]:.3f}-{times[1]:.3f}] | "
                f"{tps['median']:,.0f} [{tps['min']:,.0f}-{tps['max']:,.0f}] | - | - |") in report
        assert row["result"] == "trains", row
        assert row["command"].startswith(f"python -m launch {recipe} --num-processes 1")
        assert "--synthetic" in row["command"]
        # nothing tracked, nothing saved (the training arguments the check sets, in one place)
        assert "-- --report_to none --save_strategy no " in row["command"]
        assert not list((root / "work" / f"{recipe}-tiny-64").glob("checkpoint-*"))
        assert row["tokens_per_s_per_gpu"] > 0 and row["tokens_per_step"] == 4 * 64  # 4 rows of exactly 64
        assert row["mfu"] is None and "CPU" in row["mfu_note"]
        measured, predicted, ratio = row["memory"]["peak RSS per process"]
        assert measured > 0 and predicted > 0 and ratio == pytest.approx(measured / predicted)
        assert (root / "work" / f"{recipe}-tiny-64" / "run_summary.json").is_file()
        # a benchmark keeps nothing but its logs and figures (no checkpoint: transformers saves one at the
        # last step with save_strategy steps; no final weights), and reports to no tracker
        folder = root / "work" / f"{recipe}-tiny-64"
        assert summary["saves"] == "nothing" and summary["tracking"] is None
        assert "--save_strategy no" in " ".join(summary["command"]) and "--report_to none" in row["command"]
        assert not [p for p in folder.iterdir() if p.name.startswith("checkpoint-") or p.name == "final"]
        left = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        weights = 4 * Architecture.from_config(check.TINY_CONFIG).num_params  # one fp32 copy of the tiny model
        print(f"{recipe}: the run folder holds {left:,} bytes; the model's fp32 weights alone are {weights:,}")
        assert left < weights, sorted((p.stat().st_size, str(p)) for p in folder.rglob("*") if p.is_file())[-5:]
    assert report.count("| none published | trains |") == 2
    assert "1 process" in report and "0 warm-up + 2 measured steps" in report
    assert "MFU not given: a CPU run has no GPU peak to compare with." in report
    # ALST: no search on CPU, said so; the planner's figure for the real Llama-3.1-8B config on one 80 GB GPU
    alst = raw["alst"]
    assert alst["mode"].startswith("cpu") and alst["rc"] == 0  # the one-GPU layout passes the launcher's checks
    assert 250_000 < alst["planner"]["max_length"] < 1_000_000
    assert "| published | 500,000 |" in report and "not searched on CPU" in report
    assert f"| {alst['planner']['max_length']:,} |" in report


def test_the_check_uses_the_launchers_synthetic_option(tmp_path, capsys):
    """`--synthetic --model DIR`: a folder holding only config.json is enough; the dataset is not looked for; the run
    is marked synthetic (never judged as the recorded one)."""
    from launch.__main__ import main
    from launch.config.options import Options
    from launch.run.resolve import resolve

    check = load_check()
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(check.TINY_CONFIG))
    assert check.synthetic(folder) == (["--synthetic", "--model", str(folder)], check.TRAINING_ARGS)
    rc = main(["zero3", "--smoke", "--cpu", "--synthetic", "--model", str(folder), "--dry-run", "--",
               "--dataset_name", "no/such-dataset"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert f"--model_name_or_path {folder}" in out.out and "--synthetic true" in out.out
    setup = resolve(Options(recipe="zero3", smoke=True, cpu=True, synthetic=True, model=str(folder)),
                    progress=lambda *_: None)
    assert setup.invocation["synthetic"] is True and setup.invocation["model"] == str(folder)


def test_a_gpu_report_shows_mfu_and_memory_beside_the_planner():
    check = load_check()
    env = {"date": "2026-11-24", "host": "h", "python": "3.12.3", "cuda": "13.0", "cudnn": 92000,
           "versions": {k: "1.0" for k in check.PACKAGES},
           "gpu": {"name": "NVIDIA H100 80GB HBM3", "driver": "580.65", "power_limit_w": "700.00",
                   "memory_mib": "81559", "count": 1}}
    row = {"model": "Qwen3-0.6B", "recipe": "ddp", "max_length": 2048, "result": "trains", "tokens_per_step": 8192,
           "step_s": 0.25, "tokens_per_s_per_gpu": 32768.0, "mfu": 0.452, "mfu_causal": 0.421,
           "memory": {"peak allocated (torch)": (20.0, 21.0, 20 / 21), "peak reserved (torch)": (22.0, 21.4, 22 / 21.4),
                      "device memory in use (driver)": (23.0, 21.9, 23 / 21.9)},
           "layout": "DDP, 1 process (Accelerate wraps nothing)",
           "published": check.published("Qwen3-0.6B", "ddp", 2048),
           "setup": {"attn_implementation": "sdpa", "sdpa_backend": "CUDNN_ATTENTION", "sdpa_device": "cuda",
                     "checkpointing": "on", "checkpointing_by": "transformers", "liger": True, "adapter": None},
           "spread": {"steps": 10, "step_s": {"median": 0.25, "min": 0.248, "max": 0.262},
                      "tokens_per_s_per_gpu": {"median": 32768.0, "min": 31268.0, "max": 33032.0}}}
    fsdp = {**row, "model": "Qwen3-1.7B", "recipe": "fsdp2", "layout": "FSDP2, 1 process",
            "published": check.published("Qwen3-1.7B", "fsdp2", 2048), "tied_embeddings": True,
            "setup": {**row["setup"], "sdpa_backend": "FLASH_ATTENTION", "checkpointing": "on + offload",
                      "checkpointing_by": "FSDP", "liger": False}}
    lora = {**row, "model": "Qwen3-8B", "recipe": "lora", "layout": "DDP, 1 process (Accelerate wraps nothing)",
            "published": check.published("Qwen3-8B", "lora", 2048), "setup": {**row["setup"], "adapter": "LORA"}}
    refused = {"model": "Qwen3-8B", "recipe": "ddp", "max_length": 8192, "tied_embeddings": False,
               "published": check.published("Qwen3-8B", "ddp", 8192),
               "result": "refused: the planner predicts 96.3 GiB, the GPU has 79.1 (--force runs it)"}
    a = check.parse([])
    assert {r.recipe for r in check.select_rows(a)} == {"ddp", "zero3", "fsdp2", "lora"} and a.steps > 5  # GPU
    assert [r.recipe for r in check.select_rows(check.parse(["--tiny"]))] == ["ddp", "zero3"]
    text = check.markdown(env, None, [row, fsdp, lora, refused], None, a, [])
    assert text.startswith("# One-GPU check: NVIDIA H100 80GB HBM3, 2026-11-24")
    assert "power limit 700.00 W), driver 580.65, CUDA 13.0" in text
    assert ("| Qwen3-0.6B | ddp | DDP, 1 process (Accelerate wraps nothing) | sdpa: cuDNN | on | on | 2,048 | 8,192 | "
            "0.250 [0.248-0.262] | 32,768 [31,268-33,032] | 45.2% | 42.1% | 20.0 (21.0, 0.95) | 22.0 (21.4, 1.03) | "
            "23.0 (21.9, 1.05) | none published | trains |") in text
    assert ("| Qwen3-1.7B | fsdp2 | FSDP2, 1 process | sdpa: flash | on + offload (FSDP) | off | 2,048 |") in text
    assert "| 41.8% MFU non-causal [1] | trains |" in text
    assert "| Qwen3-8B | lora | DDP, 1 process (Accelerate wraps nothing) + LORA adapter |" in text
    assert ("| Qwen3-8B | ddp | - | not recorded | not recorded | not recorded | 8,192 | - | - | - | - | - | - | - "
            "| - | 37.1% MFU non-causal [2] | refused: the planner predicts 96.3 GiB") in text
    # each reference: its source, and whether our non-causal column equals torchtitan's (only for untied models)
    assert "[1] llm-foundry's 1B model, bf16, 8 x H100, FSDP" in text
    assert "Qwen3-1.7B has tied embeddings, so they are NOT equal" in text
    assert "[2] llm-foundry's 7B model" in text and "Qwen3-8B has untied embeddings, so the two conventions are equal" \
        in text
    assert check.published("Qwen3-4B", "zero3", 8192)["kind"] == "tokens/s"
    assert check.published("Qwen3-0.6B", "zero3", 8192) is None
    assert check.REFUSED.search("The planner predicts 96.3 GiB per GPU and the GPUs here have 79.1 GiB: ...")


def test_the_row_list_quick_set_and_order():
    """`--quick`: doctor and the QUICK rows, 2 + 6 steps, 8 minutes of budget; everything: the QUICK rows first, then
    the rows set against a published figure, then the rest; --models/--recipes/--lengths keep the rows that match.
    A variant of a row (launcher options of its own) is one more line, run beside the default row."""
    check = load_check()
    Row = check.Row
    quick = check.parse(["--quick"])
    assert (quick.only, quick.warmup, quick.steps, quick.budget_s) == ("doctor,throughput", 2, 6, 480)
    # the rows measured on an H100 before, each at the speed settings it was measured with and with --fastest
    measured = [(r.model, r.recipe, r.max_length) for r in check.QUICK if r.variant == "as measured"]
    assert measured == [("Qwen3-1.7B", "ddp", 2048), ("Qwen3-4B", "fsdp2", 4096), ("Qwen3-8B", "lora", 4096)]
    assert all(Row(*m, ("--fastest",)) == check.QUICK[check.QUICK.index(r) + 1]
               for m, r in zip(measured, [r for r in check.QUICK if r.variant]))
    assert check.select_rows(quick) == check.QUICK and check.QUICK[-1] == Row("Qwen3-4B", "zero3", 8192)
    # the published one-H100 figures are among them; a family per row
    assert {r.recipe for r in check.QUICK} == set(check.RECIPES)
    assert check.published("Qwen3-8B", "lora", 4096)["value"] == 12473
    assert check.published("Qwen3-4B", "zero3", 8192)["value"] == 2436
    everything = check.select_rows(check.parse([]))
    # every model x length x recipe, and the QUICK rows not among them (the 4K rows and the variants)
    assert everything[:7] == check.QUICK and len(everything) == len(set(everything)) == 4 * 2 * 4 + 6
    kinds = [0 if r in check.QUICK else 1 if check.published(r.model, r.recipe, r.max_length) else 2
             for r in everything]
    assert kinds == sorted(kinds) and kinds.count(1) > 5
    assert check.select_rows(check.parse(["--models", "Qwen3-8B", "--recipes", "lora", "--lengths", "4096"])) == [
        check.QUICK[4], Row("Qwen3-8B", "lora", 4096, ("--fastest",))]
    assert [r.model for r in check.select_rows(check.parse(["--quick", "--models", "Qwen3-4B"]))] == ["Qwen3-4B"] * 3
    variant = Row("Qwen3-1.7B", "ddp", 2048, ("--use-something",))
    assert check.ordered([variant] + check.QUICK) == check.QUICK + [variant]  # a published row, after QUICK
    assert check.row_folder(variant) == "ddp-qwen3-1-7b-2048-use-something" != check.row_folder(check.QUICK[0])


def test_the_report_is_written_after_every_row_and_the_budget_stops_starting_rows(tmp_path, monkeypatch, capsys):
    """`--quick --budget-s 300` with the doctor and the runs faked (no training) and a fake clock: the report on disk,
    while a row runs, holds the rows before it and lists the rest as not run yet; after two rows of 100 s the rows
    whose estimate (start-up and speed measured by the rows before, their own FLOPs per step) does not fit the time
    left are skipped and the report says so; a run gets the time left as its timeout."""
    check = load_check()
    now = [0.0]
    real_budget = check.Budget
    monkeypatch.setattr(check, "Budget", lambda seconds: real_budget(seconds, clock=lambda: now[0]))
    out = tmp_path / "results"
    stem = out / f"cpu-{dt.date.today().isoformat()}"
    seen = []

    def doctor(cpu, timeout):
        now[0] += 10
        return {"rc": 0, "seconds": 10, "problems": [], "tail": ""}

    def run(spec, folder, a, work, timeout=None):
        on_disk = json.loads(stem.with_suffix(".json").read_text())
        seen.append(([r["result"] for r in on_disk["throughput"]], timeout))
        assert check.PENDING in stem.with_suffix(".md").read_text()
        now[0] += 100
        return {"model": spec.model, "recipe": spec.recipe, "max_length": spec.max_length, "options": [],
                "seconds": 100.0, "result": "trains", "tokens_per_s_per_gpu": 1.0,
                "spread": {"steps": a.steps, "step_s": {"median": 0.5, "min": 0.5, "max": 0.5}}}

    monkeypatch.setattr(check, "run_doctor", doctor)
    monkeypatch.setattr(check, "run_throughput", run)
    monkeypatch.setattr(check, "environment", lambda cpu: {"date": dt.date.today().isoformat(), "host": "h",
                                                             "python": "3", "versions": {}, "cuda": None,
                                                             "cudnn": None, "gpu": None})
    assert check.main(["--quick", "--cpu", "--budget-s", "300", "--out", str(out), "--work", str(tmp_path)]) == 0
    pending = check.PENDING
    # the time left less the launcher's stop (40 s): 300 - 10 (doctor) - 40, then 100 s less
    assert seen == [([pending] * 7, 250), (["trains"] + [pending] * 6, 150)]
    raw = json.loads(stem.with_suffix(".json").read_text())
    results = [r["result"] for r in raw["throughput"]]
    assert results[:2] == ["trains", "trains"]
    # measured: start-up 100 - 8 x 0.5 = 96 s, and the rate of the first row; the 8B LoRA row has 9.0x its FLOPs
    # per step (16,384 tokens of a 3x larger model): 96 + 8 x 0.5 x 9.0 = 132 s, with 90 s left
    a = check.parse(["--quick", "--cpu"])
    first, lora = check.QUICK[0], check.QUICK[4]
    ratio = check.flops_per_step(lora, check.CONFIGS / check.MODELS["Qwen3-8B"], a) / check.flops_per_step(
        first, check.CONFIGS / check.MODELS["Qwen3-1.7B"], a)
    assert 8.5 < ratio < 9.5
    assert results[4] == f"skipped: about {96 + 8 * 0.5 * ratio:.0f} s needed + 40 s reserve, 90 s of --budget-s left"
    assert all(r.startswith("skipped: about ") and r.endswith("s needed + 40 s reserve, 90 s of --budget-s left")
               for r in results[2:])
    assert raw["budget"] == {"seconds": 300, "used": 210.0, "skipped": 5}
    report = stem.with_suffix(".md").read_text()
    assert "Budget: 300 s (--budget-s); 210 s used; 5 row(s) not started" in report and pending not in report
    assert "| Qwen3-8B | lora (as measured) | - |" in report and "| Qwen3-8B | lora --fastest | - |" in report
    # a budget too short to stop a run in is refused
    with pytest.raises(SystemExit):
        check.parse(["--budget-s", "30"])
    assert "a run needs up to" in capsys.readouterr().err


# ---- bad input, Ctrl-C, skipped rows (no launcher run: CPU-cheap) ---------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--only", "throughtput"], "--only throughtput: unknown 'throughtput'; valid: doctor, throughput, alst"),
    (["--only", "doctor,"], "--only doctor,: unknown ''; valid: doctor, throughput, alst"),
    (["--models", "Qwen3-9B"], "--models Qwen3-9B: unknown 'Qwen3-9B'; valid: Qwen3-0.6B, Qwen3-1.7B, Qwen3-4B, "
                               "Qwen3-8B"),
    (["--recipes", "ddp,fdsp2"], "--recipes ddp,fdsp2: unknown 'fdsp2'; valid: ddp, zero3, fsdp2, lora"),
    (["--lengths", "4k"], "--lengths 4k: unknown '4k'; valid: 2048, 4096, 8192"),
    (["--alst-lengths", "65536,lots"], "--alst-lengths 65536,lots: 'lots' is not an integer"),
    (["--budget-s", "nan"], "argument --budget-s: 'nan': give a finite number above 0"),
    (["--budget-s", "inf"], "argument --budget-s: 'inf': give a finite number above 0"),
    (["--budget-s", "-5"], "argument --budget-s: '-5': give a finite number above 0"),
    (["--timeout", "nan"], "argument --timeout: 'nan': give a finite number above 0"),
    (["--alst-timeout", "0"], "argument --alst-timeout: '0': give a finite number above 0"),
    (["--steps", "0"], "argument --steps: '0': give at least 1"),
], ids=["only-typo", "only-empty-name", "models", "recipes", "lengths", "alst-lengths", "budget-nan", "budget-inf",
        "budget-negative", "timeout-nan", "alst-timeout-zero", "steps-zero"])
def test_bad_input_is_refused_before_anything_is_written(argv, message, tmp_path, monkeypatch, capsys):
    """A typo in a section, model, recipe or length name, or a budget or timeout that is not a positive number: exit 2
    with the valid names, before the report folder or a temporary folder of the runs exists (`--only throughtput`
    once ran nothing, exited 0 and replaced the day's report with an empty one; `--budget-s nan` meant no budget)."""
    check = load_check()
    monkeypatch.setattr(check.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    def never(*_a, **_k):  # a check that accepted the input would go on to these (and run for minutes)
        raise AssertionError(f"{argv}: accepted")

    for name in ("environment", "run_doctor", "run_throughput", "run_alst", "launch"):
        monkeypatch.setattr(check, name, never)
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as refused:
        check.main(["--cpu", *argv, "--out", str(out)])
    assert refused.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list((tmp_path / "tmp").iterdir())


def test_a_skipped_row_says_the_reserve_and_shows_no_figures():
    """A row the budget did not start says the reserve it applied (the launcher's stop: 40 s) besides its estimate,
    and neither its console line nor the report shows figures for it (no "0 tokens/s")."""
    check = load_check()
    spec = check.Row("Qwen3-8B", "lora", 4096, ("--fastest",))
    row = check.skipped(spec, check.skip_reason(62.4, 86.6))
    assert row["result"] == "skipped: about 62 s needed + 40 s reserve, 87 s of --budget-s left"
    assert check.STOP_WAIT_S == 40
    line = check.row_line(spec, row)
    assert line == "[check] Qwen3-8B lora --fastest 4096: skipped: about 62 s needed + 40 s reserve, 87 s of " \
                   "--budget-s left"
    failed = {**row, "result": "failed (exit 1): boom", "seconds": 12.5, "tokens_per_s_per_gpu": None}
    assert check.row_line(spec, failed) == "[check] Qwen3-8B lora --fastest 4096: failed (exit 1): boom (12.5 s)"
    trains = {**failed, "result": "trains", "tokens_per_s_per_gpu": 1234.4, "mfu": 0.5, "mfu_causal": 0.25}
    assert check.row_line(spec, trains) == ("[check] Qwen3-8B lora --fastest 4096: trains, 1,234 tokens/s/GPU, MFU "
                                            "50.0% non-causal, 25.0% causal (12.5 s)")
    env = {"date": "2026-11-24", "host": "h", "python": "3.12.3", "cuda": None, "cudnn": None,
           "versions": {k: "1.0" for k in check.PACKAGES}, "gpu": None}
    text = check.markdown(env, None, [row], None, check.parse([]), [])
    cells = next(line for line in text.splitlines() if line.startswith("| Qwen3-8B |")).split(" | ")
    assert cells[-1] == "skipped: about 62 s needed + 40 s reserve, 87 s of --budget-s left |"
    assert set(cells[7:15]) == {"-"} and " 0 " not in text  # tokens/step, step time, tokens/s, MFU, memory


def test_ctrl_c_writes_the_report_with_what_finished_and_removes_the_temporary_folder(tmp_path, monkeypatch,
                                                                                        capsys):
    """Ctrl-C during the second row (launcher runs faked): one line, no traceback, status 130; the report holds the
    first row, the second as stopped while it ran and the rest as not run; the runs' temporary folder is gone."""
    check = load_check()
    monkeypatch.setattr(check.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(check, "environment", lambda cpu: {"date": dt.date.today().isoformat(), "host": "h",
                                                             "python": "3", "versions": {}, "cuda": None,
                                                             "cudnn": None, "gpu": None})
    monkeypatch.setattr(check, "run_doctor", lambda cpu, timeout: {"rc": 0, "seconds": 1, "problems": [], "tail": ""})
    ran = []

    def run(spec, folder, a, work, timeout=None):
        assert work.parent == tmp_path / "tmp" and work.name.startswith("gpu-check-")
        ran.append(spec)
        if len(ran) == 2:
            raise KeyboardInterrupt  # what the launch() of a row raises once it has stopped the launcher
        return {"model": spec.model, "recipe": spec.recipe, "max_length": spec.max_length, "options": [],
                "seconds": 10.0, "result": "trains", "tokens_per_s_per_gpu": 1.0}

    monkeypatch.setattr(check, "run_throughput", run)
    out = tmp_path / "results"
    assert check.main(["--quick", "--cpu", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert "[check] interrupted (Ctrl-C); the report keeps what finished" in captured.err
    assert "Traceback" not in captured.out + captured.err
    assert not list((tmp_path / "tmp").iterdir())  # the runs' temporary folder is removed
    raw = json.loads((out / f"cpu-{dt.date.today().isoformat()}.json").read_text())
    assert [r["result"] for r in raw["throughput"]] == ["trains", check.STOPPED] + [check.INTERRUPTED] * 5
    assert check.PENDING not in (out / f"cpu-{dt.date.today().isoformat()}.md").read_text()


CHILD = """
import signal, sys, time
seen = []
def on_sigint(*_):
    seen.append(1)
    print(f"SIGINT {len(seen)}", flush=True)
    if len(seen) == int(sys.argv[1]):
        sys.exit(130)
signal.signal(signal.SIGINT, on_sigint if sys.argv[1] != "0" else signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("sigints_to_exit, expected", [(1, 130), (2, 130), (0, -9)])
def test_ctrl_c_stops_a_launcher_run_through_its_stop_sequence(sigints_to_exit, expected):
    """The launcher's stop sequence, on a child standing in for it in a session of its own: SIGINT to its group;
    after a wait a second SIGINT (the launcher then kills its ranks at once); after another, SIGKILL."""
    import subprocess

    check = load_check()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(sigints_to_exit)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline() == "ready\n"
    check._interrupt(proc, waits=(0.5, 0.5))
    assert proc.returncode == expected
    assert proc.stdout.read().split() == ["SIGINT", "1", "SIGINT", "2"][:2 * sigints_to_exit]
