"""`--fastest`: the fastest settings that fit, chosen before the first step.

A search over run shapes, not a second planner: each candidate is the run's own `RunShape` with a few of the settings
that change speed but not what is learned changed, planned by the one memory model (`launch.memory`) and costed by the
one throughput model (`launch.speed.model`). Each such setting is an axis, declared once in `AXES` (its fields, the
training arguments it sets, its candidates, its label, how it changes the run shape):

- activation checkpointing: off / on / on with its checkpoints offloaded to host memory / on the first k of the L
  decoder layers only (`checkpointing_layers: k`, launch/rank/partial_checkpointing.py), by whoever checkpoints in
  this run (`Checkpointing.by`, launch.config.training_args): transformers (`activation_checkpointing`,
  `activation_checkpointing_kwargs: {offload: ...}`) or FSDP's own (`fsdp_activation_checkpointing`,
  `fsdp_activation_checkpointing_offload`, FSDP2 only, in the Accelerate config). Of the partial ones only the
  fewest layers that fit is a candidate, found for each value of the other axes (`Axis.settle`): every layer fewer
  is one recomputation less, so it is the fastest of them;
- the micro-batch and gradient accumulation at the same tokens per optimizer step (`per_device_train_batch_size` x
  `gradient_accumulation_steps`: every divisor of their product);
- Liger's layer kernels (`use_liger_kernel`), where they can run: on a GPU with liger-kernel installed (for `plan`,
  which targets a GPU machine, "installed" means the image's lock, requirements/image.lock, holds it; for a run, that
  this machine has it), not under DeepSpeed's tiled MLP (Liger's SwiGLU would replace the tiled forward), not where
  TRL refuses it (a `liger_kernel_config` asking for Liger's fused linear cross-entropy), and not past Liger's int32
  indexing limit.

A candidate fits when its memory plan fits the target with the launcher's spare (`MemoryPlan.fits_with_spare`: the
predicted device memory in use, CUDA context and allocator reserve included, within the GPU's capacity less
`launch.memory.plan.SPARE`, the planner's measured error, and the node's host memory when known): the preflight says
so of a run within the spare, and the launcher does not choose such settings itself. The chosen candidate is applied
as ordinary settings (training arguments, or the two Accelerate launch flags of FSDP's own checkpointing), so the run,
its summary and `trl sft` see nothing new; what the user gave explicitly (after `--`) is never searched over and wins.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, make_dataclass, replace
from typing import Callable

from launch import memory
from launch.facts import calibration, pins
from launch.speed import error_band, model as throughput_model
from launch.speed.communication import DEFAULT_NETWORK_GBPS
from launch.facts.machine import installed_versions
from launch.memory.terms import kernel_length_limits
from launch.memory.plan import SPARE, MemoryPlan
from launch.config.profiles import as_argv
from launch.config.training_args import AFTER_DASHES, FSDP_CHECKPOINTING, FSDP_CHECKPOINTING_OFFLOAD

# Predicted step times within this share of each other are a tie (the model's own error is several times larger):
# among the fitting candidates that close to the fastest, the one with the lowest planned peak is chosen.
TIE = 0.01
LIGER = "liger-kernel"


@dataclass(frozen=True)
class Space:
    """What one run's candidates are drawn from: the resolved run (`setup`), its run shape, who checkpoints in it, the
    searched training arguments the user gave after `--` (kept), and whether liger-kernel counts as installed."""

    setup: object
    run: memory.RunShape
    checkpointing_by: str  # "transformers" or "FSDP"
    fixed: tuple[str, ...]
    liger_installed: bool


@dataclass(frozen=True)
class Axis:
    """One setting `--fastest` searches, declared once: a new axis is one more `Axis` in `AXES`."""

    name: str
    fields: tuple[tuple[str, type], ...]  # its fields of `Settings` (their keys in `plan --fastest --json`)
    arguments: tuple[str, ...]  # the training arguments it sets; one given after `--` keeps the run's own value
    candidates: Callable[[Space], tuple[list[tuple], str | None]]  # (its values to search, a note on them or None)
    of_run: Callable[[memory.RunShape], tuple]  # the run shape's own value
    shape: Callable[[memory.RunShape, tuple], memory.RunShape]  # the run shape with a value
    apply: Callable[[object, tuple], tuple[dict, dict]]  # (training arguments, Accelerate overrides) that differ
    word: str | None  # the word before its value in a label ("checkpointing off"), None: the value alone
    text: Callable[[tuple, str | None, bool], str]  # its value in words: (value, who checkpoints or None, short)
    column: tuple[str, str]  # (header, format spec) of its column in the table `plan --fastest` prints
    prefer: Callable[[tuple], tuple]  # among equal predicted step times, the lower first
    shown: int  # its place in a label and the table
    tie: int  # its place among the tie-breaks
    # a value that depends on the others' (the fewest checkpointed layers that fit): (value, the run shape with the
    # other axes' values, the run's plan) -> the value, or None to drop the candidate; None: values stand as given
    settle: Callable[[tuple, memory.RunShape, MemoryPlan], tuple | None] | None = None


# ---- checkpointing: off, on, on with offload, on the first k layers; by transformers or by FSDP ------------------
FEWEST = -1  # a candidate's checkpointed layers before `settle`: the fewest that fit


def _checkpointing_candidates(space: Space) -> tuple[list[tuple], None]:
    # offload under FSDP's own checkpointing: FSDP2 only (Accelerate refuses it with FSDP1); on CPU nothing leaves the
    # process, so offloading is no candidate there. Partial checkpointing under FSDP's own: FSDP2 only (the rules).
    run = space.run
    offload = run.device == "gpu" and (space.checkpointing_by == "transformers" or run.layout.kind == "fsdp2")
    partial = space.checkpointing_by == "transformers" or run.layout.kind == "fsdp2"
    return ([(False, False, None), (True, False, None)] + ([(True, True, None)] if offload else [])
            + ([(True, False, FEWEST)] if partial else [])), None


def _checkpointing_settle(value: tuple, run: memory.RunShape, plan: MemoryPlan) -> tuple | None:
    """FEWEST: the fewest checkpointed layers (1 to L - 1) with which `run` fits, or None (no candidate) where no
    checkpointing fits as well (partial would only be slower) or only all L layers do. Memory falls as layers are
    checkpointed, so the fewest is found by bisection. All layers, where the run's own count is fewer: said as L."""
    on, offload, layers = value
    L = plan.arch.num_layers
    if layers is None:
        own = plan.run.checkpointing_layers
        return (on, offload, L) if on and own is not None and own < L else value

    def fits(k: int) -> bool:
        return plan.with_run(replace(run, gradient_checkpointing=k > 0, offload_activations=False,
                                     checkpointing_layers=k or None)).fits_with_spare

    if L < 2 or fits(0) or not fits(L - 1):
        return None
    low, high = 0, L - 1  # fits(high), not fits(low)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return on, offload, high


