"""`--fastest` and the throughput model behind it.

- The throughput model (launch/speed/model.py) against every measured row of launch/facts/calibration.py, within 20%,
  and its fitted rates re-fitted from the rows (they must be what the rows give); the FLOP conventions it reports
  (MFU, HFU, and NeMo's frozen-base FLOPs, checked against NeMo's own published pair of figures).
- The search (launch/speed/fastest.py): what it chooses for Qwen3-1.7B DDP on one 80 GB GPU, that a run which only fits
  with checkpointing keeps it, that every recipe's GPU defaults are what it finds for the GPUs its README names, and
  that the choice is applied as ordinary settings that the user's own win over.
- One short real CPU run with `--fastest` (slow): it runs, its summary records the choice, and it trains like the
  judged smoke run it shares the data with: checkpointing off (its choice on CPU) vs on gives the same losses within
  the batch-layout parity tolerance. Micro-batch x accumulation parity is tests/test_parity.py's batch-layout test.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import replace

import pytest

from helpers.launcher import assert_parity, explain
from launch.facts import calibration, hub
from launch.speed import fastest, model as throughput_model
from launch.__main__ import main
from launch.memory import Architecture, RunShape
from launch.memory.plan import SPARE, Target, default_target, plan_memory
from launch.config.options import Options
from launch.recipe.discovery import RECIPES_DIR, recipe_names
from launch.run.resolve import FASTEST, resolve

MODEL_CONFIGS = hub.SHIPPED_CONFIGS


def plan(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- the throughput model ------------------------------------------------------------------------------------------
def test_the_throughput_model_is_within_20_percent_of_every_measured_row():
    """Every row of calibration.MEASURED_ROWS (the H100 rows of benchmarks/results/h100-2026-11-27.json, TRL's published
    1M-token run, and the Liger LoRA row kept back from the fit), predicted by code from the row's recipe, model,
    length, batch layout, Liger and checkpointing. Printed with `pytest -s`."""
    lines = []
    for row, cost, error in throughput_model.row_errors():
        lines.append(f"{row.model:<18} {row.recipe:<13} {row.max_length:>9,}  Liger {'on ' if row.liger else 'off'}  "
                     f"{row.per_device_train_batch_size} x {row.gradient_accumulation_steps}  measured "
                     f"{row.step_s:8.3f} s  predicted {cost.step_s:8.3f} s  {error:+6.1%}  "
                     f"{'fitted' if row.fit else 'kept back'}  ({row.source.gpu}, {row.source.date})")
    print("\n" + "\n".join(lines))
    for line, (_row, _cost, error) in zip(lines, throughput_model.row_errors()):
        assert abs(error) <= 0.20, line


def test_the_calibrated_rates_are_what_the_measured_rows_give():
    """launch/facts/calibration.py holds the fitted rates as numbers (so that a plan needs no fit); they must be what
    `throughput_model.fit` gives from the rows today, to the precision they are held at."""
    fitted = throughput_model.fit()
    assert fitted.bandwidth == pytest.approx(calibration.MEMORY_BOUND_BYTES_PER_S, rel=1e-9)
    assert fitted.issue_s == pytest.approx(calibration.KERNEL_ISSUE_S, rel=1e-9)
    assert fitted.attention == pytest.approx(calibration.ATTENTION_FRACTION_OF_PEAK, rel=1e-9)
    # physically sensible: below the H100's HBM3 peak (3.35 TB/s), a per-kernel host cost in tens of microseconds,
    # attention below the GEMMs' fraction of the peak
    assert 1e12 < fitted.bandwidth < 3.35e12 and 5e-6 < fitted.issue_s < 200e-6
    assert fitted.attention < calibration.MATMUL_FRACTION_OF_PEAK


def _qwen(name: str) -> Architecture:
    return Architecture.from_config(json.loads((MODEL_CONFIGS / name / "config.json").read_text()))


def test_flop_conventions_mfu_hfu_and_the_frozen_base():
    """MFU's FLOPs are 6N + 12 L H d S (recomputation not counted); the HFU adds checkpointing's recomputed forward
    (2 N_layers + 4 L H d S); an adapter run also reports NeMo's frozen-base FLOPs (causal x (2 + trainable / frozen)
    / 3). NeMo's own published pair -- Llama-3-8B LoRA on one H100 at 4,096 tokens, 12,473 tokens/s and 402 TFLOP/s --
    is reproduced by that convention on Llama-3.1-8B's architecture (the same shapes) within 2%."""
    from launch.speed.measured import flops_params

    arch = _qwen("Qwen--Qwen3-8B")
    accelerate = {"distributed_type": "MULTI_GPU", "num_processes": 1}
    base = {"max_length": 4096, "per_device_train_batch_size": 1, "dtype": "bfloat16"}
    off = RunShape.from_configs(accelerate, {**base, "activation_checkpointing": False})
    on = RunShape.from_configs(accelerate, {**base, "activation_checkpointing": True})
    attention = 12 * arch.num_layers * arch.q_dim * 4096
    f_off, f_on = throughput_model.flops_by_convention(arch, off), throughput_model.flops_by_convention(arch, on)
    assert f_off["model"] == f_on["model"] == 6 * flops_params(arch) + attention
    # HFU: what the GPU executes, causal attention (its masked half skipped) and the recomputed forward
    assert f_off["hardware"] == f_off["model_causal"] == f_off["model"] - attention / 2
    assert f_on["hardware"] == f_on["model_causal"] + 2 * arch.num_layers * arch.matmul_params_per_layer + attention / 6
    assert "frozen_base" not in f_on
    llama = _qwen("meta-llama--Llama-3.1-8B-Instruct")
    lora = RunShape.from_configs(accelerate, {**base, "use_peft": True, "lora_r": 16,
                                              "lora_target_modules": "all-linear"})
    frozen = throughput_model.flops_by_convention(llama, lora)["frozen_base_causal"]
    assert frozen < throughput_model.flops_by_convention(llama, lora)["model_causal"] * 0.67
    assert 12_473 * frozen == pytest.approx(402e12, rel=0.02)


