"""Plots of runs (`python -m launch compare`, `launch.commands.compare`): per-step loss and grad_norm of several runs,
and each run's difference from the first, as one PNG and a table.

The measure is the parity tests' and the judge's own (`launch.results.stepdiff`): on the steps two runs both logged, the
maximum absolute difference and the mean signed difference (run - first). TRL's invariant tolerances
(`launch.results.expected.TOLERANCE`) are printed beside them for context; the parity tests hold tighter limits of their
own.

Parity tests can call `write_comparison(runs, out)` when they fail, with (label, observed) pairs where observed is
a run_summary.json "observed" dict ({"step": [...], "loss": [...], "grad_norm": [...]}); it writes the PNG and
returns the table text.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from launch.results.expected import TOLERANCE
from launch.results.history import read_history, step_metrics
from launch.results.outdir import RunFolder
from launch.results.stepdiff import METRICS, Diff, by_step, differences

DEFAULT_OUT = "compare.png"  # in the current folder
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


class CompareError(Exception):
    """A run folder that cannot be compared; the message names it."""


# --- reading run folders ------------------------------------------------------------------------------------------

def read_run(folder: Path) -> dict:
    """The observed per-step metrics of a run folder, from its trainer_state.json (as the launcher reads them)."""
    folder = Path(folder)
    if not folder.exists():
        raise CompareError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise CompareError(f"{folder}: not a folder (pass a run's output folder, the one holding trainer_state.json)")
    state = RunFolder(folder).trainer_state
    if not state.is_file():
        hint = _newest_checkpoint_state(folder)
        raise CompareError(f"{folder}: no {state.name}" + (f" (the newest checkpoint has one: pass {hint})"
                                                             if hint else ""))
    try:
        history = read_history(folder)
    except OSError as e:
        raise CompareError(f"{folder}: cannot read {state.name} ({e.strerror or e})") from None
    except (ValueError, AttributeError) as e:  # JSON (and Unicode) errors are ValueErrors; a non-object file
        raise CompareError(f"{folder}: {state.name} is not readable JSON ({e})") from None
    if not isinstance(history, list):
        raise CompareError(f"{folder}: {state.name} has no log_history list")
    history = [h for h in history if isinstance(h, dict)]
    try:
        observed = step_metrics(history)
        # step_metrics leaves out a metric where a logged step lacks it; keep the lists parallel to "step" then
        rows = sorted((h for h in history if "loss" in h and "step" in h), key=lambda h: h["step"])
        for metric in METRICS:
            if len(observed[metric]) != len(observed["step"]):
                observed[metric] = [float(h[metric]) if metric in h else None for h in rows]
    except (TypeError, ValueError) as e:
        raise CompareError(f"{folder}: {state.name} has a malformed log entry ({e})") from None
    if not observed["loss"]:
        raise CompareError(f"{folder}: {state.name} logged no per-step loss")
    return observed


def _newest_checkpoint_state(folder: Path) -> Path | None:
    found = [c for c in RunFolder(folder).checkpoints() if RunFolder(c).trainer_state.is_file()]
    return found[-1] if found else None


def run_label(folder: Path) -> str:
    """The folder's name, plus [recipe/profile] from its run_summary.json when present."""
    folder = Path(folder)
    name = folder.resolve().name or str(folder)
    try:
        summary = json.loads(RunFolder(folder).summary.read_text())
    except (OSError, ValueError):
        return name
    if not isinstance(summary, dict):
        return name
    parts = [str(summary[k]) for k in ("recipe", "profile") if summary.get(k)]
    return f"{name} [{'/'.join(parts)}]" if parts else name


def unique_labels(folders: list[Path], labels: list[str]) -> list[str]:
    """Labels that collide (outputs/ddp/smoke-cpu vs outputs/zero3/smoke-cpu without summaries) get more of their
    path; identical paths get a number."""
    out = list(labels)
    for depth in range(1, 4):
        dupes = {lab for lab in out if out.count(lab) > 1}
        if not dupes:
            return out
        for i, (folder, lab) in enumerate(zip(folders, out)):
            if lab in dupes:
                parts = folder.resolve().parts[-depth - 1:]
                out[i] = "/".join(parts) + labels[i][len(folder.resolve().name):]
    seen: dict[str, int] = {}
    for i, lab in enumerate(out):
        seen[lab] = seen.get(lab, 0) + 1
        if out.count(lab) > 1:
            out[i] = f"{lab} #{seen[lab]}"
    return out


# --- the comparison -----------------------------------------------------------------------------------------------

def _fmt(x: float | None, spec: str = ".3e") -> str:
    if x is None:
        return "-"
    return format(x, spec) if math.isfinite(x) else str(x)