def _checkpointing_apply(setup, value: tuple) -> tuple[dict, dict]:
    """Checkpointing goes where the run checkpoints: the training arguments, or FSDP's own two Accelerate flags; the
    layer count (`checkpointing_layers`, a training argument) applies to either."""
    on, offload, layers = value
    ckpt = setup.checkpointing
    training: dict = {}
    if on and layers != ckpt.layers and layers is not None:
        training["checkpointing_layers"] = layers
    if ckpt.by == "FSDP":
        have = {FSDP_CHECKPOINTING: ckpt.fsdp, FSDP_CHECKPOINTING_OFFLOAD: ckpt.fsdp_offload}
        want = {FSDP_CHECKPOINTING: on, FSDP_CHECKPOINTING_OFFLOAD: offload}
        accelerate = {k: v for k, v in want.items() if have[k] != v}
        if not on and accelerate.get(FSDP_CHECKPOINTING) is False:
            accelerate[FSDP_CHECKPOINTING_OFFLOAD] = False  # Accelerate refuses offload without it
        return training, accelerate
    if ckpt.enabled != on:
        training["activation_checkpointing"] = on
    if on and ckpt.offload != offload:
        training["activation_checkpointing_kwargs"] = {**ckpt.kwargs, "offload": offload}
    return training, {}


def _checkpointing_text(value: tuple, by: str | None, short: bool) -> str:
    on, offload, layers = value
    if not on:
        return "off"
    return ("on" if layers is None else f"{layers} layers") + (f" ({by})" if by else "") + (
        " + offload" if offload else "")