def test_fewer_micro_batches_and_no_recomputation_are_faster_at_equal_tokens():
    """What the search relies on, as the model says it (physically: every kernel has a floor, recomputation is a
    second forward): at the same tokens per step, 4 x 1 beats 2 x 2 beats 1 x 4, and no checkpointing beats
    checkpointing, and Liger beats the unfused modules; a longer step for more tokens."""
    arch = _qwen("Qwen--Qwen3-1.7B")
    accelerate = {"distributed_type": "MULTI_GPU", "num_processes": 1}
    run = RunShape.from_configs(accelerate, {"max_length": 2048, "per_device_train_batch_size": 4,
                                             "dtype": "bfloat16", "activation_checkpointing": False})

    def step(**changes):
        layout = replace(run.layout, **{k: v for k, v in changes.items() if k in ("per_device_train_batch_size",
                                                                                   "gradient_accumulation_steps")})
        shaped = replace(run, layout=layout, **{k: v for k, v in changes.items() if k in ("gradient_checkpointing",
                                                                                         "liger_kernels")})
        return throughput_model.predict(arch, shaped).step_s

    assert step() < step(per_device_train_batch_size=2, gradient_accumulation_steps=2) < step(
        per_device_train_batch_size=1, gradient_accumulation_steps=4)
    assert step() < step(gradient_checkpointing=True)
    assert step(liger_kernels=True) < step()
    assert step(per_device_train_batch_size=8) > step()


# ---- the search ----------------------------------------------------------------------------------------------------
FIELDS = {"activation_checkpointing", "activation_checkpointing_offload", "per_device_train_batch_size",
          "gradient_accumulation_steps", "use_liger_kernel", "gpu_peak_gib", "predicted_tokens_per_s_per_gpu"}


def test_qwen3_1_7b_ddp_on_one_80gb_gpu_runs_without_checkpointing_and_with_liger(capsys):
    """The Qwen3-1.7B DDP case: `plan ddp --gpus 1 --gpu-memory 79.1 --model Qwen3-1.7B --max-length 2048 --fastest`
    chooses checkpointing off and (the target being a GPU machine set up from the image's lock, which holds
    liger-kernel) Liger on; the faster candidates are each said why not."""
    rc, out, err = plan(capsys, "ddp", "--gpus", "1", "--gpu-memory", "79.1", "--model", MODEL_CONFIGS /
                        "Qwen--Qwen3-1.7B", "--max-length", "2048", "--fastest", "--json")
    assert rc == 0, err
    data = json.loads(out)
    chosen = data["fastest"]
    assert FIELDS <= set(chosen) and all(FIELDS <= set(c) for c in data["candidates"])
    assert chosen["activation_checkpointing"] is False and chosen["use_liger_kernel"] is True
    assert chosen["per_device_train_batch_size"] * chosen["gradient_accumulation_steps"] == 4  # the same tokens
    assert chosen["gpu_peak_gib"] <= 79.1 * (1 - SPARE) and chosen["predicted_tokens_per_s_per_gpu"] > 0
    assert chosen == data["candidates"][0]  # the fastest candidate fits here
    rc, out, err = plan(capsys, "ddp", "--gpus", "1", "--model", MODEL_CONFIGS / "Qwen--Qwen3-1.7B", "--fastest")
    assert "<- fastest that fits" in out and "checkpointing off, Liger on, micro-batch 4 x accumulation 1" in out


