"""The one step-by-step difference of two runs' per-step metrics, used by the smoke judge (`launch.results.judge`), the
run plots (`launch.results.plots`) and the parity tests.

Aligned by step, not by position: a run that logged steps 1-12 and one that logged 1-7 are compared on steps 1-7,
and both counts are kept so that the caller can say which steps were missing. NaN-aware: a NaN or inf on either
side makes the difference at that step NaN, and `max_abs` of such a comparison is NaN, which no limit accepts
(`nan <= limit` is False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METRICS = ("loss", "grad_norm")


def by_step(observed: dict, metric: str) -> dict[int, float]:
    """{step: value} of one metric. Values are parallel to observed["step"] (steps 1..n when it is absent, as in an
    expected_metrics.json entry); None marks a step that did not log the metric."""
    values = list(observed.get(metric) or [])
    steps = list(observed.get("step") or range(1, len(values) + 1))
    out = {}
    for s, v in zip(steps, values):
        if v is None:
            continue
        try:
            out[int(s)] = float(v)
        except (TypeError, ValueError):
            continue
    return out


@dataclass
class Diff:
    label: str
    metric: str
    steps: list[int]          # the steps both runs logged this metric at
    diffs: list[float]        # run - reference, at those steps
    n_reference: int          # steps the reference logged this metric at
    n_run: int                # steps this run logged it at

    @property
    def max_abs(self) -> float | None:
        if not self.diffs:
            return None
        if any(not math.isfinite(d) for d in self.diffs):
            return math.nan
        return max(abs(d) for d in self.diffs)

    @property
    def mean(self) -> float | None:
        return sum(self.diffs) / len(self.diffs) if self.diffs else None

    @property
    def complete(self) -> bool:
        """Both runs logged the same steps."""
        return len(self.steps) == self.n_reference == self.n_run

    def within(self, max_abs: float, mean: float | None = None) -> bool:
        """Every step compared, max |diff| <= max_abs (and |mean| <= mean); NaN is never within."""
        if not self.complete or not self.steps:
            return False
        ok = self.max_abs <= max_abs  # NaN compares False
        return ok and (mean is None or abs(self.mean) <= mean)


def step_difference(reference: dict, run: dict, metric: str, label: str = "") -> Diff:
    """run - reference for one metric, on the steps both logged."""
    ref, mine = by_step(reference, metric), by_step(run, metric)
    common = sorted(set(ref) & set(mine))
    return Diff(label, metric, common, [mine[s] - ref[s] for s in common], len(ref), len(mine))


def differences(runs: list[tuple[str, dict]], metrics=METRICS) -> list[Diff]:
    """For each run after the first and each metric: run - first on the steps both logged."""
    if not runs:
        return []
    return [step_difference(runs[0][1], observed, metric, label) for label, observed in runs[1:] for metric in metrics]
