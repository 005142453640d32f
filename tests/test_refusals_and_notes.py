"""Input a new user types that the launcher once accepted or answered wrongly, now refused before any process starts
(one paragraph, exit status 2) or answered correctly: `record` on a layout the plain smoke run is not judged against,
a --bench run that measures no step, a synthetic run asked to save its final weights, the pure-16-bit refusal's claims
and advice, LoRA under fsdp2's smoke profile, and `merge`'s account of its base and of a missing tokenizer.

The launcher runs in-process (`launch.__main__.main`) with `subprocess.Popen` replaced by a function that fails the
test, so a case that got as far as starting `accelerate launch` cannot pass. `record` is only ever run on a copy of a
recipe folder, and the one round trip that records replaces the training by a fake that writes what a finished run
writes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.rule_checks import facts, make_recipe, messages
from launch.__main__ import main
from launch.config.options import Options
from launch.recipe.discovery import RECIPES_DIR
from launch.results import outdir
from launch.run.resolve import resolve


@pytest.fixture
def no_spawn(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError(f"the launcher started a process: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(tmp_path: Path, base: str) -> Path:
    folder = tmp_path / f"{base}-copy"
    shutil.copytree(RECIPES_DIR / base, folder)
    return folder


# ---- 1. `record` records only the layout the plain smoke run is judged against --------------------------------------
@pytest.mark.parametrize("args,named", [
    (["--fastest"], "--fastest (the speed settings it chooses would be recorded"),
    (["--max-steps", "6"], "--max-steps 6 (a smoke run takes the profile's 12 steps"),
    (["--", "--per_device_train_batch_size", "2"],
     "`--per_device_train_batch_size 2` after `--` (it changes the batch every later smoke run inherits; recorded: 4, "
     "from the smoke profile)"),
    (["--", "--gradient_accumulation_steps", "2"], "`--gradient_accumulation_steps 2` after `--`"),
    (["--", "--max_length=64"], "`--max_length=64` after `--`"),
])
def test_record_refuses_a_layout_the_plain_smoke_run_is_not_judged_against(args, named, tmp_path, capsys, no_spawn):
    """`record ddp --smoke --cpu --fastest` rewrote expected_metrics.json with another layout, after which the plain
    smoke run (CI's, the docs') said "not judged" and exited 0. Refused before start, naming the option; the
    recipe's expected metrics (a copy's, and the tracked ones) are left as they were."""
    tracked = RECIPES_DIR / "ddp" / "expected_metrics.json"
    before = _digest(tracked)
    folder = _copy(tmp_path, "ddp")
    copy_before = _digest(folder / "expected_metrics.json")
    split = args.index("--") if "--" in args else len(args)
    rc, out, err = _run(["record", folder, "--smoke", "--cpu", "--output-dir", tmp_path / "out", *args[:split],
                         *args[split:]], capsys)
    assert rc == 2, out + err
    assert f"`record` writes the expected metrics that every later `python -m launch {folder} --smoke --cpu`" in err
    assert "(2 process(es), mesh as in the config, no training arguments after `--`)" in err
    assert named in err
    assert f"`python -m launch record {folder} --smoke --cpu` re-records the recorded layout" in err
    assert "\n" not in err.strip()  # one paragraph
    assert not (tmp_path / "out").exists()
    assert _digest(folder / "expected_metrics.json") == copy_before and _digest(tracked) == before


def test_re_recording_the_recorded_layout_still_records_and_the_plain_run_is_judged(tmp_path, capsys, monkeypatch):
    """The deliberate re-record (`record RECIPE --smoke --cpu`, and the same with the recorded --num-processes) runs
    the recorded layout and arguments after `--` (alst-ulysses-4gpu's `--pad_to_multiple_of 128` inherited), and the
    plain smoke run afterwards is judged against what it wrote. The training is a fake that writes the steps."""
    from launch.run import supervise

    folder = _copy(tmp_path, "ddp")
    expected = folder / "expected_metrics.json"
    recorded = json.loads(expected.read_text())["profiles"]["smoke-cpu"]

    def fake_training(cmd, log_path, env=None, watchdog=None, **_):
        out = Path(cmd[cmd.index("--output_dir") + 1])
        history = [{"step": i + 1, "loss": loss, "grad_norm": g} for i, (loss, g) in
                   enumerate(zip(recorded["steps"]["loss"], recorded["steps"]["grad_norm"]))]
        (out / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        log_path.write_text("trained\n")
        return 0, None

    monkeypatch.setattr(supervise, "run", fake_training)
    for n, extra in enumerate([[], ["--num-processes", "2"]]):
        rc, out, err = _run(["record", folder, "--smoke", "--cpu", "--output-dir", tmp_path / f"rec{n}", *extra],
                            capsys)
        assert rc == 0, out + err
        assert "recorded 12 steps as the expected metrics of smoke-cpu" in out
        assert json.loads(expected.read_text())["profiles"]["smoke-cpu"]["invocation"] == recorded["invocation"]
    rc, out, err = _run([folder, "--smoke", "--cpu", "--output-dir", tmp_path / "plain"], capsys)
    assert rc == 0, out + err
    assert "expected metrics: PASSED" in out and "not judged" not in out
    # the recorded arguments after `--` are re-recorded too (refused when changed: the batch)
    rc, out, err = _run(["record", "alst-ulysses-4gpu", "--smoke", "--cpu", "--dry-run"], capsys)
    assert rc == 0, err
    assert "--pad_to_multiple_of 128" in out and "world size               4 process(es)" in out


# ---- 2. a --bench run that measures nothing; a synthetic run asked to save ------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--bench", "--bench-warmup", "5", "--max-steps", "3"],
     "--bench measures the steps after its 5 warm-up step(s) (--bench-warmup), and this run takes 3 (--max-steps 3): "
     "it would measure 0 steps. Give --bench-steps N (the run then takes 5 + N steps and measures N), or a "
     "--bench-warmup below 3."),
    (["--bench", "--bench-warmup", "12"], "this run takes 12 (the smoke profile's max_steps): it would measure 0"),
    (["--bench", "--", "--max_steps", "2"], "this run takes 2 (`--max_steps 2` after `--`): it would measure 0"),
    (["--synthetic", "--", "--save_final", "true"],
     "`-- --save_final true` with --synthetic would save nothing: a synthetic run trains random weights, which "
     "train.py never saves as final weights."),
    (["--synthetic", "--", "--save_final"], "`-- --save_final true` with --synthetic would save nothing"),
])
def test_a_measurement_that_measures_or_saves_nothing_is_refused(args, message, capsys, no_spawn):
    rc, out, err = _run(["ddp", "--smoke", "--cpu", *args], capsys)
    assert rc == 2, out + err
    assert message in err and "\n" not in err.strip()


def test_a_measurement_that_measures_is_accepted(capsys, no_spawn):
    rc, out, err = _run(["ddp", "--smoke", "--cpu", "--dry-run", "--bench", "--bench-warmup", "5", "--max-steps", "6"],
                        capsys)
    assert rc == 0, err
    rc, out, err = _run(["ddp", "--smoke", "--cpu", "--dry-run", "--synthetic", "--", "--save_final", "false"], capsys)
    assert rc == 0, err


# ---- 3. the pure-16-bit refusal claims only what is true, and advises what applies ----------------------------------
BF16_MODEL = {"dtype": "bfloat16", "hidden_size": 64, "model_type": "qwen3"}


@pytest.mark.parametrize("case", ["lr-0.003", "lr-2e-5", "mixed-no", "fp16-scaler", "fp16-no-scaler", "dtype-auto"])
def test_the_pure_16bit_refusal_says_what_is_true(case, tmp_path):
    bf16 = make_recipe(tmp_path, base="ddp", config={"dtype": "bfloat16"}, name="bf16")
    fp16 = make_recipe(tmp_path, base="ddp", config={"dtype": "float16", "bf16": False, "fp16": True}, name="fp16")
    options = {
        "lr-0.003": Options(recipe=str(bf16), extra=["--learning_rate", "0.003"]),
        "lr-2e-5": Options(recipe=str(bf16)),
        "mixed-no": Options(recipe="ddp", smoke=True, cpu=True, extra=["--dtype", "bfloat16"]),
        "fp16-scaler": Options(recipe=str(fp16)),
        "fp16-no-scaler": Options(recipe=str(fp16), extra=["--fp16", "false", "--bf16", "false"]),
        "dtype-auto": Options(recipe="ddp", extra=["--dtype", "auto"]),
    }[case]
    [msg] = messages(resolve(options, progress=lambda *_: None), facts(BF16_MODEL))
    linear_lost = "and most updates of weights of typical size 0.02 (half a step there is 6.1e-05)"
    if case == "lr-0.003":  # 0.003 is above half a bf16 step at 0.02 (2^-14): those updates are kept
        assert "at learning_rate 0.003 every update of the weights near 1.0 (the RMSNorm scales) is lost" in msg
        assert linear_lost not in msg
        assert "the updates of weights of typical size 0.02 (half a step there is 6.1e-05) are kept at this rate" in msg
    elif case == "lr-2e-5":
        assert linear_lost in msg
    elif case == "mixed-no":  # the CPU profile's fp32 without autocast, the model loaded in bf16
        assert "no: true" not in msg and "`no`" not in msg
        assert "(mixed precision is off)" in msg
        assert "the run then computes in fp32 and Adam updates fp32 weights" in msg
    elif case == "fp16-scaler":
        assert "pure float16" in msg and "--pure-bf16." not in msg and "To train pure float16 on purpose" not in msg
        assert "Pure float16 does not train under `fp16: true` at all, --pure-bf16 or not" in msg
        assert "\"Attempting to unscale FP16 gradients.\"" in msg
    elif case == "fp16-no-scaler":
        assert msg.endswith("To train pure float16 on purpose (no loss scaling, so small gradients may underflow), "
                            "pass --pure-bf16: it allows pure 16-bit training in either 16-bit type.")
    else:
        assert "`dtype: auto` (the training arguments after `--`), which loads the checkpoint's own bfloat16" in msg
        assert "`dtype: bfloat16`" not in msg


# ---- 4. LoRA under fsdp2's smoke profile: it runs as typed -----------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--activation_checkpointing", "true"]])
def test_lora_under_the_fsdp2_smoke_profile_checkpoints_with_transformers(extra, capsys, no_spawn):
    """The smoke profile turns FSDP's checkpointing on for fsdp2 (as its metrics were recorded), which an adapter
    cannot use (its saved adapter would be empty), and each refusal sent the user to the other. The profile now sees
    the adapter wherever it is turned on, after `--` too, and checkpoints it with transformers' checkpointing."""
    rc, out, err = _run(["fsdp2", "--smoke", "--cpu", "--dry-run", "--", "--use_peft", "true", *extra], capsys)
    assert rc == 0, out + err
    assert "--activation_checkpointing true" in out and "--fsdp_activation_checkpointing" not in out


# ---- 5. merge: where the base came from, and the fix for a missing tokenizer ----------------------------------------
def _lora_run(tmp: Path, checkpoint_tokenizer: bool = False) -> Path:
    """A finished lora run's folder as the launcher leaves it: an adapter of the smoke model's architecture (random
    weights) and its tokenizer in final/, a complete checkpoint-4 holding the adapter (and the tokenizer when
    `checkpoint_tokenizer`)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from launch.config import smoke

    base = smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]
    out = tmp / "run"
    claim = outdir.claim(outdir.check(out, resume=False, overwrite=False), command="earlier run")
    outdir.release(claim)
    final = outdir.RunFolder(out).final
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft.peft_config["default"].base_model_name_or_path = str(base)
    peft.save_pretrained(final)
    checkpoint = out / "checkpoint-4"
    peft.save_pretrained(checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    for tokenizer_file in Path(base).glob("tokenizer*"):
        shutil.copy(tokenizer_file, final / tokenizer_file.name)
        if checkpoint_tokenizer:
            shutil.copy(tokenizer_file, checkpoint / tokenizer_file.name)
    return out


def test_merge_says_where_its_base_came_from_and_how_to_restore_a_tokenizer(tmp_path, capsys, no_spawn):
    out = _lora_run(tmp_path)
    final = outdir.RunFolder(out).final
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    rc, stdout, err = _run(["merge", out, "--base", empty], capsys)
    assert rc == 2, stdout + err
    assert f"The base model {empty} (given with --base) cannot be loaded" in err
    assert "named in" not in err
    # the tokenizer missing: the fix restores the tokenizer, not the adapter files
    for tokenizer_file in final.glob("tokenizer*"):
        tokenizer_file.unlink()
    rc, stdout, err = _run(["merge", out], capsys)
    assert rc == 2, stdout + err
    assert "its tokenizer (tokenizer_config.json) is missing" in err
    assert "copy adapter_config.json and adapter_model.safetensors" not in err
    assert "save the base model's tokenizer there" in err and "AutoTokenizer.from_pretrained(" in err
    # done as it says, the folder merges
    from transformers import AutoTokenizer

    from launch.config import smoke

    AutoTokenizer.from_pretrained(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]).save_pretrained(final)
    rc, stdout, err = _run(["merge", out], capsys)
    assert rc == 0, stdout + err
    assert (outdir.RunFolder(out).merged / "tokenizer_config.json").is_file()


def test_merge_sends_a_missing_tokenizer_to_the_checkpoint_that_holds_it(tmp_path, capsys, no_spawn):
    out = _lora_run(tmp_path, checkpoint_tokenizer=True)
    final = outdir.RunFolder(out).final
    (final / "tokenizer_config.json").unlink()
    rc, stdout, err = _run(["merge", out], capsys)
    assert rc == 2, stdout + err
    assert f"copy the tokenizer files of {out / 'checkpoint-4'} (" in err and "tokenizer_config.json" in err
    assert "copy adapter_config.json and adapter_model.safetensors" not in err
