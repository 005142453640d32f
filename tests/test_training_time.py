"""Time and cost to train (launch/speed/training_time.py): the arithmetic redone by hand, the speed's error band
carried into the time, the refusals of what cannot be planned, and the GPU-count search for a target time (the
smallest count that meets it, monotone in the target, a CP recipe refused with the reason)."""

from __future__ import annotations

import json

import math
import re

import pytest

from launch.config.layout import Layout
from launch.errors import LaunchError
from launch.recipe.discovery import find_recipe
from launch.speed import training_time


def _layout(recipe: str) -> Layout:
    found = find_recipe(recipe)
    return Layout.from_configs(found.accelerate, found.config)


def test_time_gpu_hours_and_money_by_hand():
    """1e9 tokens at 7,000 tokens/s per GPU on 8 GPUs: 1e9 / 56,000 = 17,857 s (4 h 58 min); x 8 / 3600 = 39.7
    GPU-hours; x $3.00 = $119. The band (-10%, +20%): the true speed in [7000 / 1.2, 7000 / 0.9], the time in
    [0.9, 1.2] x 17,857 s = [16,071, 21,429] s (4 h 28 min - 5 h 57 min)."""
    t = training_time.plan(1e9, tokens_per_s_per_gpu=7000, gpus=8, band=(-0.10, 0.20), gpu_hour_cost=3.0)
    assert t.seconds == pytest.approx(17_857.142857)
    assert t.seconds_range == pytest.approx((16_071.428571, 21_428.571429))
    assert t.gpu_hours == pytest.approx(39.682540) and t.cost == pytest.approx(119.047619)
    assert t.describe() == ("1e9 tokens: 4 h 58 min on 8 GPUs (4 h 28 min - 5 h 57 min), 39.7 GPU-hours, $119 at "
                            "$3.00/GPU-hour")
    data = t.as_json()
    assert data["seconds_range"] == [16_071.4, 21_428.6] and data["gpu_hours_range"] == [35.71, 47.62]
    assert data["cost_usd"] == 119.05 and data["cost_usd_range"] == [107.14, 142.86]
    # the true time at the band's ends is the time at the true speed's: tokens / (7000 / (1 + e) x 8)
    assert t.seconds_range[1] == pytest.approx(1e9 / (7000 / 1.2 * 8))


def test_nodes_epochs_and_no_price():
    """3 epochs of 2.5e8 tokens = 7.5e8 tokens on 2 nodes x 8 at 5,000 tokens/s per GPU: 7.5e8 / 80,000 = 9,375 s
    (2 h 36 min), 41.7 GPU-hours; no price, no money."""
    t = training_time.plan(epochs=3, dataset_tokens=2.5e8, tokens_per_s_per_gpu=5000, gpus=8, nodes=2, band=(0, 0))
    assert t.tokens == 7.5e8 and t.seconds == pytest.approx(9375) and t.cost is None
    assert t.describe() == ("3 epochs of 2.5e8 tokens (7.5e8 tokens): 2 h 36 min on 16 GPUs (2 nodes x 8) "
                            "(2 h 36 min - 2 h 36 min), 41.7 GPU-hours")
    assert "cost_usd" not in t.as_json() and t.as_json()["epochs"] == 3
    free = training_time.plan(12_000, tokens_per_s_per_gpu=100, gpus=1, band=(-0.1, 0.1), gpu_hour_cost=0)
    assert free.describe() == "12,000 tokens: 2 min on 1 GPU (2 min - 2 min), 0.0 GPU-hours, $0.00 at $0.00/GPU-hour"
    assert training_time.duration_text(40) == "40 s" and training_time.duration_text(3600) == "1 h"
    assert training_time.duration_text(5 * 86400 + 3 * 3600) == "5 d 3 h"


@pytest.mark.parametrize("kwargs, says", [
    ({"tokens": 0}, "--tokens 0: give a positive, finite number of tokens"),
    ({"tokens": -5}, "--tokens -5"),
    ({"tokens": math.nan}, "--tokens nan"),
    ({"tokens": math.inf}, "--tokens inf"),
    ({"tokens": "many"}, "--tokens many"),
    ({"tokens": 0.0}, "--tokens 0: give"),
    ({"epochs": 0, "dataset_tokens": 1e6}, "--epochs 0: give a positive"),
    ({"epochs": 2}, "not known here (a plan reads no data); give it with --dataset-tokens N, or give --tokens N"),
    ({"epochs": 2, "dataset_tokens": -1}, "--dataset-tokens -1"),
    ({"tokens": 1e9, "epochs": 1, "dataset_tokens": 1e9}, "not both and not neither"),
    ({}, "not both and not neither"),
    ({"tokens": 1e9, "gpu_hour_cost": -1}, "--gpu-hour-cost -1: give a price in USD per GPU-hour, 0 or more"),
    ({"tokens": 1e9, "gpu_hour_cost": math.inf}, "--gpu-hour-cost inf"),
])
def test_what_cannot_be_planned_is_refused_in_one_sentence(kwargs, says):
    with pytest.raises(LaunchError) as e:
        training_time.plan(**kwargs, tokens_per_s_per_gpu=1000, gpus=8, band=(-0.1, 0.1))
    assert says in str(e.value) and str(e.value).count(". ") == 0 and str(e.value).endswith(".")
    with pytest.raises(LaunchError, match=re.escape(says)):  # the same, before any planning
        training_time.check(**kwargs)


def test_check_gives_the_tokens_and_refuses_a_bad_target_before_planning():
    assert training_time.check(epochs=2, dataset_tokens=5e8) == 1e9 == training_time.check(1e9, gpu_hour_cost=0)
    with pytest.raises(LaunchError, match="--target-hours nan: give a positive, finite number of hours"):
        training_time.check(1e9, target_hours=math.nan)


