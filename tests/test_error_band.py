"""The throughput model's error band (launch/speed/error_band.py): each measured row's leave-one-out error is computed
by refitting the rates without it (checked here by redoing one row through the same calls), the band is their range,
every row's in-sample prediction lies inside it, and a speed prints with the range the true speed may lie in."""

from __future__ import annotations

import pytest

from launch.facts import calibration
from launch.speed import error_band, model as throughput_model


def test_a_left_out_row_is_predicted_by_rates_refitted_without_it():
    """The first row (Qwen3-0.6B DDP), redone by hand: refit on the other rows, predict it, predicted / measured
    tokens/s - 1 (the same tokens per step: measured / predicted step time - 1)."""
    rows = calibration.MEASURED_ROWS
    row = rows[0]
    assert row.fit and not row.long_context
    rates = throughput_model.fit(list(rows[1:]))
    assert (rates.bandwidth, rates.issue_s) != (calibration.MEMORY_BOUND_BYTES_PER_S, calibration.KERNEL_ISSUE_S)
    [(_row, cost, step_error)] = throughput_model.row_errors([row], rates)
    by_hand = row.step_s / cost.step_s - 1
    assert by_hand == pytest.approx(1 / (1 + step_error) - 1)
    left_out = error_band.leave_one_out()[0]
    assert left_out.row is row and left_out.error == pytest.approx(by_hand, abs=1e-12)
    assert left_out.predicted_step_s == pytest.approx(cost.step_s, abs=1e-12)
    # out of sample it does worse than in sample: the refit no longer sees it
    assert abs(left_out.error) > abs(left_out.in_sample_error)


def test_a_kept_back_row_is_out_of_sample_already_and_the_attention_row_is_not_defined():
    found = {r.row: r for r in error_band.leave_one_out()}
    kept = [r for r in calibration.MEASURED_ROWS if not r.fit]
    assert kept
    for row in kept:  # refitting without it changes nothing: its error is the calibrated rates' error
        [(_row, cost, _e)] = throughput_model.row_errors([row])
        assert found[row].error == pytest.approx(row.step_s / cost.step_s - 1, abs=1e-12)
        assert found[row].error == pytest.approx(found[row].in_sample_error, abs=1e-12)
    long = [r for r in calibration.MEASURED_ROWS if r.long_context]
    assert len(long) == 1  # the attention fraction rests on it alone
    assert found[long[0]].error is None and "attention fraction" in found[long[0]].note


def test_the_band_is_the_range_of_the_left_out_errors_and_holds_every_in_sample_prediction():
    errors = [r.error for r in error_band.leave_one_out() if r.error is not None]
    low, high = error_band.band()
    assert (low, high) == (min(errors), max(errors)) and low < 0 < high
    for row, _cost, step_error in throughput_model.row_errors():
        if row.fit:
            assert low <= 1 / (1 + step_error) - 1 <= high, row
    assert error_band.band((0.5,)) == (low, 0.5) and error_band.band((-0.3, 0.01)) == (-0.3, high)
    with pytest.raises(ValueError):
        error_band.band((float("nan"),))


def test_the_stored_band_is_the_computed_one():
    """calibration.ERROR_BAND, which every plan prints its speeds with, is what the leave-one-out refits give (to the
    4 decimals it keeps): a change of the model or of the rows fails here until it is stored again."""
    assert error_band.calibrated() == tuple(round(x, 4) for x in error_band.band())


def test_format_speed_prints_where_the_true_speed_may_lie():
    """Errors are predicted / measured - 1: with (-0.0858, 0.1301) the true speed is in [7400 / 1.1301, 7400 /
    0.9142] = [6,548, 8,095]: 11.5% lower to 9.4% higher than the prediction."""
    band = (-0.0858, 0.1301)
    assert 7400 / 1.1301 == pytest.approx(6548, abs=1) and 7400 / 0.9142 == pytest.approx(8095, abs=1)
    assert error_band.true_range(band) == pytest.approx((6548 / 7400 - 1, 8095 / 7400 - 1), abs=2e-4)
    assert error_band.format_speed(7400, band) == "7,400 tokens/s (-12%/+9%)"
    assert error_band.format_speed(351.4, (-0.05, 0.0)) == "351 tokens/s (+0%/+5%)"
    low, high = error_band.band()
    assert error_band.format_speed(12_345.6, (low, high)).startswith("12,346 tokens/s (-")


def test_as_json_gives_each_rows_left_out_error():
    data = error_band.as_json()
    assert (data["low"], data["high"]) == tuple(round(x, 4) for x in error_band.band())
    assert len(data["rows"]) == len(calibration.MEASURED_ROWS)
    first = data["rows"][0]
    assert first["row"] == "Qwen3-0.6B ddp 2K, 4 x 1" and first["fitted"] is True
    assert first["predicted_tokens_per_s_per_gpu"] / first["measured_tokens_per_s_per_gpu"] - 1 == \
        pytest.approx(first["error"], abs=1e-3)
    assert data["true_speed_relative"][0] < 0 < data["true_speed_relative"][1]
    assert "extra_errors" in error_band.as_json((0.2,)) and error_band.as_json((0.2,))["high"] == 0.2
