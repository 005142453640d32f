"""`python -m launch plan` never plans what the run itself refuses: a mesh the target's GPUs cannot hold (the run's own
check, `launch.config.layout.processes_problem`, behind the rule `processes_fit_layout`), training arguments the run's
rules refuse (the deprecated `gradient_checkpointing` beside `activation_checkpointing`); and `plan --fastest` exits
as a run with `--fastest` would: 0 when the search found a setting that fits."""

from __future__ import annotations

import json

import pytest

from launch.__main__ import main
from launch.checks import rules
from launch.config.options import Options
from launch.run.resolve import resolve


def plan(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["plan", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, mesh, processes, sizes", [
    # a 72B full fine-tune's 24-way shard on one GPU (~1.1 TiB of model states) was planned as fitting 63.6 GiB
    (("fsdp2-70b", "--gpus", "1"), "dp_shard=24", 1, ("--gpus 8 --nodes 3", "--dp-shard-size 1 on these 1 GPU(s)")),
    (("fsdp2-70b", "--gpus", "1", "--fastest"), "dp_shard=24", 1, ("--gpus 8 --nodes 3",)),
    # the 24-way shard on one 8-GPU node
    (("fsdp2-70b", "--gpus", "8"), "dp_shard=24", 8, ("--gpus 8 --nodes 3", "--dp-shard-size 8 on these 8 GPU(s)")),
    # cp=8 on 2 GPUs
    (("ring-cp-8gpu", "--gpus", "2"), "cp=8", 2, ("--gpus 8", "--cp-size 2 on these 2 GPU(s)")),
    # sp=8 on one GPU
    (("alst-ulysses-8gpu", "--gpus", "1", "--fastest"), "sp=8", 1, ("--gpus 8", "--sp-size 1 on these 1 GPU(s)")),
])
def test_a_mesh_the_target_gpus_cannot_hold_is_refused_before_planning(capsys, argv, mesh, processes, sizes):
    rc, out, err = plan(capsys, *argv)
    assert rc == 2, out + err
    assert out == ""  # nothing planned: no table, no candidates
    assert mesh in err and f"does not use {processes} processes" in err
    assert "refuses this layout before it starts" in err and "nothing is planned" in err
    for size in sizes:
        assert size in err
    # the same check as the run's dry run: the rule's own sentence, for the same processes
    recipe = argv[0]
    setup = resolve(Options(recipe=recipe, num_processes=processes, num_machines=1), progress=lambda *_: None)
    said = rules.processes_fit_layout(setup, rules.Facts())
    assert said is not None and said.split(":")[0] in err


def test_the_sizes_the_refusal_names_are_planned(capsys):
    rc, out, err = plan(capsys, "ring-cp-8gpu", "--gpus", "2", "--cp-size", "2")
    assert rc in (0, 1) and "cp=2" in out, err
    rc, out, err = plan(capsys, "fsdp2-70b", "--gpus", "8", "--nodes", "3")
    assert rc == 0 and "dp_shard=24" in out, err


def test_fastest_exits_0_when_the_search_found_a_setting_that_fits(capsys):
    # one 24 GiB GPU: the lora recipe's own settings do not fit, the fastest search finds one that does
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "24", "--fastest", "--json")
    data = json.loads(out)
    assert data["fits"] is False and data["fastest"] is not None and data["fastest"]["fits"] is True
    assert rc == 0, err
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "24", "--fastest")
    assert rc == 0, err
    assert "Exit status 0: the recipe's own settings do not fit, the fastest setting that fits does" in out
    # without --fastest the recipe's own settings are judged: they do not fit
    rc, _, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "24")
    assert rc == 1, err


def test_fastest_exits_1_when_nothing_fits(capsys):
    rc, out, err = plan(capsys, "lora", "--gpus", "1", "--gpu-memory", "4", "--fastest", "--json")
    assert rc == 1, err
    assert json.loads(out)["fastest"] is None


@pytest.mark.parametrize("fastest", [(), ("--fastest",)])
def test_the_deprecated_checkpointing_name_is_refused_as_the_run_refuses_it(capsys, fastest):
    # transformers ignores `gradient_checkpointing` when `activation_checkpointing` is set (the ddp recipe sets it):
    # the run's rule checkpointing_one_name refuses it, and the plan runs the same rule
    rc, out, err = plan(capsys, "ddp", *fastest, "--", "--gradient_checkpointing", "true")
    assert rc == 2, out + err
    assert out == ""
    assert "would be refused before it starts" in err
    setup = resolve(Options(recipe="ddp", extra=["--gradient_checkpointing", "true"]), progress=lambda *_: None)
    said = rules.checkpointing_one_name(setup, rules.Facts())
    assert said is not None and said in err


def test_the_current_checkpointing_name_is_planned(capsys):
    rc, out, err = plan(capsys, "ddp", "--fastest", "--", "--activation_checkpointing", "true")
    assert rc == 0, err
    assert "kept as given after `--`: activation_checkpointing" in out
