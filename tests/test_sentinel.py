"""The first-steps loss sentinel (launch/results/sentinel.py): the band's schema, what the launcher hands the ranks, the
callback's checks, and two real CPU runs through `python -m launch` with a band recorded from the right setup: a run
broken on purpose (the model's RoPE changed, the trap of TRL PR #6846) stops after its first logged step on every
rank with the message, and the right setup passes.

The smoke model is random (its first loss is ln(64) whatever the RoPE), so the module trains it first, in-process,
for a few seconds on the smoke data (sorting number words), until its loss depends on positions."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.launcher import launch_in_process
from launch.results import sentinel
from launch.rank import sentinel as rank_sentinel
from launch.recipe.discovery import RECIPES_DIR

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
GOOD = {"steps": 1, "low": 3.0, "high": 6.0, "source": "TRL PR #6846: 4.4 with YaRN, 10.6 without"}
# The broken setup: linear RoPE scaling x8 on a model trained without it (positions squeezed 8-fold)
WRONG_ROPE = {"rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0}}


# ---- schema ---------------------------------------------------------------------------------------------------------
def test_a_valid_band_and_no_band_have_no_problems():
    assert sentinel.band_problems({"first_loss_band": GOOD}) == []
    assert sentinel.band_problems({"first_loss_band": {**GOOD, "recorded_with": {"max_length": 1048576}}}) == []
    assert sentinel.band_problems({"steps": {"loss": [1.0]}}) == []  # a smoke entry without a band
    assert sentinel.band_problems(None) == []


@pytest.mark.parametrize("band,expected", [
    ({**GOOD, "low": float("nan")}, "low must be a finite number"),
    (json.loads('{"steps": 1, "low": 3.0, "high": NaN, "source": "x"}'), "high must be a finite number"),
    ({**GOOD, "high": float("inf")}, "high must be a finite number"),
    ({**GOOD, "low": "3"}, "low must be a finite number"),
    ({**GOOD, "low": True}, "low must be a finite number"),
    ({**GOOD, "low": 6.0, "high": 3.0}, "must be below"),
    ({**GOOD, "low": -1.0}, "must be >= 0"),
    ({**GOOD, "steps": 0}, "steps must be an integer >= 1"),
    ({**GOOD, "steps": 1.5}, "steps must be an integer >= 1"),
    ({**GOOD, "source": " "}, "source must say where"),
    ({k: v for k, v in GOOD.items() if k != "high"}, "high is missing"),
    ({**GOOD, "hgih": 5.0}, "hgih is not a known key"),
    ({**GOOD, "recorded_with": [1]}, "recorded_with must be an object"),
    ([3.0, 6.0], "must be an object"),
])
def test_band_problems_are_named(band, expected):
    problems = sentinel.band_problems({"first_loss_band": band})
    assert any(expected in p for p in problems), problems


def test_env_for_hands_the_band_to_the_ranks_and_refuses_an_invalid_one():
    env = sentinel.env_for({"first_loss_band": GOOD}, recipe="ring-cp-8gpu", profile="full-gpu")
    assert list(env) == [sentinel.ENV]
    assert json.loads(env[sentinel.ENV]) == {**GOOD, "recipe": "ring-cp-8gpu", "profile": "full-gpu"}
    assert sentinel.env_for({"steps": {}}) == {}
    with pytest.raises(ValueError, match="finite number"):
        sentinel.env_for({"first_loss_band": {**GOOD, "low": float("nan")}})


def test_mismatch_names_what_the_band_was_not_recorded_with():
    band = {**GOOD, "recorded_with": {"max_length": 1048576, "model_name_or_path": "Qwen/Qwen3-8B"}}
    assert sentinel.mismatch(band, {"max_length": 1048576, "model_name_or_path": "Qwen/Qwen3-8B"}) == []
    assert sentinel.mismatch(band, {"max_length": 8192, "model_name_or_path": "Qwen/Qwen3-8B"}) == [
        "max_length: recorded with 1048576, this run has 8192"]


QWEN3_8B = REPO / "docs" / "model_configs" / "Qwen--Qwen3-8B"
YARN = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 32.0,
                            "original_max_position_embeddings": 32768}}


def _config(folder):
    from launch.facts import hub

    return hub.read_model_config(str(folder)).config


def test_the_band_is_keyed_by_what_the_run_is_not_by_the_models_path(tmp_path):
    """Ring-cp-8gpu's band holds for Qwen3-8B's architecture at 1M tokens, wherever its config is read
    from (a local copy of the weights keeps the band), and not for another architecture, RoPE base or length."""
    band = json.loads((RECIPES_DIR / "ring-cp-8gpu" / "expected_metrics.json").read_text())[
        "profiles"]["full-gpu"]["first_loss_band"]
    assert "model_name_or_path" not in band["recorded_with"]
    copy = tmp_path / "my-copy-of-qwen3-8b"
    shutil.copytree(QWEN3_8B, copy)
    for name in (str(QWEN3_8B), str(copy)):
        training = {"model_name_or_path": name, "max_length": 1048576, "model_init_kwargs": YARN}
        assert sentinel.mismatch(band, training, _config(name)) == []
    # the trap the band is for (YaRN left out) keeps the band on: the RoPE compared is the model's own
    assert sentinel.mismatch(band, {"max_length": 1048576}, _config(copy)) == []
    other = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**other, "num_hidden_layers": 28, "rope_theta": 10000}))
    from launch.facts import hub

    hub.read_model_config.cache_clear()
    differences = sentinel.mismatch(band, {"max_length": 1048576}, _config(copy))
    assert [d.split(":")[0] for d in differences] == ["model", "rope"], differences
    assert sentinel.mismatch(band, {"max_length": 8192}, _config(QWEN3_8B)) == [
        "max_length: recorded with 1048576, this run has 8192"]
    assert sentinel.mismatch(band, {"max_length": 1048576}, None)[0].startswith(
        "model: recorded with")  # the config not read: off, and said


def test_the_layout_can_key_a_band():
    from launch.config.layout import Layout

    band = {**GOOD, "recorded_with": {"layout": {"world_size": 8}}}
    layout = SimpleNamespace(world_size=8, mesh={"cp": 8})
    assert sentinel.mismatch(band, {}, None, layout) == []
    assert sentinel.mismatch(band, {}, None, SimpleNamespace(world_size=4, mesh={"cp": 4})) == [
        "layout: recorded with {'world_size': 8}, this run has {'world_size': 4, 'mesh': {'cp': 4}}"]
    assert Layout  # the real layout has these attributes (launch.config.layout)


@pytest.mark.parametrize("shape", [
    {},  # the smoke model: vocab 64, hidden 64
    {"vocab_size": 32000, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
     "intermediate_size": 1024},  # a Llama-2-sized vocabulary
])
def test_a_random_model_starts_inside_the_random_init_band(shape):
    """The band every synthetic run gets (about ln(vocab)), against the loss random init gives on random tokens."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from launch.config import smoke

    base = AutoConfig.from_pretrained(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"])
    config = base.__class__(**{**base.to_dict(), **shape})
    band = sentinel.random_init_band(config)
    chance = math.log(config.vocab_size)
    assert band["low"] == pytest.approx(chance - sentinel.RANDOM_BELOW, abs=1e-3) and band["kind"] == "random_init"
    predicted = chance + 0.02 ** 2 * config.hidden_size / 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        tokens = torch.randint(0, config.vocab_size, (2, 256))
        with torch.no_grad():
            loss = model(input_ids=tokens, labels=tokens).loss.item()
    # measured: within 0.03 of the prediction (smoke: 4.1715 for 4.1717; 32000 x 512: 10.446 for 10.476)
    assert loss == pytest.approx(predicted, abs=0.1)
    assert band["low"] < loss < band["high"]
    # what the band is there to catch: a loss averaged wrongly over 2 ranks, or summed over the tokens
    assert not band["low"] < loss / 2 < band["high"] and not band["low"] < loss * 2 < band["high"]


def test_every_synthetic_run_gets_the_random_init_band(capsys):
    from launch.__main__ import main

    rc = main(["ddp", "--smoke", "--cpu", "--synthetic", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "loss sentinel: the first 1 logged loss(es) must lie in [3.6589, 5.1717] (a random model on random " \
           "tokens starts at ln(vocab 64) = 4.159" in out
    rc = main(["ddp", "--smoke", "--cpu", "--synthetic", "--dry-run", "--no-loss-sentinel"])
    assert rc == 0 and "loss sentinel off (--no-loss-sentinel)" in capsys.readouterr().out


def test_a_random_init_band_names_the_numerics_traps():
    band = sentinel.random_init_band(SimpleNamespace(vocab_size=151936, hidden_size=4096, initializer_range=0.02))
    env = sentinel.env_for({sentinel.KEY: band}, recipe="zero3", profile="full-gpu")
    cb = rank_sentinel.sentinel_callback(json.loads(env[sentinel.ENV]))
    with pytest.raises(rank_sentinel.FirstLossError) as err:
        _log(cb, 1, {"loss": 11.93 / 8})  # divided by a CP size of 8 once too often
    assert "the loss reduced wrongly over the ranks" in str(err.value) and "RoPE" not in str(err.value)


# ---- the callback ---------------------------------------------------------------------------------------------------
def _log(cb, step, logs):
    cb.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)


def test_the_callback_stops_on_the_first_logged_loss_outside_the_band(tmp_path):
    cb = rank_sentinel.sentinel_callback({**GOOD, "recipe": "ring-cp-8gpu", "profile": "full-gpu"}, folder=tmp_path)
    _log(cb, 0, {"eval_loss": 99.0})  # not a training loss: ignored
    with pytest.raises(rank_sentinel.FirstLossError) as err:
        _log(cb, 1, {"loss": 10.6, "grad_norm": 3.0})
    first_line = str(err.value).splitlines()[0]
    assert "10.6 at step 1" in first_line and "[3, 6]" in first_line and "ring-cp-8gpu full-gpu" in first_line
    for trap in ("RoPE scaling not applied", "packing across documents", "wrong dtype or precision",
                 "wrong chat template or labels"):
        assert trap in first_line
    verdict = sentinel.read_verdict(tmp_path)
    assert verdict["verdict"] == "stopped" and verdict["losses"] == [{"step": 1, "loss": 10.6}]


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), 2.99])
def test_nan_infinite_and_low_losses_stop_too(loss):
    cb = rank_sentinel.sentinel_callback(GOOD)
    with pytest.raises(rank_sentinel.FirstLossError):
        _log(cb, 1, {"loss": loss})


