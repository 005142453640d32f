"""`python -m launch compare`: fake run folders (no training), the PNG it draws, the table's numbers, the errors,
and `write_comparison` as the parity tests call it on failure."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import matplotlib.image as mpimg  # in the lock: a missing matplotlib fails here, not skipped

from launch.results import plots
from launch.commands import compare as compare_command
from launch.results.expected import TOLERANCE  # noqa: E402

STEPS = list(range(1, 13))
LOSS = [4.2118, 3.786, 3.5774, 3.3892, 3.1629, 2.9702, 2.7807, 2.6174, 2.4732, 2.319, 2.1831, 2.0756]
GRAD = [3.6038, 3.0948, 2.7806, 2.6068, 3.4875, 2.6564, 2.6509, 2.486, 2.3657, 2.2437, 2.2335, 2.1025]
LOSS_BUMP = (5, 2e-4)     # step, amount added to the loss of the perturbed run
GRAD_BUMP = (3, -0.05)    # step, amount added to its grad_norm


def write_run(folder, loss=LOSS, grad=GRAD, steps=STEPS, recipe=None, profile="smoke-cpu", extra_history=()):
    folder.mkdir(parents=True)
    history = [{"epoch": s / len(steps), "grad_norm": g, "learning_rate": 1e-4, "loss": l, "step": s}
               for s, l, g in zip(steps, loss, grad)]
    history += list(extra_history)
    history.append({"epoch": 1.0, "step": steps[-1] if steps else 0, "train_loss": 3.0, "train_runtime": 9.5})
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": len(steps), "log_history": history}))
    if recipe:
        (folder / "run_summary.json").write_text(json.dumps({"recipe": recipe, "profile": profile,
                                                             "observed": {"step": steps, "loss": loss}}))
    return folder


def perturbed(values, bump):
    step, amount = bump
    return [v + amount if s == step else v for s, v in zip(STEPS, values)]


@pytest.fixture
def runs(tmp_path):
    base = write_run(tmp_path / "ddp-run", recipe="ddp")
    same = write_run(tmp_path / "zero3-run", recipe="zero3")
    bumped = write_run(tmp_path / "zero2-run", loss=perturbed(LOSS, LOSS_BUMP), grad=perturbed(GRAD, GRAD_BUMP),
                       recipe="zero2")
    return base, same, bumped


def table_rows(text: str) -> dict[tuple[str, str], dict]:
    """(run label, metric) -> steps, max |diff|, mean diff, as printed."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(.+?)\s+(loss|grad_norm)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+) / (\S+)\s+(.*)$", line)
        if m:
            rows[(m[1].strip(), m[2])] = {"steps": int(m[3]), "max_abs": float(m[4]), "mean": float(m[5]),
                                          "tol_max": float(m[6]), "tol_mean": float(m[7]), "verdict": m[8]}
    return rows


def assert_plot(path, min_size=(600, 900)):
    """A real PNG, of a readable size, with something drawn on it (not one flat colour)."""
    assert path.is_file()
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    height, width = image.shape[:2]
    assert height >= min_size[0] and width >= min_size[1], image.shape
    rgb = image[..., :3]
    assert rgb.std() > 0.05  # not blank
    # coloured lines were drawn, not only black text and grey grids
    saturation = rgb.max(axis=2) - rgb.min(axis=2)
    assert (saturation > 0.3).mean() > 0.002
    return image