def test_a_run_that_only_fits_with_checkpointing_keeps_it(capsys):
    """Qwen3-8B LoRA on one 24 GB GPU: without checkpointing nothing fits, so the choice checkpoints; every faster
    candidate says what it would need."""
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "24",
                        "--model", MODEL_CONFIGS / "Qwen--Qwen3-8B",
                        "--fastest", "--json")
    data = json.loads(out)
    chosen = data["fastest"]
    assert chosen["activation_checkpointing"] is True and chosen["gpu_peak_gib"] <= 24 * (1 - SPARE), chosen
    faster = data["candidates"][:data["candidates"].index(chosen)]
    # each faster one does not fit, or fits within the tie of the chosen one's time with less headroom (the fewest
    # checkpointed layers that fit sit at the edge of the memory)
    assert faster and all(c["why_not"] or c["predicted_step_s"] <= chosen["predicted_step_s"] * (1 + fastest.TIE)
                          for c in faster)
    assert any(not c["activation_checkpointing"] and "needs" in c["why_not"] for c in faster)


@functools.cache  # the GPU defaults, the figures and the HFU tests of a recipe share its search (read only)
def _search(name: str):
    """The search as `plan RECIPE --fastest` runs it: the recipe's GPU defaults on the GPUs its README names."""
    recipe_model = resolve(Options(recipe=name), progress=lambda *_: None).training["model_name_or_path"]
    config_dir = MODEL_CONFIGS / str(recipe_model).replace("/", "--")
    setup = resolve(Options(recipe=name, extra=["--model_name_or_path", str(config_dir)]), progress=lambda *_: None)
    plan_ = plan_memory(setup, default_target(setup), model=hub.read_model_config(str(config_dir)), environ={})
    return setup, fastest.search(setup, plan_, liger_installed=fastest.liger_in_image_lock())


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipes_gpu_defaults_are_the_fastest_that_fit(name):
    """Each recipe's speed settings are what `plan RECIPE --fastest` finds for its GPUs (config.yaml
    says why, with the figures); a config change that makes them slower, or a planner change that makes another
    choice faster, fails here until the config is re-chosen."""
    setup, found = _search(name)
    assert found.chosen is not None, fastest.describe(found)
    assert fastest.arguments(setup, found.chosen.settings) == ([], {}), fastest.describe(found)
    data = found.as_json()  # what `plan RECIPE --fastest --json` adds
    assert FIELDS <= set(data["fastest"]) and data["candidates"] and all(FIELDS <= set(c) for c in data["candidates"])


def _speed_comment(name: str) -> str:
    """The config.yaml comment that gives the recipe's speed settings and their figures, as one line of text."""
    lines, inside = [], False
    for line in (RECIPES_DIR / name / "config.yaml").read_text().splitlines():
        if line.startswith("# Speed settings"):
            inside = True
        elif inside and not line.startswith("#"):
            break
        if inside:
            lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def _shown(stated: str, value: float) -> bool:
    """Whether `value` is what a comment shows as `stated`: the same at the stated decimals (GiB), or within 1% for
    a rounded "~N" (tokens/s, rounded to two or three significant figures)."""
    number = float(stated.replace(",", ""))
    if "." in stated:
        return abs(value - number) <= 0.5 * 10 ** -len(stated.split(".")[1]) + 1e-9
    return abs(value - number) <= 0.01 * value


@pytest.mark.parametrize("name", [n for n in recipe_names() if "Speed settings" in
                                  (RECIPES_DIR / n / "config.yaml").read_text()])