def test_only_the_first_steps_logs_are_checked(tmp_path):
    cb = rank_sentinel.sentinel_callback({**GOOD, "steps": 2}, folder=tmp_path)
    _log(cb, 10, {"loss": 4.4})
    _log(cb, 20, {"loss": 5.9})
    _log(cb, 30, {"loss": 42.0})  # past the checked logs: training may go anywhere later
    verdict = sentinel.read_verdict(tmp_path)
    assert verdict["verdict"] == "passed" and [x["step"] for x in verdict["losses"]] == [10, 20]


# ---- real runs -------------------------------------------------------------------------------------------------------
def _chat_batch(tokenizer, n: int | None = None):
    """The smoke training chats as one padded batch: (input_ids, labels), padding masked out of the labels."""
    import torch

    from launch.config import smoke

    rows = [json.loads(line) for line in open(Path(smoke.data_dir()) / "train.jsonl")][:n]
    ids = [tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"] for r in rows]
    length = max(map(len, ids))
    x = torch.full((len(ids), length), tokenizer.pad_token_id)
    labels = torch.full((len(ids), length), -100)
    for i, s in enumerate(ids):
        x[i, :len(s)] = labels[i, :len(s)] = torch.tensor(s)
    return x, labels


def _first_losses(model_dir, rope=None, n=64):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    x, labels = _chat_batch(AutoTokenizer.from_pretrained(model_dir), n)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **(rope or {}))
    with torch.no_grad():
        return model(input_ids=x, labels=labels).loss.item()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The smoke model trained for 200 steps in-process (about 3 s): its loss now depends on positions. Returns the
    folder and the band recorded from the right setup: from half its loss to halfway to the broken setup's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launch.config import smoke

    assets = smoke.ensure_smoke_assets(progress=lambda *_: None)
    tokenizer = AutoTokenizer.from_pretrained(assets["model"])
    x, labels = _chat_batch(tokenizer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 0.1M-parameter model: one thread, no spinning against the other processes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(200):
            batch = torch.randint(0, len(x), (16,))
            model(input_ids=x[batch], labels=labels[batch]).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("trained") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    right, broken = _first_losses(folder), _first_losses(folder, WRONG_ROPE)
    band = {"steps": 1, "low": round(right / 2, 3), "high": round((right + broken) / 2, 3),
            "source": f"the right setup's loss {right:.3f} (RoPE x8 gives {broken:.3f}), test_sentinel.py"}
    return folder, band, right, broken


def _run(tmp_path, trained, *training_args, max_steps=3):
    """A copy of the ddp recipe whose expected_metrics.json holds the band for its smoke-cpu profile, run through the
    launcher (in-process), which reads the band and hands it to the ranks (launch.run.runner.loss_sentinel)."""
    folder, band, _, _ = trained
    recipe = tmp_path / "ddp-with-band"
    shutil.copytree(RECIPES_DIR / "ddp", recipe)
    expected = json.loads((recipe / "expected_metrics.json").read_text())
    expected["profiles"]["smoke-cpu"]["first_loss_band"] = band
    (recipe / "expected_metrics.json").write_text(json.dumps(expected, indent=2))
    out = tmp_path / "out"
    proc = launch_in_process(recipe, "--smoke", "--cpu", "--output-dir", out, "--max-steps", max_steps, "--",
                             "--model_name_or_path", folder, *training_args)
    return proc, out


@pytest.mark.long
def test_the_trained_model_depends_on_its_rope(trained):
    """The premise of the broken run: the right setup's loss sits inside the band, the broken one's above it."""
    _, band, right, broken = trained
    assert band["low"] < right < band["high"] < broken
    assert broken > 1.2 * right


@pytest.mark.long
def test_a_run_with_the_wrong_rope_stops_after_its_first_logged_step(tmp_path, trained):
    proc, out = _run(tmp_path, trained, "--model_init_kwargs", json.dumps(WRONG_ROPE))
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    log = (out / "launch.log").read_text()
    assert log.count("FirstLossError: first-steps loss sentinel") == 2, log[-3000:]  # both ranks raised
    # the launcher quotes the first failure, with the traps
    assert "first-steps loss sentinel: logged loss" in text and "RoPE scaling not applied" in text
    verdict = sentinel.read_verdict(out / ".launch" / "heartbeat")
    assert verdict["verdict"] == "stopped" and [x["step"] for x in verdict["losses"]] == [1]
    assert not math.isfinite(verdict["losses"][0]["loss"]) or verdict["losses"][0]["loss"] > verdict["band"]["high"]
    assert "'loss'" in log and log.count("'loss'") == 1  # one logged step, then stopped (3 were asked for)


@pytest.mark.long
def test_the_right_setup_passes_its_band(tmp_path, trained):
    proc, out = _run(tmp_path, trained, max_steps=1)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    verdict = sentinel.read_verdict(out / ".launch" / "heartbeat")
    assert verdict["verdict"] == "passed", verdict
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["loss_sentinel"]["verdict"] == "passed"
    assert "loss sentinel: the first 1 logged loss(es)" in proc.stdout
