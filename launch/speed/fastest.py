"""`--fastest`: the fastest settings that fit, chosen before the first step.

A search over run shapes, not a second planner (DESIGN.md): each candidate is the run's own `RunShape` with a few of
the settings that change speed but not what is learned changed, planned by the one memory model (`launch.memory`)
and costed by the one throughput model (`launch.speed.model`):

- activation checkpointing: off / on / on with its checkpoints offloaded to host memory, by whoever checkpoints in
  this run: transformers (`activation_checkpointing`, `activation_checkpointing_kwargs: {offload: ...}`) or FSDP's
  own (`fsdp_activation_checkpointing`, `fsdp_activation_checkpointing_offload`, FSDP2 only, in the Accelerate
  config);
- the micro-batch and gradient accumulation at the same tokens per optimizer step (`per_device_train_batch_size` x
  `gradient_accumulation_steps`: every divisor of their product);
- Liger's layer kernels (`use_liger_kernel`), where they can run: on a GPU with liger-kernel installed (for `plan`,
  which targets a GPU machine, "installed" means the image's lock, requirements/image.lock, holds it; for a run, that
  this machine has it), not under DeepSpeed's tiled MLP (Liger's SwiGLU would replace the tiled forward), not where
  TRL refuses it (a `liger_kernel_config` asking for Liger's fused linear cross-entropy), and not past Liger's int32
  indexing limit.

A candidate fits when its memory plan fits the target with the launcher's spare (`MemoryPlan.fits_with_spare`: the
predicted device memory in use, CUDA context and allocator reserve included, within the GPU's capacity less
`memory_plan.SPARE`, the planner's measured error, and the node's host memory when known): the preflight says so of
a run within the spare, and the launcher does not choose such settings itself. The chosen
candidate is applied as ordinary settings (training arguments, or the two Accelerate launch flags of FSDP's own
checkpointing), so the run, its summary and `trl sft` see nothing new; what the user gave explicitly (after `--`)
is never searched over and wins.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, replace

from launch import memory
from launch.facts import pins
from launch.speed import model as throughput_model
from launch.facts.machine import installed_versions
from launch.memory.terms import kernel_length_limits
from launch.memory.plan import SPARE, MemoryPlan
from launch.switches import is_on
from launch.config.profiles import checkpointer
from launch.config.training_args import AFTER_DASHES

# The training arguments a candidate sets; given explicitly (after `--`), they are the user's and not searched.
SEARCHED = ("activation_checkpointing", "activation_checkpointing_kwargs", "per_device_train_batch_size",
            "gradient_accumulation_steps", "use_liger_kernel")
# Predicted step times within this share of each other are a tie (the model's own error is several times larger):
# among the fitting candidates that close to the fastest, the one with the lowest planned peak is chosen.
TIE = 0.01


@dataclass(frozen=True)
class Settings:
    """The speed settings of one candidate, in the shape `plan --fastest --json` prints."""

    activation_checkpointing: bool
    activation_checkpointing_offload: bool
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    use_liger_kernel: bool

    def label(self) -> str:
        ckpt = ("on + offload" if self.activation_checkpointing_offload else "on") if self.activation_checkpointing \
            else "off"
        return (f"checkpointing {ckpt}, Liger {'on' if self.use_liger_kernel else 'off'}, micro-batch "
                f"{self.per_device_train_batch_size} x accumulation {self.gradient_accumulation_steps}")


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
                "predicted_hfu": round(self.cost.utilization("hardware"), 4)}


@dataclass(frozen=True)
class Search:
    """Every candidate, fastest first, and the fastest that fits (None when none does)."""

    candidates: list[Candidate]
    chosen: Candidate | None
    checkpointing_by: str  # "transformers" or "FSDP"
    liger: str  # why Liger is (not) among the candidates
    fixed: tuple[str, ...]  # settings the user gave, kept

    def as_json(self) -> dict:
        return {"fastest": self.chosen.as_json() if self.chosen else None,
                "candidates": [c.as_json() for c in self.candidates],
                "checkpointing_by": self.checkpointing_by, "liger": self.liger, "fixed": list(self.fixed)}


def checkpointing_by(setup) -> str:
    """Who checkpoints in this run when it does (`launch.config.profiles.checkpointer`): FSDP's own (the Accelerate
    config's
    `fsdp_activation_checkpointing`) or transformers' (the training arguments)."""
    return checkpointer(setup.training, setup.accelerate)


