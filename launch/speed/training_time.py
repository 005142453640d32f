"""Time and cost to train: the wall time, GPU-hours and money a number of tokens takes at a predicted speed, the
speed's error band carried through, and how many GPUs would meet a target time where the strategy scales that way.

The speed is the throughput model's tokens/s per GPU (`launch.speed.model`: every GPU of the run processes that many
of the tokens it holds, its CP / SP shard included), so the run processes tokens/s per GPU x GPUs; the tokens are the
tokens the GPUs process, as the model counts them (each sequence at the run's max_length). A dataset's own token count
(padding excluded) is a lower bound on that: padding, and sequences shorter than max_length without packing, cost
their share of each step too.

The band (`launch.speed.error_band`: errors predicted / measured tokens/s - 1, (low, high)) says the true speed lies in
[pred / (1 + high), pred / (1 + low)], so the true time lies in [time x (1 + low), time x (1 + high)].

`gpus_for` searches the GPU counts one rents (1, 2, 4, ... GPUs of one node, then whole nodes) for the smallest that
meets a target time, for the data-parallel strategies (DDP, DeepSpeed ZeRO, FSDP): each GPU adds a replica of the
run, at a per-GPU speed the caller gives for each count (communication included there, when it is). A CP, SP or TP
mesh is set by the sequence length or the model, not by the time wanted: the search says it does not apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from launch.errors import LaunchError

HOUR_S = 3600.0
# `gpus_for`'s search stops here (64 nodes of 8: 512 GPUs) and says the target was not reached within it.
MAX_NODES = 64


def _number(value, flag: str, what: str, *, zero: bool = False) -> float:
    """`value` as a float, or a LaunchError naming `flag`: finite and positive (or zero, with `zero`)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or x < 0 or (x == 0 and not zero):
        shown = f"{value:g}" if isinstance(value, (int, float)) else value  # as typed: 0, not argparse's 0.0
        raise LaunchError(f"{flag} {shown}: give {what}.")
    return x


def _check_band(band: tuple[float, float]) -> tuple[float, float]:
    low, high = band
    if not (math.isfinite(low) and math.isfinite(high) and -1 < low <= high):
        raise ValueError(f"an error band is (low, high) with -1 < low <= high, got {band}")
    return low, high