CHECKPOINTING = Axis(
    name="checkpointing",
    fields=(("activation_checkpointing", bool), ("activation_checkpointing_offload", bool),
            ("checkpointing_layers", int)),
    arguments=("activation_checkpointing", "activation_checkpointing_kwargs", "checkpointing_layers"),
    candidates=_checkpointing_candidates,
    of_run=lambda run: (run.gradient_checkpointing, run.offload_activations,
                        run.checkpointing_layers if run.gradient_checkpointing else None),
    shape=lambda run, v: replace(run, gradient_checkpointing=v[0], offload_activations=v[1],
                                 checkpointing_layers=v[2] if v[0] else None),
    apply=_checkpointing_apply,
    word="checkpointing", text=_checkpointing_text, column=("checkpointing", "<27"),
    prefer=lambda v: (v[1], v[0], v[2] or 0), shown=0, tie=1, settle=_checkpointing_settle)


# ---- the micro-batch and gradient accumulation, at the same tokens per optimizer step -----------------------------
def _batch_candidates(space: Space) -> tuple[list[tuple], None]:
    layout = space.run.layout
    total = layout.per_device_train_batch_size * layout.gradient_accumulation_steps
    return [(b, total // b) for b in range(1, total + 1) if total % b == 0], None


def _batch_apply(setup, value: tuple) -> tuple[dict, dict]:
    own = (setup.layout.per_device_train_batch_size, setup.layout.gradient_accumulation_steps)
    names = ("per_device_train_batch_size", "gradient_accumulation_steps")
    return {k: v for k, v, o in zip(names, value, own) if v != o}, {}


BATCH = Axis(
    name="batch",
    fields=(("per_device_train_batch_size", int), ("gradient_accumulation_steps", int)),
    arguments=("per_device_train_batch_size", "gradient_accumulation_steps"),
    candidates=_batch_candidates,
    of_run=lambda run: (run.layout.per_device_train_batch_size, run.layout.gradient_accumulation_steps),
    shape=lambda run, v: replace(run, layout=replace(run.layout, per_device_train_batch_size=v[0],
                                                     gradient_accumulation_steps=v[1])),
    apply=_batch_apply,
    word=None,
    text=lambda v, by, short: f"{v[0]} x {v[1]}" if short else f"micro-batch {v[0]} x accumulation {v[1]}",
    column=("batch x acc", ">11"),
    prefer=lambda v: (v[1],), shown=2, tie=0)


# ---- Liger's layer kernels ----------------------------------------------------------------------------------------
def liger_in_image_lock() -> bool:
    """`plan` targets a GPU machine set up from the image's lock (requirements/image.lock): Liger counts as installed
    there when that lock holds liger-kernel."""
    return pins.normalize(LIGER) in {pins.normalize(name) for name in pins.read_lock(pins.IMAGE_LOCK)}


def liger_on_this_machine(gpu_count: int) -> bool:
    """A run's `--fastest` on this machine: Liger counts as installed when there is a GPU and liger-kernel is
    (its distribution metadata; nothing imported)."""
    return gpu_count > 0 and installed_versions((LIGER,)).get(LIGER) is not None


def liger_allowed(setup, run: memory.RunShape, installed: bool) -> str | None:
    """None when Liger's kernels may be among the candidates; else why not, in a few words."""
    if run.device == "cpu":
        return "a CPU run (Liger's kernels are Triton, GPU only)"
    if not installed:
        return "liger-kernel is not installed"
    if run.tiled_mlp:
        return "DeepSpeed's tiled MLP (Liger's SwiGLU would replace its tiled forward)"
    config = setup.training.get("liger_kernel_config") or {}
    if isinstance(config, dict) and config.get("fused_linear_cross_entropy"):
        return "liger_kernel_config asks for Liger's fused linear cross-entropy, which TRL 1.16 refuses"
    return None


def _liger_candidates(space: Space) -> tuple[list[tuple], str]:
    if no := liger_allowed(space.setup, space.run, space.liger_installed):
        return [(False,)], f"off: {no}"
    return [(False,), (True,)], "on and off"


LIGER_KERNELS = Axis(
    name="liger",
    fields=(("use_liger_kernel", bool),),
    arguments=("use_liger_kernel",),
    candidates=_liger_candidates,
    of_run=lambda run: (run.liger_kernels,),
    shape=lambda run, v: replace(run, liger_kernels=v[0]),
    apply=lambda setup, v: ({"use_liger_kernel": v[0]} if bool(setup.training.get("use_liger_kernel")) != v[0]
                            else {}, {}),
    word="Liger", text=lambda v, by, short: "on" if v[0] else "off", column=("Liger", "<5"),
    prefer=lambda v: (not v[0],), shown=1, tie=2)


# The axes, in the order of their fields (and of the training arguments a choice sets).
AXES = (CHECKPOINTING, BATCH, LIGER_KERNELS)
SHOWN = sorted(AXES, key=lambda axis: axis.shown)
# The training arguments a candidate sets; given explicitly (after `--`), they are the user's and not searched.
SEARCHED = tuple(argument for axis in AXES for argument in axis.arguments)


def _value(settings, axis: Axis) -> tuple:
    return tuple(getattr(settings, name) for name, _type in axis.fields)


def label(settings, by: str | None = None, short: bool = False) -> str:
    """A run's speed settings in words, the one wording of them: "checkpointing on + offload, Liger on, micro-batch 2 x
    accumulation 1" (`short`: "..., 2 x 1"; `by`: who checkpoints, "on (FSDP)")."""
    return ", ".join((f"{axis.word} " if axis.word else "") + axis.text(_value(settings, axis), by, short)
                     for axis in SHOWN)


def _of_run(run: memory.RunShape) -> "Settings":
    """The settings a run shape has."""
    return Settings(*(v for axis in AXES for v in axis.of_run(run)))


# The speed settings of one candidate, in the shape `plan --fastest --json` prints: the fields of every axis.
Settings = make_dataclass("Settings", [field for axis in AXES for field in axis.fields], frozen=True,
                          namespace={"label": label, "of_run": staticmethod(_of_run)})


@dataclass(frozen=True)
class Candidate:
    settings: Settings
    plan: MemoryPlan  # the run shape with these settings, planned on the target
    cost: throughput_model.StepCost
    excluded: str | None = None  # why it cannot run at all (e.g. past Liger's int32 limit), whatever the memory

    @property
    def fits(self) -> bool:
        return self.excluded is None and self.plan.fits_with_spare

    def why_not(self) -> str | None:
        """One line saying why it does not fit (None when it does)."""
        if self.excluded:
            return self.excluded
        if self.plan.fits_with_spare:
            return None
        est, target = self.plan.estimate, self.plan.target
        budget = target.gpu_memory_gib * (1 - SPARE)
        if est.gpu_peak_gib > budget:
            spare = (f" (within the {SPARE:.0%} spare: more than {budget:.1f})"
                     if est.gpu_peak_gib <= target.gpu_memory_gib else "")
            return (f"needs {est.gpu_peak_gib:.1f} GiB per GPU of {target.gpu_memory_gib:g}{spare}"
                    f"; largest term: {est.largest_gpu_term().name}, {est.largest_gpu_term().gib:.1f} GiB")
        return f"needs {est.host_per_node_gib:.0f} GiB of host memory per node of {target.host_memory_gib:g}"

    def as_json(self) -> dict:
        return {**asdict(self.settings), "gpu_peak_gib": round(self.plan.estimate.gpu_peak_gib, 2),
                "predicted_tokens_per_s_per_gpu": round(self.cost.tokens_per_s_per_gpu, 1), "fits": self.fits,
                "why_not": self.why_not(), "predicted_step_s": round(self.cost.step_s, 4),
                "predicted_mfu": round(self.cost.utilization("model"), 4),
                "predicted_mfu_causal": round(self.cost.utilization("model_causal"), 4),
                "predicted_hfu": round(self.cost.utilization("hardware"), 4),
                "predicted_compute_s": round(self.cost.compute_s, 4),
                "predicted_exposed_communication_s": round(self.cost.exposed_communication_s, 4)}


@dataclass(frozen=True)
class Search:
    """Every candidate, fastest first, and the fastest that fits (None when none does)."""

    candidates: list[Candidate]
    chosen: Candidate | None
    checkpointing_by: str  # "transformers" or "FSDP"
    liger: str  # why Liger is (not) among the candidates
    fixed: tuple[str, ...]  # settings the user gave, kept
    network_gbps: float = DEFAULT_NETWORK_GBPS  # per GPU between nodes, for the communication of each candidate

    def as_json(self) -> dict:
        return {"fastest": self.chosen.as_json() if self.chosen else None,
                "candidates": [c.as_json() for c in self.candidates],
                "checkpointing_by": self.checkpointing_by, "liger": self.liger, "fixed": list(self.fixed)}


def user_given(setup) -> tuple[str, ...]:
    """The searched settings the user gave after `--` (they win, so they are kept)."""
    given = {key for key, (_rank, source) in setup.explicit.items() if source == AFTER_DASHES}
    if {"gradient_checkpointing", "gradient_checkpointing_kwargs"} & given:
        given |= {"activation_checkpointing", "activation_checkpointing_kwargs"}
    return tuple(k for k in SEARCHED if k in given)


def search(setup, plan: MemoryPlan, *, liger_installed: bool, peak_flops: float | None = None,
           network_gbps: float = DEFAULT_NETWORK_GBPS) -> Search:
    """Every candidate of the run `plan` planned (its run shape on its target), ranked by predicted step time, the
    communication it waits for included (`launch.speed.communication`; `network_gbps` per GPU between nodes)
    (fastest first; at equal time by each axis' `prefer`: the fewer micro-batches, then no offload, then no
    checkpointing, then Liger), and the fastest that fits (within `TIE` of it, the one with the most headroom)."""
    run = plan.run
    fixed = user_given(setup)
    space = Space(setup, run, setup.checkpointing.by, fixed, liger_installed)
    values, notes = [], {}
    for axis in AXES:
        if set(axis.arguments) & set(fixed):
            values.append([axis.of_run(run)])
            notes[axis.name] = "as given after `--`"
        else:
            found, notes[axis.name] = axis.candidates(space)
            values.append(found)
    candidates = []
    for value in itertools.product(*values):
        shaped = run
        for axis, v in zip(AXES, value):
            if axis.settle is None:
                shaped = axis.shape(shaped, v)
        value = list(value)
        for i, axis in enumerate(AXES):
            if axis.settle is not None:
                value[i] = axis.settle(value[i], shaped, plan)
                if value[i] is None:
                    break
                shaped = axis.shape(shaped, value[i])
        if None in value:
            continue
        limits = [limit for _reason, limit in kernel_length_limits(plan.arch, shaped)]
        excluded = None
        if limits and shaped.layout.max_length > min(limits):
            excluded = (f"Liger's kernels index tokens x hidden with int32 (Liger-Kernel #803): at most "
                        f"{min(limits):,} tokens here")
        candidates.append(Candidate(Settings(*(x for v in value for x in v)), plan.with_run(shaped),
                                    throughput_model.predict(plan.arch, shaped, peak_flops, gpu=plan.target.gpu,
                                                             network_gbps=network_gbps),
                                    excluded))
    ties = sorted(AXES, key=lambda axis: axis.tie)
    candidates.sort(key=lambda c: (round(c.cost.step_s, 6),
                                   *(x for axis in ties for x in axis.prefer(_value(c.settings, axis)))))
    fitting = [c for c in candidates if c.fits]
    chosen = None
    if fitting:
        # within TIE of the fastest that fits, the model cannot tell them apart: the most headroom wins
        near = [c for c in fitting if c.cost.step_s <= fitting[0].cost.step_s * (1 + TIE)]
        chosen = min(near, key=lambda c: c.plan.estimate.gpu_peak_gib)
    return Search(candidates, chosen, space.checkpointing_by, notes[LIGER_KERNELS.name], fixed, network_gbps)


def arguments(setup, settings) -> tuple[list[str], dict]:
    """The chosen settings as ordinary settings of this run: (training argv, Accelerate launch overrides), only
    those that differ from what the run resolved to (each axis' `apply`)."""
    training: dict = {}
    accelerate: dict = {}
    for axis in AXES:
        more_training, more_accelerate = axis.apply(setup, _value(settings, axis))
        training.update(more_training)
        accelerate.update(more_accelerate)
    return as_argv(training), accelerate


def describe(found: Search) -> str:
    """The ranked table `plan --fastest` prints, the choice and why each faster candidate does not fit."""
    target = found.candidates[0].plan.target if found.candidates else None
    cpu = bool(found.candidates) and found.candidates[0].plan.run.device == "cpu"
    gpu = target.gpu if target else None
    run = found.candidates[0].plan.run if found.candidates else None
    world = run.layout.world_size if run else 1
    where = (f"per GPU of {world} {gpu.name if gpu else 'GPU'}s, the communication the step waits for included "
             f"(launch/speed/communication.py; {found.network_gbps:g} Gb/s per GPU between nodes)"
             if world > 1 and not cpu else f"on one {gpu.name if gpu else 'GPU'}")
    lines = [f"Candidates (fastest first; predicted {where} by the throughput model, launch/speed/model.py"
             + ("; a CPU run is ranked as if on that GPU" if cpu else "")
             + f"; memory by the planner against {target.gpu_memory_gib:g} GiB per "
             + ("process" if cpu else "GPU") + f", fitting with the launcher's {SPARE:.0%} spare: at most "
             f"{target.gpu_memory_gib * (1 - SPARE):.1f} GiB" if target else "",
             f"  checkpointing by {found.checkpointing_by}; Liger: {found.liger}"
             + (f"; kept as given after `--`: {', '.join(found.fixed)}" if found.fixed else "") + ")"]
    head = (f"  {'#':>2}  " + " ".join(f"{axis.column[0]:{axis.column[1]}}" for axis in SHOWN)
            + f"  {'peak GiB':>8}  {'fits':<4}  {'tokens/s/GPU':>12}  {'step s':>7}  {'MFU':>6}  {'causal':>6}  "
            f"{'HFU':>6}")
    band = error_band.calibrated()
    lines.append(head)
    for i, c in enumerate(found.candidates, 1):
        mark = "  <- fastest that fits" if c is found.chosen else ""
        cells = " ".join(f"{axis.text(_value(c.settings, axis), found.checkpointing_by, True):{axis.column[1]}}"
                         for axis in SHOWN)
        lines.append(f"  {i:>2}  {cells}  "
                     f"{c.plan.estimate.gpu_peak_gib:>8.1f}  {'yes' if c.fits else 'no':<4}  "
                     f"{c.cost.tokens_per_s_per_gpu:>12,.0f}  {c.cost.step_s:>7.3f}  "
                     f"{100 * c.cost.utilization('model'):>5.1f}%  {100 * c.cost.utilization('model_causal'):>5.1f}%  "
                     f"{100 * c.cost.utilization('hardware'):>5.1f}%{mark}")
    if found.chosen is None:
        lines.append("None fits: " + "; ".join(f"#{i} {c.why_not()}" for i, c in enumerate(found.candidates, 1)))
        return "\n".join(lines)
    faster = found.candidates[:found.candidates.index(found.chosen)]
    for c in faster:
        why = c.why_not() or (f"fits, but within {TIE:.0%} of the chosen one's time with less headroom "
                              f"({c.plan.estimate.gpu_peak_gib:.1f} GiB per GPU)")
        lines.append(f"  not #{found.candidates.index(c) + 1} ({c.settings.label()}): {why}")
    cost = found.chosen.cost
    lines.append(f"Fastest that fits: {found.chosen.settings.label()}; {found.chosen.plan.estimate.gpu_peak_gib:.1f} "
                 f"GiB per GPU, {error_band.format_speed(cost.tokens_per_s_per_gpu, band)} per GPU predicted (MFU "
                 f"{100 * cost.utilization('model'):.1f}%, HFU {100 * cost.utilization('hardware'):.1f}%"
                 + (f", frozen-base MFU {100 * cost.utilization('frozen_base_causal'):.1f}% in NeMo's causal "
                    "convention" if "frozen_base_causal" in cost.flops else "") + ").")
    lines.append("MFU: 6N + 12 L H d S FLOPs per token (non-causal, recomputation not counted); causal: the attention "
                 "term halved; HFU: the MFU's FLOPs plus checkpointing's recomputed forward. Predicted, not measured: "
                 "calibrated on one H100 and TRL's published 1M-token run (launch/facts/calibration.py); communication "
                 "between GPUs from bus bandwidths, not measured (docs/planning.md, Communication). tokens/s: the "
                 "true speed may lie {:+.0%} / {:+.0%} from the prediction (each measured row predicted by rates "
                 "refitted without it: launch/speed/error_band.py).".format(*error_band.true_range(band))
                 + (f" The {gpu.name}'s rates are the H100's carried by a stated rule (launch/speed/model.py rates_for:"
                    " fractions of the peak and issue time kept, bandwidth scaled by its memory bandwidth), not "
                    "measured on it." if gpu and gpu.name not in calibration.MEASURED_RATES else ""))
    return "\n".join(lines)