def comparison_table(runs: list[tuple[str, dict]], tolerance: dict | None = None) -> str:
    """The table text: per run after the first and per metric, steps compared, max |diff|, mean diff (signed),
    and the tolerance (TRL's by default) with whether the run is within it."""
    tolerance = tolerance or TOLERANCE
    if len(runs) < 2:
        return "nothing to compare: " + ("one run only" if runs else "no runs")
    diffs = differences(runs)
    width = max(len("run"), *(len(d.label) for d in diffs))
    lines = [f"differences from the first run, {runs[0][0]} (run - first, on the steps both logged)",
             f"{'run':<{width}}  {'metric':<9} {'steps':>5}  {'max |diff|':>10}  {'mean diff':>10}  "
             f"{'tolerance max / mean':>20}  vs tolerance"]
    notes = []
    for d in diffs:
        tol = tolerance.get(d.metric, {})
        tol_text = f"{_fmt(tol.get('max_abs'), '.0e')} / {_fmt(tol.get('mean'), '.0e')}" if tol else "-"
        if not d.steps:
            verdict = "no common steps"
        elif tol:
            over = [name for name, value, limit in (("max", d.max_abs, tol["max_abs"]), ("mean", d.mean, tol["mean"]))
                    if not abs(value) <= limit]  # nan counts as over
            verdict = f"ABOVE ({', '.join(over)})" if over else "within"
        else:
            verdict = ""
        lines.append(f"{d.label:<{width}}  {d.metric:<9} {len(d.steps):>5}  {_fmt(d.max_abs):>10}  "
                     f"{_fmt(d.mean, '+.3e'):>10}  {tol_text:>20}  {verdict}")
        bad = [s for s, v in zip(d.steps, d.diffs) if not math.isfinite(v)]
        if bad:
            notes.append(f"note: {d.label} {d.metric}: not finite (nan/inf in either run) at step(s) "
                         f"{', '.join(map(str, bad[:10]))}{' ...' if len(bad) > 10 else ''}")
        if len(d.steps) != d.n_reference or len(d.steps) != d.n_run:
            notes.append(f"note: {d.label} {d.metric}: {len(d.steps)} common steps (first run logged {d.n_reference}, "
                         f"this run {d.n_run}); compared on those only")
    lines.append("tolerance: TRL's invariant tolerances (launch.results.expected.TOLERANCE), for context; the parity "
                 "tests hold tighter limits of their own" if tolerance is TOLERANCE else "tolerance: as given by the "
                 "caller")
    return "\n".join(lines + notes)


def write_comparison(runs: list[tuple[str, dict]], out: Path, tolerance: dict | None = None,
                     title: str | None = None) -> str:
    """Write the comparison plot of (label, observed) pairs to `out` (PNG) and return the table text. The first
    run is the reference. Meant also for the parity tests' failure paths: odd input (missing metrics, lengths that
    differ, NaN) is plotted as far as it goes rather than raised."""
    table = comparison_table(runs, tolerance)
    plot_comparison(runs, Path(out), tolerance, title)
    return table


# --- the figure ---------------------------------------------------------------------------------------------------

