"""The published parity matrix (docs/parity.md, docs/parity.json, written by benchmarks/parity_matrix.py) is there
and says what it must: every family in both precisions at accumulation 1 and 2 and as a resume pair, each row
either within its tolerance, marked failed with a note, or not run with its reason; every tolerance either the
suite's (naming its test) or proposed with a reason; and the environment block names the versions. Fast: reads the
report, trains nothing."""

from __future__ import annotations

import copy
import json
import math

import pytest

from helpers.launcher import REPO

DOC, JSON = REPO / "docs" / "parity.md", REPO / "docs" / "parity.json"
FAMILIES = ("ddp", "zero1", "zero2", "zero3", "zero3-offload", "fsdp2", "hsdp", "lora", "qlora", "cp2", "cp4", "cp8",
            "alst")
PRECISIONS = ("fp32", "bf16")
KINDS = ("1", "2", "resume")  # accumulation 1, accumulation 2, resume
VERSIONS = ("torch", "transformers", "accelerate", "deepspeed", "trl", "peft")


def report_problems(report: dict) -> list[str]:
    """What the report lacks: a (family, precision, accumulation) row, a verdict that agrees with its numbers, a reason
    for a row that did not run, a source or reason for its tolerance."""
    problems = []
    rows = {(r["family"], r["precision"], r["accumulation"]): r for r in report["rows"]}
    for wanted in ((f, p, k) for f in FAMILIES for p in PRECISIONS for k in KINDS):
        if wanted not in rows:
            problems.append(f"no row for {' '.join(wanted)}")
    for (family, precision, kind), row in rows.items():
        name, tol, status = f"{family} {precision} {kind}", row["tolerance"], row["status"]
        if not tol.get("source") or (tol["source"] == "none in the suite" and not tol.get("proposed")):
            problems.append(f"{name}: its tolerance names neither the suite's test nor a reason")
        if status == "pass":
            for metric in ("loss", "grad_norm"):
                value = row.get(metric)
                if value is None or not math.isfinite(value) or not value < tol[metric]:
                    problems.append(f"{name}: passed with {metric} {value} against a tolerance of {tol[metric]}")
        elif status in ("fail", "could not run", "not run"):
            if len((row.get("note") or "").strip()) <= len("not run"):
                problems.append(f"{name}: {status} without a note saying why")
        else:
            problems.append(f"{name}: unknown status {status!r}")
    return problems


@pytest.fixture(scope="module")
def report():
    assert DOC.is_file() and JSON.is_file(), "run benchmarks/parity_matrix.py"
    return json.loads(JSON.read_text())


def test_the_report_covers_every_family_and_each_row_is_judged(report):
    assert report_problems(report) == []


def test_the_coverage_check_finds_a_missing_family_and_an_unjudged_row(report):
    trimmed = copy.deepcopy(report)
    trimmed["rows"] = [r for r in trimmed["rows"] if r["family"] != "zero2"]
    assert {f"no row for zero2 {p} {k}" for p in PRECISIONS for k in KINDS} <= set(report_problems(trimmed))
    passed = copy.deepcopy(report)
    row = passed["rows"][0]
    row.update(status="pass", loss=row["tolerance"]["loss"] * 2, grad_norm=0.0)
    assert any("passed with loss" in p for p in report_problems(passed))
    silent = copy.deepcopy(report)
    silent["rows"][0].update(status="could not run", note="")
    assert any("without a note" in p for p in report_problems(silent))


def test_the_page_shows_every_row_the_environment_and_the_command(report):
    page = DOC.read_text()
    env = report["environment"]
    for name in VERSIONS:
        assert env["versions"].get(name), name
        assert f"{name} {env['versions'][name]}" in page, name
    for fact in (env["date"], env["python"], f"{env['cores']} cores", "benchmarks/parity_matrix.py"):
        assert str(fact) in page, fact
    assert report["timing"]["text"] in page
    table = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| family")]
    assert len(table) == len(report["rows"])