def test_every_figure_a_config_comment_states_is_the_planners(name):
    """Each figure in a config.yaml's speed comment is recomputed: the chosen setting's GiB per GPU and tokens/s per
    GPU, and every other GiB or ~tokens/s figure it cites is a candidate's of the same search (a figure "at N Gb/s"
    is the chosen setting's on that network). A planner change that moves a figure fails here until the comment
    follows the tool."""
    text = _speed_comment(name)
    setup, found = _search(name)
    chosen = found.chosen
    assert chosen is not None
    main_figures = re.search(r"([\d.]+) GiB per GPU and ~([\d,]+) tokens/s per GPU", text)
    assert main_figures, text
    assert _shown(main_figures.group(1), chosen.plan.estimate.gpu_peak_gib), (text, chosen.plan.estimate.gpu_peak_gib)
    assert _shown(main_figures.group(2), chosen.cost.tokens_per_s_per_gpu), (text, chosen.cost.tokens_per_s_per_gpu)
    # "Communication-bound" is said exactly where the planner says so (at its default network between machines)
    assert ("Communication-bound" in text) == chosen.cost.communication_bound, (text, chosen.cost.communication_bound)
    candidates = found.candidates
    for stated in re.findall(r"([\d.]+) GiB", text):
        assert any(_shown(stated, c.plan.estimate.gpu_peak_gib) for c in candidates), (
            f"{name}: {stated} GiB is no candidate's peak: "
            + ", ".join(f"{c.plan.estimate.gpu_peak_gib:.1f}" for c in candidates))
    for stated, gbps in re.findall(r"~([\d,]+)(?![\d,]*%)(?: at ([\d,]+) Gb/s)?", text):
        if gbps:
            plan_ = chosen.plan
            other = fastest.search(setup, plan_, liger_installed=fastest.liger_in_image_lock(),
                                   network_gbps=float(gbps.replace(",", "")))
            speed = other.chosen.cost.tokens_per_s_per_gpu
            assert _shown(stated, speed), (stated, gbps, speed)
        else:
            assert any(_shown(stated, c.cost.tokens_per_s_per_gpu) for c in candidates), (
                f"{name}: ~{stated} tokens/s is no candidate's: "
                + ", ".join(f"{c.cost.tokens_per_s_per_gpu:,.0f}" for c in candidates))


@pytest.mark.parametrize("name", recipe_names())
def test_the_hfu_never_exceeds_the_matmul_ceiling_the_model_runs_at(name):
    """The predicted HFU counts what the GPU executes, so no candidate of any recipe's search passes the fraction of
    the peak the throughput model's matmuls themselves run at (it did, 89-91%, on the long-context recipes, when the
    masked half of causal attention was counted as executed)."""
    _setup, found = _search(name)
    ceiling = calibration.MATMUL_FRACTION_OF_PEAK
    for c in found.candidates:
        hfu = c.cost.utilization("hardware")
        assert hfu <= ceiling, (name, fastest.label(c.settings), hfu)


def test_liger_is_never_chosen_on_cpu_without_it_or_under_the_tiled_mlp():
    setup, found = _search("ddp")
    assert found.chosen.settings.use_liger_kernel
    run = found.chosen.plan.run
    assert fastest.liger_allowed(setup, replace(run, device="cpu"), True) == \
        "a CPU run (Liger's kernels are Triton, GPU only)"
    assert fastest.liger_allowed(setup, run, False) == "liger-kernel is not installed"
    assert "tiled MLP" in fastest.liger_allowed(setup, replace(run, tiled_mlp=True), True)
    assert fastest.liger_on_this_machine(0) is False  # no GPU: no Liger, whatever is installed