def plot_comparison(runs: list[tuple[str, dict]], out: Path, tolerance: dict | None = None,
                    title: str | None = None) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    tolerance = tolerance or TOLERANCE
    diffs = differences(runs)
    n_points = max((len(by_step(obs, "loss")) for _, obs in runs), default=0)
    markers = n_points <= 60

    fig = Figure(figsize=(14, 9.5 + 0.25 * max(0, len(runs) - 3)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(METRICS), sharex="col")
    colors = ["black"] + [f"C{i % 10}" for i in range(len(runs) - 1)]

    handles = []
    for col, metric in enumerate(METRICS):
        ax = axes[0][col]
        for i, (_label, observed) in enumerate(runs):
            series = by_step(observed, metric)
            xs = sorted(series)
            style = dict(color="0.35", lw=4.5, alpha=0.45, zorder=1) if i == 0 else \
                dict(color=colors[i], lw=1.4, ls="--", zorder=2 + i)
            (line,) = ax.plot(xs, [series[x] for x in xs], marker=MARKERS[i % len(MARKERS)] if markers else None,
                              ms=6 if i == 0 else 4.5, **style)
            if col == 0:
                handles.append(line)
        ax.set_title(f"{metric} per logged step", fontsize=12)
        ax.set_ylabel(metric)
        ax.tick_params(labelbottom=True)
        ax.grid(True, alpha=0.3)

        ax = axes[1][col]
        _draw_differences(ax, [d for d in diffs if d.metric == metric], metric, colors, markers,
                          tolerance.get(metric), "TRL tolerance" if tolerance is TOLERANCE else "tolerance")
        ax.set_xlabel("logged step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    if handles:
        fig.legend(handles=handles, labels=_legend_labels(runs, diffs), loc="outside lower center",
                   ncol=1, fontsize=10, frameon=False)
    fig.suptitle(title or f"{len(runs)} runs: per-step loss and grad_norm (top), each run minus the first (bottom)",
                 fontsize=14)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", metadata={"Software": SOFTWARE})
    return out


SOFTWARE = "python -m launch compare"  # the PNG text chunk that marks a plot as ours (`written_by_us`)


def written_by_us(path: Path) -> bool:
    """Whether the PNG at `path` is a comparison this module wrote (its Software text chunk), so that `compare --out`
    may replace it without --overwrite; any other file is the user's."""
    try:
        from PIL import Image

        with Image.open(path) as image:
            return image.format == "PNG" and image.info.get("Software") == SOFTWARE
    except Exception:  # noqa: BLE001 - not an image, unreadable, Pillow missing: not ours to replace
        return False


def _legend_labels(runs: list[tuple[str, dict]], diffs: list[Diff]) -> list[str]:
    labels = [f"{runs[0][0]}  (first run: the reference)"] if runs else []
    for label, _ in runs[1:]:
        parts = []
        for d in diffs:
            if d.label == label:
                parts.append(f"{d.metric} max |diff| {_fmt(d.max_abs, '.2e')}, mean {_fmt(d.mean, '+.2e')}"
                             if d.steps else f"{d.metric}: no common steps")
        steps = {len(d.steps) for d in diffs if d.label == label}
        labels.append(f"{label}   ({'; '.join(parts)}; on {'/'.join(map(str, sorted(steps)))} common steps)")
    return labels


def _draw_differences(ax, diffs: list[Diff], metric: str, colors: list[str], markers: bool,
                      tol: dict | None, tol_name: str) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.axhline(0.0, color="black", lw=1.0, zorder=1)
    finite = [abs(v) for d in diffs for v in d.diffs if math.isfinite(v)]
    nonzero = [v for v in finite if v > 0]
    biggest = max(finite, default=0.0)
    for i, d in enumerate(diffs, start=1):
        ax.plot(d.steps, d.diffs, color=colors[i], lw=1.4, marker=MARKERS[i % len(MARKERS)] if markers else None,
                ms=4.5, zorder=2 + i)
    limit = tol.get("max_abs") if tol else None
    show_limit = bool(limit and diffs and biggest >= limit / 20)
    scale = "linear"
    # the small end, robust to the few tiny values a smooth curve has where it crosses zero
    small = sorted(nonzero)[len(nonzero) // 10] if nonzero else 0.0
    if nonzero and biggest / small > 1e3:
        # differences spanning many decades (one run equal up to float rounding, another off): symlog shows both
        low = math.floor(math.log10(max(small, biggest * 1e-8)))
        top = math.ceil(math.log10(max(biggest, limit if show_limit else 0.0)))
        linthresh = 10.0 ** low
        ax.set_yscale("symlog", linthresh=linthresh, linscale=1.0)
        every = max(1, math.ceil((top - low + 1) / 5))  # at most ~5 labelled decades a side
        decades = [10.0 ** k for k in range(top, low - 1, -every)]
        ax.yaxis.set_major_locator(FixedLocator(sorted([-v for v in decades] + [0.0] + decades)))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_ylim(-(10.0 ** top) * 1.5, (10.0 ** top) * 1.5)
        scale = f"symlog: linear within ±{linthresh:.0e}"
    else:
        # every tick written out (4.8e-07), not an offset text that collides with the title
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "0" if v == 0 else f"{v:.3g}"))
    if not diffs or not any(d.steps for d in diffs):
        ax.text(0.5, 0.5, "no steps in common with the first run" if diffs else "one run: nothing to compare",
                transform=ax.transAxes, ha="center", va="center", fontsize=11)
    bad = sorted({s for d in diffs for s, v in zip(d.steps, d.diffs) if not math.isfinite(v)})
    for s in bad:
        ax.axvline(s, color="red", lw=6, alpha=0.15, zorder=0)
    if bad:
        ax.text(0.01, 0.98, f"shaded: nan/inf at step {', '.join(map(str, bad[:8]))}{' ...' if len(bad) > 8 else ''}",
                transform=ax.transAxes, ha="left", va="top", color="red", fontsize=10)
    if diffs and any(d.steps for d in diffs) and not nonzero and not bad:
        ax.set_ylim(-1, 1)
        ax.text(0.5, 0.75, "equal to the first run at every common step", transform=ax.transAxes,
                ha="center", va="center", fontsize=11)
    note = ""
    if show_limit:
        for sign in (1, -1):
            ax.axhline(sign * limit, color="red", lw=1.0, ls=":", zorder=1)
        ax.annotate(f"{tol_name} ±{limit:.0e}", xy=(1.0, limit), xycoords=("axes fraction", "data"),
                    xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom", color="red", fontsize=9)
    elif limit and diffs:
        note = f"; {tol_name} ±{limit:.0e} off scale"
    ax.set_title(f"{metric}: run − first  ({scale}{note})", fontsize=12)
    ax.set_ylabel(f"{metric} difference")
    ax.grid(True, alpha=0.3)
