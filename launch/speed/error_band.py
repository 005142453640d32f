"""The throughput model's error band: each measured row predicted by rates refitted without it (leave-one-out), and
the range of those errors, which a predicted tokens/s is printed with.

The 20% check of tests/test_fastest.py judges the model on the rows its rates were fitted to; that says how well the
rates fit, not how far a new run may land. Here each row of `calibration.MEASURED_ROWS` is left out in turn, the rates
refitted on the others by the model's own fit (`launch.speed.model.fit`), and the left-out row predicted with them
(`launch.speed.model.row_errors`): its error is predicted / measured tokens/s - 1 (at the row's tokens per step, so
measured step time / predicted step time - 1). A row kept back from the fit (`fit=False`) is out of sample already:
refitting without it changes nothing. The band is the smallest and the largest of these errors (and of any `extra`
errors given in the same convention: published multi-GPU rows, when there are some).

Reading it: a prediction `pred` with the band (low, high) says the true speed lies in [pred / (1 + high),
pred / (1 + low)]; `format_speed` prints that range relative to the prediction ("-12%/+9%": the real figure may be 12%
lower or 9% higher). The band was measured on the calibration GPU (an H100 SXM) and the published long-context run;
another GPU's rates are carried by a rule (`launch.speed.model.rates_for`), whose own error the band does not cover.

Not defined for every row: the attention fraction is fitted to the long-context rows alone; left out with no other
long-context row to refit it from, `fit` would keep the value that row gave, and its "left-out" prediction would be in
sample. Such a row is reported with its in-sample error and a note, outside the band.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from launch.facts import calibration
from launch.speed import model as throughput_model


@dataclass(frozen=True)
class LeftOut:
    """One measured row predicted with the rates refitted without it: `error` (predicted / measured tokens/s - 1),
    None where leaving it out is not defined (`note` says why); `in_sample_error` with the calibrated rates."""

    row: calibration.MeasuredRow
    tokens_per_step_per_gpu: int
    predicted_step_s: float | None
    error: float | None
    in_sample_error: float
    note: str = ""

    @property
    def label(self) -> str:
        r = self.row
        length = f"{r.max_length // 1024}K" if r.max_length < 1_048_576 else f"{r.max_length // 1_048_576}M"
        return (f"{r.model.split('--')[-1]} {r.recipe} {length}, {r.per_device_train_batch_size} x "
                f"{r.gradient_accumulation_steps}" + (", Liger" if r.liger else "")
                + ("" if r.fit else " (kept back)"))

    def as_json(self) -> dict:
        measured = self.tokens_per_step_per_gpu / self.row.step_s
        predicted = self.tokens_per_step_per_gpu / self.predicted_step_s if self.predicted_step_s else None
        return {"row": self.label, "fitted": self.row.fit,
                "measured_step_s": round(self.row.step_s, 4),
                "predicted_step_s": round(self.predicted_step_s, 4) if self.predicted_step_s else None,
                "measured_tokens_per_s_per_gpu": round(measured, 1),
                "predicted_tokens_per_s_per_gpu": round(predicted, 1) if predicted else None,
                "error": round(self.error, 4) if self.error is not None else None,
                "in_sample_error": round(self.in_sample_error, 4), **({"note": self.note} if self.note else {})}


def speed_error(row: calibration.MeasuredRow, cost: throughput_model.StepCost) -> float:
    """Predicted / measured tokens/s - 1 of `row` (the same tokens per step: measured / predicted step time - 1)."""
    return row.step_s / cost.step_s - 1


def _alone_fits_attention(row: calibration.MeasuredRow, others) -> bool:
    """`row` is the only fitted long-context row: the attention fraction rests on it alone (`throughput_model.fit`)."""
    return row.fit and row.long_context and not any(r.fit and r.long_context for r in others)


@functools.cache
def leave_one_out(rows: tuple = calibration.MEASURED_ROWS) -> tuple[LeftOut, ...]:
    """Each of `rows` predicted with `throughput_model.fit` refitted on the others (see the module docstring). About
    a second per fitted row."""
    # the calibrated rates are what `fit` gives from MEASURED_ROWS (tests/test_fastest.py holds them to it): not redone
    full = throughput_model.Rates() if rows == calibration.MEASURED_ROWS else throughput_model.fit(list(rows))
    fits = {tuple(r for r in rows if r.fit): full}  # by the rows a fit uses: leaving out a kept-back row is the fit
    out = []
    for i, (row, own, step_error) in enumerate(throughput_model.row_errors(list(rows), full)):
        others = rows[:i] + rows[i + 1:]
        in_sample_error = 1 / (1 + step_error) - 1  # row_errors gives the step time's error; here tokens/s
        if _alone_fits_attention(row, others):
            out.append(LeftOut(row, own.tokens_per_step_per_gpu, None, None, in_sample_error,
                               "the attention fraction is fitted to this row alone: refitted without it, it would "
                               "keep this row's value, so a left-out prediction is not defined"))
            continue
        key = tuple(r for r in others if r.fit)
        if key not in fits:
            fits[key] = throughput_model.fit(list(others))
        [(_row, cost, _step_error)] = throughput_model.row_errors([row], fits[key])
        out.append(LeftOut(row, cost.tokens_per_step_per_gpu, cost.step_s, speed_error(row, cost), in_sample_error))
    return tuple(out)


@functools.cache
def band(extra: tuple[float, ...] = ()) -> tuple[float, float]:
    """(low, high): the smallest and largest leave-one-out error (predicted / measured tokens/s - 1) over the
    measured rows and `extra` (errors of other rows, same convention). The true speed of a prediction `pred` lies in
    [pred / (1 + high), pred / (1 + low)]. Cached: the refits take a few seconds."""
    errors = [r.error for r in leave_one_out() if r.error is not None] + list(extra)
    if not errors or not all(math.isfinite(e) and e > -1 for e in errors):
        raise ValueError(f"an error band needs finite errors above -100%, got {errors}")
    return min(errors), max(errors)


def calibrated() -> tuple[float, float]:
    """The band of the calibration rows as `calibration.ERROR_BAND` keeps it (what `band()` computes from them,
    recomputed by tests/test_error_band.py), for a plan that must not pay the refits."""
    return calibration.ERROR_BAND


def summary_json(band_: tuple[float, float]) -> dict:
    """`plan --json`'s "error_band": the band and the true speed's range relative to a prediction (each row's
    leave-one-out error: `as_json`, `python -m launch.speed.error_band`)."""
    low, high = band_
    lower, higher = true_range(band_)
    return {"low": round(low, 4), "high": round(high, 4), "true_speed_relative": [round(lower, 4), round(higher, 4)],
            "how": "each measured row predicted by the throughput model's rates refitted without it (leave-one-out); "
                   "error = predicted / measured tokens/s - 1; the true speed lies in [predicted / (1 + high), "
                   "predicted / (1 + low)]; measured on an H100 SXM and TRL's published 1M-token run; the "
                   "communication model and rates carried to other GPUs are not covered"}


def true_range(band_: tuple[float, float]) -> tuple[float, float]:
    """Where the true value lies relative to the prediction, as fractions: (1 / (1 + high) - 1, 1 / (1 + low) - 1);
    (-0.115, 0.094): the true speed may be 11.5% lower or 9.4% higher than predicted."""
    low, high = band_
    return 1 / (1 + high) - 1, 1 / (1 + low) - 1


def format_speed(tokens_per_s: float, band_: tuple[float, float]) -> str:
    """"7,400 tokens/s (-12%/+9%)": the prediction and how far the true speed may lie from it (`true_range`: lower
    by the first, higher by the second). The band's convention: errors are predicted / measured - 1, so the true speed
    lies in [pred / (1 + high), pred / (1 + low)]."""
    lower, higher = true_range(band_)
    return f"{tokens_per_s:,.0f} tokens/s ({lower:+.0%}/{higher:+.0%})"


def as_json(extra: tuple[float, ...] = ()) -> dict:
    """`plan --json`'s "error_band": the band, the true speed's range relative to a prediction, and each row's
    leave-one-out error."""
    low, high = band(extra)
    lower, higher = true_range((low, high))
    return {"low": round(low, 4), "high": round(high, 4),
            "true_speed_relative": [round(lower, 4), round(higher, 4)],
            "how": "each measured row predicted by the throughput model's rates refitted without it (leave-one-out); "
                   "error = predicted / measured tokens/s - 1; the true speed lies in [predicted / (1 + high), "
                   "predicted / (1 + low)]; measured on an H100 SXM and TRL's published 1M-token run",
            "rows": [r.as_json() for r in leave_one_out()],
            **({"extra_errors": [round(e, 4) for e in extra]} if extra else {})}


if __name__ == "__main__":  # each row's leave-one-out error, as JSON
    import json

    print(json.dumps(as_json(), indent=2))