def count_text(tokens: float) -> str:
    """1e9 -> "1e9", 2.5e8 -> "2.5e8", 12,000 -> "12,000": a count as one reads it."""
    if tokens < 1e5:
        return f"{tokens:,.0f}"
    mantissa, exponent = f"{tokens:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def duration_text(seconds: float) -> str:
    """40 s, 25 min, 2 h 10 min, 5 d 3 h."""
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 100 * 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(round(seconds / HOUR_S), 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def money_text(usd: float) -> str:
    return f"${usd:,.0f}" if usd >= 10 else f"${usd:,.2f}"


def gpus_text(gpus_per_node: int, nodes: int) -> str:
    total = gpus_per_node * nodes
    return f"{total} GPU{'s' if total != 1 else ''}" + (f" ({nodes} nodes x {gpus_per_node})" if nodes > 1 else "")


@dataclass(frozen=True)
class TrainingTime:
    """`tokens` at `tokens_per_s_per_gpu` on `gpus_per_node` x `nodes` GPUs: the wall time, GPU-hours and (with
    `gpu_hour_cost`, USD per GPU-hour) money, each with the range the speed's `band` gives."""

    tokens: float
    tokens_per_s_per_gpu: float
    gpus_per_node: int
    nodes: int
    band: tuple[float, float]
    gpu_hour_cost: float | None = None
    epochs: float | None = None  # with dataset_tokens: tokens = epochs x dataset_tokens
    dataset_tokens: float | None = None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def seconds(self) -> float:
        return self.tokens / (self.tokens_per_s_per_gpu * self.gpus)

    def _range(self, value: float) -> tuple[float, float]:
        """The true `value` (a time, or what is proportional to it) at the band's two ends."""
        low, high = self.band
        return value * (1 + low), value * (1 + high)

    @property
    def seconds_range(self) -> tuple[float, float]:
        return self._range(self.seconds)

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / HOUR_S

    @property
    def cost(self) -> float | None:
        return None if self.gpu_hour_cost is None else self.gpu_hours * self.gpu_hour_cost

    def describe(self) -> str:
        """"1e9 tokens: 2 h 10 min on 8 GPUs (1 h 55 min - 2 h 28 min), 17.4 GPU-hours, $52 at $3.00/GPU-hour"."""
        what = f"{count_text(self.tokens)} tokens"
        if self.epochs is not None:
            what = f"{self.epochs:g} epoch{'s' if self.epochs != 1 else ''} of {count_text(self.dataset_tokens)} " \
                   f"tokens ({what})"
        fast, slow = self.seconds_range
        text = (f"{what}: {duration_text(self.seconds)} on {gpus_text(self.gpus_per_node, self.nodes)} "
                f"({duration_text(fast)} - {duration_text(slow)}), {self.gpu_hours:,.1f} GPU-hours")
        if self.cost is not None:
            text += f", {money_text(self.cost)} at ${self.gpu_hour_cost:,.2f}/GPU-hour"
        return text

    def as_json(self) -> dict:
        """`plan --json`'s "training_time"."""
        out = {"tokens": self.tokens, "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
               "gpus_per_node": self.gpus_per_node, "nodes": self.nodes,
               "seconds": round(self.seconds, 1), "seconds_range": [round(s, 1) for s in self.seconds_range],
               "gpu_hours": round(self.gpu_hours, 2),
               "gpu_hours_range": [round(h, 2) for h in self._range(self.gpu_hours)]}
        if self.epochs is not None:
            out |= {"epochs": self.epochs, "dataset_tokens": self.dataset_tokens}
        if self.cost is not None:
            out |= {"gpu_hour_cost_usd": self.gpu_hour_cost, "cost_usd": round(self.cost, 2),
                    "cost_usd_range": [round(c, 2) for c in self._range(self.cost)]}
        return out


def check(tokens: float | None = None, epochs: float | None = None, dataset_tokens: float | None = None,
          gpu_hour_cost: float | None = None, target_hours: float | None = None) -> float:
    """The tokens to train: `tokens` (`--tokens`), or `epochs` (`--epochs`) x `dataset_tokens` (`--dataset-tokens`),
    after checking every figure given (`--gpu-hour-cost`, `--target-hours` too), so that a command can refuse them
    before it plans: LaunchError, one sentence."""
    if (tokens is None) == (epochs is None):
        raise LaunchError("give either --tokens N (tokens to train on) or --epochs E (passes over the dataset), "
                          "not both and not neither.")
    if epochs is not None:
        epochs = _number(epochs, "--epochs", "a positive, finite number of passes over the dataset")
        if dataset_tokens is None:
            raise LaunchError(f"--epochs {epochs:g}: the dataset's token count is not known here (a plan reads no "
                              "data); give it with --dataset-tokens N, or give --tokens N (the epochs x the dataset's "
                              "tokens) instead.")
        tokens = epochs * _number(dataset_tokens, "--dataset-tokens", "a positive, finite number of tokens")
    tokens = _number(tokens, "--tokens", "a positive, finite number of tokens to train on")
    if gpu_hour_cost is not None:
        _number(gpu_hour_cost, "--gpu-hour-cost", "a price in USD per GPU-hour, 0 or more", zero=True)
    if target_hours is not None:
        _number(target_hours, "--target-hours", "a positive, finite number of hours")
    return tokens


def plan(tokens: float | None = None, *, epochs: float | None = None, dataset_tokens: float | None = None,
         tokens_per_s_per_gpu: float, gpus: int, nodes: int = 1, band: tuple[float, float],
         gpu_hour_cost: float | None = None) -> TrainingTime:
    """The time and cost of training `tokens` (`--tokens`), or `epochs` (`--epochs`) of a dataset of `dataset_tokens`
    tokens, at `tokens_per_s_per_gpu` (the prediction; its `band` as `launch.speed.error_band` gives it) on `gpus` GPUs
    per node x `nodes`; `gpu_hour_cost` (`--gpu-hour-cost`, USD per GPU-hour) adds the money. Refuses (LaunchError)
    what cannot be planned, in one sentence (`check`)."""
    tokens = check(tokens, epochs, dataset_tokens, gpu_hour_cost)
    speed = _number(tokens_per_s_per_gpu, "the predicted speed", "a positive, finite tokens/s per GPU")
    if int(gpus) != gpus or gpus < 1 or int(nodes) != nodes or nodes < 1:
        raise LaunchError(f"{gpus} GPUs per node x {nodes} nodes: give whole numbers, 1 or more.")
    return TrainingTime(tokens, speed, int(gpus), int(nodes), _check_band(band),
                        None if gpu_hour_cost is None else float(gpu_hour_cost),
                        None if epochs is None else float(epochs),
                        None if dataset_tokens is None or epochs is None else float(dataset_tokens))


# ---- how many GPUs for a target time ------------------------------------------------------------------------------
def scaling_problem(layout) -> str | None:
    """Why more GPUs do not make `layout` (a `launch.config.layout.Layout`) proportionally faster, or None: a CP, SP
    or TP mesh is fixed by the sequence length or the model; the data-parallel strategies scale."""
    for size, name, what in ((layout.cp, "context-parallel", "the sequence length"),
                             (layout.sp, "sequence-parallel", "the sequence length"),
                             (layout.tp, "tensor-parallel", "the model's size")):
        if size > 1:
            return (f"--target-hours does not apply to {layout.strategy}: its {name} mesh ({size} GPUs per sequence) "
                    f"is set by {what}, not by the time wanted.")
    return None


@dataclass(frozen=True)
class GpuCount:
    """`gpus_for`'s answer: the smallest GPU count that trains `tokens` within `target_hours`, its predicted hours,
    or why there is none (`reason`); `tried`: (GPUs per node, nodes, hours) of every count tried, fewest first."""

    target_hours: float
    tokens: float
    gpus_per_node: int | None = None
    nodes: int | None = None
    hours: float | None = None
    reason: str = ""
    tried: tuple[tuple[int, int, float], ...] = ()
    slow_end: bool = False  # the hours are at the slow end of the band

    @property
    def gpus(self) -> int | None:
        return None if self.gpus_per_node is None else self.gpus_per_node * self.nodes

    def describe(self) -> str:
        wanted = f"--target-hours {self.target_hours:g} ({count_text(self.tokens)} tokens)"
        if self.gpus is None:
            return f"{wanted}: {self.reason}"
        edge = ", at the slow end of the error band" if self.slow_end else ""
        return (f"{wanted}: {gpus_text(self.gpus_per_node, self.nodes)} (predicted {duration_text(self.hours * HOUR_S)}"
                f"{edge}). Data parallel: the global batch grows with the GPUs (per-device batch x accumulation x "
                "GPUs); keep it by lowering gradient_accumulation_steps.")

    def as_json(self) -> dict:
        return {"target_hours": self.target_hours, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes, "hours": round(self.hours, 3) if self.hours is not None else None,
                "slow_end_of_band": self.slow_end, **({"reason": self.reason} if self.reason else {})}


def counts(gpus_per_node: int, max_nodes: int = MAX_NODES) -> list[tuple[int, int]]:
    """(GPUs per node, nodes) as one rents them, fewest first: 1, 2, 4, ... GPUs of one node and the full node, then
    2, 3, ... full nodes."""
    one = sorted({2 ** i for i in range(gpus_per_node.bit_length()) if 2 ** i < gpus_per_node} | {gpus_per_node})
    return [(g, 1) for g in one] + [(gpus_per_node, n) for n in range(2, max_nodes + 1)]


def gpus_for(target_hours: float, tokens: float, per_gpu_speed: Callable[[int, int], float | None], layout, *,
             gpus_per_node: int = 8, max_nodes: int = MAX_NODES, band: tuple[float, float] | None = None) -> GpuCount:
    """The smallest GPU count (`counts`) that trains `tokens` within `target_hours` (`--target-hours`), the run's
    `layout` scaled by data parallelism: `per_gpu_speed(gpus_per_node, nodes)` gives the predicted tokens/s per GPU at
    each count (the caller's throughput model, communication included when it is), or None for a count the run cannot
    take (a mesh it does not divide: skipped). With `band`, a count meets the
    target at the band's slow end (the time x (1 + high)). Every count is tried in order, so the answer is the
    smallest even where more GPUs are not always faster. A CP / SP / TP run: refused with the reason
    (`scaling_problem`), not searched."""
    target_hours = _number(target_hours, "--target-hours", "a positive, finite number of hours")
    tokens = _number(tokens, "--tokens", "a positive, finite number of tokens to train on")
    slow = 1 + _check_band(band)[1] if band is not None else 1.0
    if problem := scaling_problem(layout):
        return GpuCount(target_hours, tokens, reason=problem)
    tried = []
    for per_node, nodes in counts(gpus_per_node, max_nodes):
        speed = per_gpu_speed(per_node, nodes)
        if speed is None:  # the run cannot take this count (its mesh does not divide it): not a candidate
            continue
        speed = _number(speed, "the predicted speed", "a positive, finite tokens/s per GPU")
        hours = tokens / (speed * per_node * nodes) / HOUR_S * slow
        tried.append((per_node, nodes, hours))
        if hours <= target_hours:
            return GpuCount(target_hours, tokens, per_node, nodes, hours, tried=tuple(tried), slow_end=band is not None)
    if not tried:
        return GpuCount(target_hours, tokens, reason=f"no count of up to {max_nodes} nodes of {gpus_per_node} GPUs "
                                                     "can run this layout.")
    per_node, nodes, hours = tried[-1]
    return GpuCount(target_hours, tokens, reason=(
        f"not reached within {max_nodes} nodes of {gpus_per_node} GPUs: {gpus_text(per_node, nodes)} would take "
        f"{duration_text(hours * HOUR_S)}."), tried=tuple(tried), slow_end=band is not None)