def user_given(setup) -> tuple[str, ...]:
    """The searched settings the user gave after `--` (they win, so they are kept)."""
    given = {key for key, (_rank, source) in setup.explicit.items() if source == AFTER_DASHES}
    if {"gradient_checkpointing", "gradient_checkpointing_kwargs"} & given:
        given |= {"activation_checkpointing", "activation_checkpointing_kwargs"}
    return tuple(k for k in SEARCHED if k in given)


LIGER = "liger-kernel"


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


def search(setup, plan: MemoryPlan, *, liger_installed: bool, peak_flops: float | None = None) -> Search:
    """Every candidate of the run `plan` planned (its run shape on its target), ranked by predicted step time
    (fastest first; at equal time the fewer micro-batches, then no offload, then no checkpointing), and the fastest
    that fits (within `TIE` of it, the one with the most headroom)."""
    run = plan.run
    by = checkpointing_by(setup)
    fixed = user_given(setup)
    no_liger = liger_allowed(setup, run, liger_installed)
    if "use_liger_kernel" in fixed:
        ligers, liger_note = [run.liger_kernels], "as given after `--`"
    elif no_liger:
        ligers, liger_note = [False], f"off: {no_liger}"
    else:
        ligers, liger_note = [False, True], "on and off"
    if "activation_checkpointing" in fixed or "activation_checkpointing_kwargs" in fixed:
        modes = [(run.gradient_checkpointing, run.offload_activations)]
    else:
        # offload under FSDP's own checkpointing: FSDP2 only (Accelerate refuses it with FSDP1); on CPU nothing
        # leaves the process, so offloading is no candidate there
        offload = run.device == "gpu" and (by == "transformers" or run.layout.kind == "fsdp2")
        modes = [(False, False), (True, False)] + ([(True, True)] if offload else [])
    batch, accumulation = run.layout.per_device_train_batch_size, run.layout.gradient_accumulation_steps
    if "per_device_train_batch_size" in fixed or "gradient_accumulation_steps" in fixed:
        layouts = [(batch, accumulation)]
    else:
        total = batch * accumulation
        layouts = [(b, total // b) for b in range(1, total + 1) if total % b == 0]
    candidates = []
    for (ckpt, offload), (b, g), liger in itertools.product(modes, layouts, ligers):
        settings = Settings(ckpt, offload, b, g, liger)
        shaped = replace(run, gradient_checkpointing=ckpt, offload_activations=offload, liger_kernels=liger,
                         layout=replace(run.layout, per_device_train_batch_size=b, gradient_accumulation_steps=g))
        planned = plan.with_run(shaped)
        excluded = None
        if liger:
            limits = [limit for _reason, limit in kernel_length_limits(plan.arch, shaped)]
            if limits and shaped.layout.max_length > min(limits):
                excluded = (f"Liger's kernels index tokens x hidden with int32 (Liger-Kernel #803): at most "
                            f"{min(limits):,} tokens here")
        candidates.append(Candidate(settings, planned, throughput_model.predict(plan.arch, shaped, peak_flops),
                                    excluded))
    candidates.sort(key=lambda c: (round(c.cost.step_s, 6), c.settings.gradient_accumulation_steps,
                                   c.settings.activation_checkpointing_offload, c.settings.activation_checkpointing,
                                   not c.settings.use_liger_kernel))
    fitting = [c for c in candidates if c.fits]
    chosen = None
    if fitting:
        # within TIE of the fastest that fits, the model cannot tell them apart: the most headroom wins
        near = [c for c in fitting if c.cost.step_s <= fitting[0].cost.step_s * (1 + TIE)]
        chosen = min(near, key=lambda c: c.plan.estimate.gpu_peak_gib)
    return Search(candidates, chosen, by, liger_note, fixed)


def arguments(setup, settings: Settings) -> tuple[list[str], dict]:
    """The chosen settings as ordinary settings of this run: (training argv, Accelerate launch overrides), only
    those that differ from what the run resolved to. Checkpointing goes where the run checkpoints: the training
    arguments, or FSDP's own two Accelerate flags."""
    run_ckpt = setup.checkpointing
    training: dict = {}
    accelerate: dict = {}
    if checkpointing_by(setup) == "FSDP":
        fsdp = setup.accelerate.get("fsdp_config") or {}
        want = {"fsdp_activation_checkpointing": settings.activation_checkpointing,
                "fsdp_activation_checkpointing_offload": settings.activation_checkpointing_offload}
        accelerate = {k: v for k, v in want.items() if is_on(fsdp.get(k, False)) != v}
        if not settings.activation_checkpointing and accelerate.get("fsdp_activation_checkpointing") is False:
            accelerate["fsdp_activation_checkpointing_offload"] = False  # Accelerate refuses offload without it
    else:
        if run_ckpt.enabled != settings.activation_checkpointing:
            training["activation_checkpointing"] = settings.activation_checkpointing
        if settings.activation_checkpointing and run_ckpt.offload != settings.activation_checkpointing_offload:
            training["activation_checkpointing_kwargs"] = {**run_ckpt.kwargs,
                                                           "offload": settings.activation_checkpointing_offload}
    layout = setup.layout
    if layout.per_device_train_batch_size != settings.per_device_train_batch_size:
        training["per_device_train_batch_size"] = settings.per_device_train_batch_size
    if layout.gradient_accumulation_steps != settings.gradient_accumulation_steps:
        training["gradient_accumulation_steps"] = settings.gradient_accumulation_steps
    if bool(setup.training.get("use_liger_kernel")) != settings.use_liger_kernel:
        training["use_liger_kernel"] = settings.use_liger_kernel
    argv: list[str] = []
    for key, value in training.items():
        argv += [f"--{key}", json.dumps(value) if isinstance(value, dict) else
                 ("true" if value else "false") if isinstance(value, bool) else str(value)]
    return argv, accelerate


def _ckpt_label(s: Settings, by: str) -> str:
    if not s.activation_checkpointing:
        return "off"
    return f"on ({by})" + (" + offload" if s.activation_checkpointing_offload else "")


def describe(found: Search) -> str:
    """The ranked table `plan --fastest` prints, the choice and why each faster candidate does not fit."""
    target = found.candidates[0].plan.target if found.candidates else None
    cpu = bool(found.candidates) and found.candidates[0].plan.run.device == "cpu"
    lines = ["Candidates (fastest first; predicted on one GPU by the throughput model, launch/speed/model.py"
             + ("; a CPU run is ranked as if on that GPU" if cpu else "")
             + f"; memory by the planner against {target.gpu_memory_gib:g} GiB per "
             + ("process" if cpu else "GPU") + f", fitting with the launcher's {SPARE:.0%} spare: at most "
             f"{target.gpu_memory_gib * (1 - SPARE):.1f} GiB" if target else "",
             f"  checkpointing by {found.checkpointing_by}; Liger: {found.liger}"
             + (f"; kept as given after `--`: {', '.join(found.fixed)}" if found.fixed else "") + ")"]
    head = (f"  {'#':>2}  {'checkpointing':<26} {'Liger':<5} {'batch x acc':>11}  {'peak GiB':>8}  {'fits':<4}  "
            f"{'tokens/s/GPU':>12}  {'step s':>7}  {'MFU':>6}  {'causal':>6}  {'HFU':>6}")
    lines.append(head)
    for i, c in enumerate(found.candidates, 1):
        s = c.settings
        mark = "  <- fastest that fits" if c is found.chosen else ""
        liger = "on" if s.use_liger_kernel else "off"
        lines.append(f"  {i:>2}  {_ckpt_label(s, found.checkpointing_by):<26} {liger:<5} "
                     f"{f'{s.per_device_train_batch_size} x {s.gradient_accumulation_steps}':>11}  "
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
                 f"GiB per GPU, {cost.tokens_per_s_per_gpu:,.0f} tokens/s per GPU predicted (MFU "
                 f"{100 * cost.utilization('model'):.1f}%, HFU {100 * cost.utilization('hardware'):.1f}%"
                 + (f", frozen-base MFU {100 * cost.utilization('frozen_base_causal'):.1f}% in NeMo's causal "
                    "convention" if "frozen_base_causal" in cost.flops else "") + ").")
    lines.append("MFU: 6N + 12 L H d S FLOPs per token (non-causal, recomputation not counted); causal: the attention "
                 "term halved; HFU: the MFU's FLOPs plus checkpointing's recomputed forward. Predicted, not measured: "
                 "calibrated on one H100 and TRL's published 1M-token run (launch/facts/calibration.py); communication "
                 "between GPUs is not modelled.")
    return "\n".join(lines)