def test_the_choice_is_applied_as_ordinary_settings_and_the_users_own_win():
    """The choice becomes training arguments in a layer below the user's `--` ones (or FSDP's own two Accelerate
    flags, into the config's fsdp_config), is part of the invocation (a smoke run with it is another run than the
    recorded one), and a setting given after `--` is not searched."""
    setup = resolve(Options(recipe="ddp"), progress=lambda *_: None)
    settings = fastest.Settings(True, True, None, 2, 2, False)
    argv, accelerate = fastest.arguments(setup, settings)
    assert argv == ["--activation_checkpointing", "true", "--activation_checkpointing_kwargs", '{"offload": true}',
                    "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
                    "--use_liger_kernel", "false"] and accelerate == {}
    applied = resolve(Options(recipe="ddp", extra=["--per_device_train_batch_size", "1"]), progress=lambda *_: None,
                      fastest=(argv, accelerate))
    assert applied.checkpointing.enabled and applied.checkpointing.offload
    assert applied.layout.per_device_train_batch_size == 1  # the user's, after `--`
    assert applied.layout.gradient_accumulation_steps == 2 and applied.explicit["use_liger_kernel"][1] == FASTEST
    assert applied.invocation["fastest"] == {"training_args": argv, "accelerate": {}}
    assert fastest.user_given(applied) == ("per_device_train_batch_size",)
    # fsdp2 checkpoints FSDP's way: its two Accelerate flags, which the memory model and the rules read
    fsdp = resolve(Options(recipe="fsdp2"), progress=lambda *_: None)
    argv, accelerate = fastest.arguments(fsdp, fastest.Settings(True, True, None, 1, 2, True))  # fsdp2's own 1 x 2
    assert argv == [] and accelerate == {"fsdp_activation_checkpointing": True,
                                         "fsdp_activation_checkpointing_offload": True}
    applied = resolve(Options(recipe="fsdp2"), progress=lambda *_: None, fastest=(argv, accelerate))
    assert applied.accelerate["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert applied.accelerate_overrides["fsdp_activation_checkpointing"] is True
    assert not applied.checkpointing.enabled  # transformers' stays off: never both


def test_a_setting_given_after_dashes_is_not_searched():
    setup = resolve(Options(recipe="ddp", extra=["--activation_checkpointing", "true", "--model_name_or_path",
                                                 str(MODEL_CONFIGS / "Qwen--Qwen3-0.6B")]), progress=lambda *_: None)
    plan_ = plan_memory(setup, Target(8, 1, 79.1), model=hub.read_model_config(str(MODEL_CONFIGS / "Qwen--Qwen3-0.6B")))
    found = fastest.search(setup, plan_, liger_installed=True)
    assert found.fixed == ("activation_checkpointing",)
    assert {c.settings.activation_checkpointing for c in found.candidates} == {True}
    assert {c.settings.use_liger_kernel for c in found.candidates} == {True, False}


def test_a_cpu_dry_run_prints_the_choice_and_runs_it(capsys):
    """On CPU Liger stays off; the smoke profile checkpoints (as recorded), --fastest turns it off."""
    rc = main(["ddp", "--smoke", "--cpu", "--fastest", "--dry-run", "--output-dir", "/tmp/fastest-dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Liger: off: a CPU run" in out and "<- fastest that fits" in out
    assert ("--fastest: checkpointing off, Liger off, micro-batch 4 x accumulation 1 "
            "(--activation_checkpointing false)") \
        in out
    command = out[out.index("accelerate launch"):]
    assert command.index("--activation_checkpointing true") < command.index("--activation_checkpointing false")


# ---- one real run (slow) -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_a_fastest_run_records_its_choice_and_trains_like_the_default(smoke_runs):
    """`python -m launch ddp --smoke --cpu --fastest`: runs, says its choice before the start, records it in
    run_summary.json, and -- checkpointing off, its choice on CPU, against the judged smoke run's checkpointing on, at
    the same 2 x 4 x 1 layout -- trains the same steps within the batch-layout parity tolerance
    (tests/test_parity.py)."""
    proc, summary = smoke_runs.run("ddp", "--fastest")
    assert proc.returncode == 0, explain(proc)
    assert "[launch] --fastest: checkpointing off" in proc.stdout
    chosen = summary["fastest"]["fastest"]
    assert chosen["activation_checkpointing"] is False and chosen["use_liger_kernel"] is False
    assert summary["fastest"]["applied"] == {"training_args": ["--activation_checkpointing", "false"], "accelerate": {}}
    assert summary["invocation"]["fastest"] == summary["fastest"]["applied"]
    base_proc, base = smoke_runs.run("ddp")
    assert base_proc.returncode == 0, explain(base_proc)
    # measured (12 steps, torch 2.13.0 CPU): loss and grad_norm differ by 0.0 (recomputation repeats the same ops)
    assert_parity("checkpointing-off-vs-on", [("checkpointing on", base["observed"]),
                                              ("checkpointing off", summary["observed"])],
                  {"loss": 1e-5, "grad_norm": 1e-5})
    assert math.isfinite(summary["observed"]["loss"][-1])