def test_the_smallest_gpu_count_that_meets_the_target():
    """1e10 tokens at a constant 10,000 tokens/s per GPU: 277.8 GPU-hours. Within 10 hours: 24 GPUs take 11.6 h,
    32 (4 nodes x 8) take 8.7 h: 32, the counts before it each tried and too slow."""
    ddp = _layout("ddp")
    found = training_time.gpus_for(10, 1e10, lambda per_node, nodes: 10_000, ddp)
    assert (found.gpus_per_node, found.nodes, found.gpus) == (8, 4, 32)
    assert found.hours == pytest.approx(1e10 / (10_000 * 32) / 3600)
    assert [(g, n) for g, n, _h in found.tried] == [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 3), (8, 4)]
    assert all(h > 10 for _g, _n, h in found.tried[:-1]) and found.tried[-2][2] == pytest.approx(1e10 / 240_000 / 3600)
    assert "32 GPUs (4 nodes x 8)" in found.describe() and "global batch grows" in found.describe()
    # monotone: a looser target never needs more GPUs, and the predicted hours fall as GPUs are added
    answers = [training_time.gpus_for(h, 1e10, lambda g, n: 10_000, ddp).gpus for h in (400, 200, 50, 10, 5, 1)]
    assert answers == sorted(answers) and answers[0] == 1
    hours = [h for _g, _n, h in training_time.gpus_for(1, 1e10, lambda g, n: 10_000, ddp).tried]
    assert hours == sorted(hours, reverse=True)
    # the band's slow end (+20%): 8.7 h x 1.2 = 10.4 h misses 10 h, 40 GPUs (8.3 h) meet it
    slow = training_time.gpus_for(10, 1e10, lambda g, n: 10_000, ddp, band=(-0.1, 0.2))
    assert slow.gpus == 40 and slow.slow_end


def test_the_per_gpu_speed_is_asked_for_each_count():
    """Communication included by the caller: a per-GPU speed that falls across nodes moves the answer up."""
    asked = []

    def speed(per_node, nodes):
        asked.append((per_node, nodes))
        return 10_000 * (0.5 if nodes > 1 else 1.0)

    found = training_time.gpus_for(10, 1e10, speed, _layout("fsdp2"))
    # 1e10 / (5,000 x 56) / 3600 = 9.9 h meets 10 h; 48 GPUs: 11.6 h (at a constant 10,000: 32 GPUs, above)
    assert found.gpus == 56 and found.hours == pytest.approx(1e10 / (5_000 * 56) / 3600)
    assert found.tried[-2][2] == pytest.approx(1e10 / (5_000 * 48) / 3600) and found.tried[-2][2] > 10
    assert asked == [(1, 1), (2, 1), (4, 1), (8, 1)] + [(8, n) for n in range(2, 8)]
    # a count the run's mesh cannot take is skipped (None), not tried
    even_nodes = training_time.gpus_for(10, 1e10, lambda g, n: None if n % 2 else 10_000, _layout("ddp"))
    assert even_nodes.gpus == 32 and [(g, n) for g, n, _h in even_nodes.tried] == [(8, 2), (8, 4)]
    assert "can run this layout" in training_time.gpus_for(10, 1e10, lambda g, n: None, _layout("ddp")).reason
    never = training_time.gpus_for(0.01, 1e10, lambda g, n: 10_000, _layout("ddp"), max_nodes=2)
    assert never.gpus is None and never.reason == ("not reached within 2 nodes of 8 GPUs: 16 GPUs (2 nodes x 8) "
                                                   "would take 17 h 22 min.")


def test_a_cp_recipe_is_refused_with_the_reason():
    found = training_time.gpus_for(10, 1e10, lambda g, n: pytest.fail("not searched"), _layout("ring-cp-8gpu"))
    assert found.gpus is None and "context-parallel mesh (8 GPUs per sequence)" in found.reason
    assert "is set by the sequence length" in found.describe() and found.as_json()["gpus"] is None
    assert training_time.scaling_problem(_layout("alst-ulysses-8gpu"))
    assert training_time.scaling_problem(_layout("ddp")) is None
    with pytest.raises(LaunchError, match="--target-hours 0: give a positive"):
        training_time.gpus_for(0, 1e10, lambda g, n: 1, _layout("ddp"))
    with pytest.raises(LaunchError, match="--target-hours inf"):
        training_time.gpus_for(math.inf, 1e10, lambda g, n: 1, _layout("ddp"))


def test_plan_prints_time_and_cost_and_its_json_holds_them(capsys):
    """`plan RECIPE --tokens 1e9`: the time and GPU-hours at the predicted speed, with the error band; the JSON has
    "error_band" and "training_time"; a cost or a target without a token count is refused."""
    from launch.__main__ import main

    assert main(["plan", "lora", "--gpus", "1", "--tokens", "1e9", "--gpu-hour-cost", "2.5"]) == 0
    out = capsys.readouterr().out
    assert "Time to train (the recipe's speed): 1e9 tokens:" in out and "GPU-hours" in out and "$" in out
    assert "tokens/s (-12%/+9%) per GPU" in out
    assert main(["plan", "lora", "--gpus", "1", "--tokens", "1e9", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"error_band", "training_time", "step_s", "communication", "gpu"} <= set(data)
    assert data["error_band"]["low"] < 0 < data["error_band"]["high"]
    assert main(["plan", "lora", "--gpus", "1", "--gpu-hour-cost", "2"]) == 2
    assert "give --tokens N or --epochs E" in capsys.readouterr().err