def test_compare_draws_the_plot_and_tabulates_the_perturbation(runs, tmp_path, capsys):
    base, same, bumped = runs
    out = tmp_path / "plots" / "cmp.png"
    assert compare_command.main([str(base), str(same), str(bumped), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert_plot(out)
    assert str(out.resolve()) in printed

    rows = table_rows(printed)
    assert set(rows) == {(lab, m) for lab in ("zero3-run [zero3/smoke-cpu]", "zero2-run [zero2/smoke-cpu]")
                         for m in ("loss", "grad_norm")}, printed
    for metric in ("loss", "grad_norm"):
        identical = rows[("zero3-run [zero3/smoke-cpu]", metric)]
        assert identical["steps"] == 12 and identical["max_abs"] == 0.0 and identical["mean"] == 0.0
        assert identical["verdict"] == "within"
    # the printed numbers are the perturbation made: max |diff| = |bump|, mean = bump / 12 (signed)
    for metric, (_, amount) in (("loss", LOSS_BUMP), ("grad_norm", GRAD_BUMP)):
        row = rows[("zero2-run [zero2/smoke-cpu]", metric)]
        assert row["steps"] == 12
        assert row["max_abs"] == pytest.approx(abs(amount), rel=1e-3)
        assert row["mean"] == pytest.approx(amount / 12, rel=1e-3)
        # TRL's tolerances, from launch.metrics.TOLERANCE, beside them
        assert (row["tol_max"], row["tol_mean"]) == (TOLERANCE[metric]["max_abs"], TOLERANCE[metric]["mean"])
        assert row["verdict"] == "ABOVE (mean)"  # |bump| is within max, bump/12 above the mean tolerance
    assert "differences from the first run, ddp-run [ddp/smoke-cpu]" in printed


def test_runs_are_matched_by_step_number_and_compared_on_common_steps(tmp_path, capsys):
    base = write_run(tmp_path / "full")
    # a run that logged steps 3..12 only (e.g. resumed), equal values, and step 7's loss shifted
    loss = [v + (1e-3 if s == 7 else 0.0) for s, v in zip(STEPS, LOSS)][2:]
    part = write_run(tmp_path / "part", loss=loss, grad=GRAD[2:], steps=STEPS[2:])
    out = tmp_path / "cmp.png"
    assert compare_command.main([str(base), str(part), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = table_rows(printed)
    assert rows[("part", "loss")]["steps"] == 10
    assert rows[("part", "loss")]["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert rows[("part", "loss")]["mean"] == pytest.approx(1e-4, rel=1e-3)
    assert rows[("part", "grad_norm")]["max_abs"] == 0.0
    assert "10 common steps (first run logged 12, this run 10)" in printed
    assert_plot(out)


def test_labels_without_a_summary_and_with_equal_folder_names(tmp_path, capsys):
    a = write_run(tmp_path / "ddp" / "smoke-cpu")
    b = write_run(tmp_path / "zero3" / "smoke-cpu")
    assert compare_command.main([str(a), str(b), "--out", str(tmp_path / "c.png")]) == 0
    printed = capsys.readouterr().out
    assert "differences from the first run, ddp/smoke-cpu" in printed
    assert ("zero3/smoke-cpu", "loss") in table_rows(printed)


def test_default_output_is_compare_png_in_the_current_folder(runs, tmp_path, monkeypatch, capsys):
    base, same, _ = runs
    work = tmp_path / "here"
    work.mkdir()
    monkeypatch.chdir(work)
    assert compare_command.main([str(base), str(same)]) == 0
    assert_plot(work / "compare.png")
    assert str(work / "compare.png") in capsys.readouterr().out


def test_a_missing_metric_at_some_step_keeps_steps_aligned(tmp_path, capsys):
    base = write_run(tmp_path / "a")
    other = write_run(tmp_path / "b", extra_history=[{"step": 13, "loss": 2.0}])  # no grad_norm at step 13
    assert compare_command.main([str(base), str(other), "--out", str(tmp_path / "c.png")]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows[("b", "loss")]["steps"] == 12 and rows[("b", "loss")]["max_abs"] == 0.0
    assert rows[("b", "grad_norm")]["steps"] == 12 and rows[("b", "grad_norm")]["max_abs"] == 0.0


@pytest.mark.parametrize("case", ["missing folder", "no trainer_state.json", "no loss logged", "bad json"])
def test_unusable_run_folder_exits_2_naming_it(runs, tmp_path, capsys, case):
    base = runs[0]
    bad = tmp_path / "bad-run"
    if case != "missing folder":
        bad.mkdir()
    if case == "no loss logged":
        (bad / "trainer_state.json").write_text(json.dumps({"log_history": [
            {"step": 2, "eval_loss": 3.1}, {"step": 2, "train_loss": 3.0, "train_runtime": 1.0}]}))
    if case == "bad json":
        (bad / "trainer_state.json").write_text('{"log_history": [')
    out = tmp_path / "cmp.png"
    assert compare_command.main([str(base), str(bad), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and str(bad) in err, err
    assert str(base) not in err
    assert "Traceback" not in captured.err + captured.out
    expected = {"missing folder": "no such folder", "no trainer_state.json": "no trainer_state.json",
                "no loss logged": "no per-step loss", "bad json": "not readable JSON"}[case]
    assert expected in err
    assert not out.exists()


def test_a_folder_with_only_checkpoints_points_to_the_newest(runs, tmp_path, capsys):
    stopped = tmp_path / "stopped"
    for n in (3, 12):
        (stopped / f"checkpoint-{n}").mkdir(parents=True)
        (stopped / f"checkpoint-{n}" / "trainer_state.json").write_text("{}")
    assert compare_command.main([str(runs[0]), str(stopped), "--out", str(tmp_path / "c.png")]) == 2
    assert str(stopped / "checkpoint-12") in capsys.readouterr().err


def test_argument_errors_exit_2(runs, tmp_path, capsys):
    assert compare_command.main([str(runs[0])]) == 2
    assert "give at least two run folders" in capsys.readouterr().err
    assert compare_command.main([str(runs[0]), str(runs[1]), "--out", str(tmp_path / "c.svg")]) == 2
    assert "c.svg" in capsys.readouterr().err


def test_write_comparison_for_parity_failures(tmp_path):
    """What a parity test calls when it fails: (label, observed) pairs as in run_summary.json."""
    ddp = {"step": STEPS, "loss": LOSS, "grad_norm": GRAD}
    zero3 = {"step": STEPS, "loss": perturbed(LOSS, LOSS_BUMP), "grad_norm": GRAD}
    out = tmp_path / "parity" / "ddp-vs-zero3.png"
    table = plots.write_comparison([("ddp", ddp), ("zero3", zero3)], out)
    assert_plot(out)
    rows = table_rows(table)
    assert rows[("zero3", "loss")]["max_abs"] == pytest.approx(LOSS_BUMP[1], rel=1e-3)
    assert rows[("zero3", "grad_norm")]["max_abs"] == 0.0

    # the parity tests' own limits and title; odd input (nan, a missing metric, a shorter run) is still drawn
    limits = {"loss": {"max_abs": 1e-5, "mean": 1e-5}, "grad_norm": {"max_abs": 1e-5, "mean": 1e-5}}
    broken = {"step": STEPS[:6], "loss": LOSS[:5] + [float("nan")]}
    out2 = tmp_path / "odd.png"
    table = plots.write_comparison([("ddp", ddp), ("zero3", zero3), ("broken", broken)], out2,
                                     tolerance=limits, title="test_zero_stages_match_ddp[zero3]")
    assert_plot(out2)
    assert "1e-05 / 1e-05" in table and "TRL" not in table
    assert "broken" in table and "nan" in table and "no common steps" in table
    assert "not finite (nan/inf in either run) at step(s) 6" in table


def test_symlog_when_differences_span_decades(tmp_path):
    """One run equal up to float rounding, one far off: the difference panels use symlog so both show."""
    from matplotlib.figure import Figure

    ddp = {"step": STEPS, "loss": LOSS, "grad_norm": GRAD}
    close = {"step": STEPS, "loss": [v + 2.4e-7 for v in LOSS], "grad_norm": GRAD}
    far = {"step": STEPS, "loss": [v + 0.02 for v in LOSS], "grad_norm": GRAD}
    fig = Figure()
    ax = fig.subplots()
    runs = [("ddp", ddp), ("close", close), ("far", far)]
    plots._draw_differences(ax, [d for d in plots.differences(runs) if d.metric == "loss"], "loss",
                              ["black", "C0", "C1"], True, TOLERANCE["loss"], "TRL tolerance")
    assert ax.get_yscale() == "symlog"
    ax2 = fig.subplots()
    plots._draw_differences(ax2, [d for d in plots.differences(runs[:2]) if d.metric == "loss"], "loss",
                              ["black", "C0"], True, TOLERANCE["loss"], "TRL tolerance")
    assert ax2.get_yscale() == "linear"
    assert np.isfinite(ax2.get_ylim()).all()


def test_a_failing_parity_check_writes_the_plot_and_the_table(tmp_path, monkeypatch):
    """helpers.launcher.assert_parity, which the parity tests use: a miss raises with the compare table and a PNG
    path."""
    from helpers import launcher

    monkeypatch.setattr(launcher, "PARITY_PLOTS", tmp_path)
    first = {"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0], "grad_norm": [1.0, 1.0, 1.0]}
    close = {"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0 + 1e-7], "grad_norm": [1.0, 1.0, 1.0]}
    launcher.assert_parity("same", [("a", first), ("b", close)], {"loss": 1e-5, "grad_norm": 1e-5})
    assert not (tmp_path / "same.png").exists()
    off = {"step": [1, 2, 3], "loss": [3.0, 2.1, 1.0], "grad_norm": [1.0, 1.0, 1.0]}
    with pytest.raises(AssertionError) as e:
        launcher.assert_parity("off", [("a", first), ("b", off)], {"loss": 1e-5, "grad_norm": 1e-5})
    message = str(e.value)
    assert "b loss: max |diff| 0.1 >= 1e-05" in message and f"plot: {tmp_path / 'off.png'}" in message
    assert (tmp_path / "off.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1.000e-01" in message  # the compare table's max |diff| column
