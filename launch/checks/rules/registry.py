"""The registry of validity rules: the `@rule` decorator, the `Facts` of this machine a rule reads, and `check`,
which runs every rule in the order the rule modules register them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from launch.facts import hub


@dataclass
class Facts:
    """What this machine has, gathered once (tests pass their own)."""

    versions: dict = field(default_factory=dict)  # distribution name -> version string, or None if absent
    gpu_count: int = 0
    model: hub.ModelConfig = field(default_factory=lambda: hub.ModelConfig(None, "not read"))
    missing_inputs: list[str] = field(default_factory=list)  # model or dataset that cannot be found (launch.facts.hub)
    # launch.memory.plan.MemoryPlan for this machine (GPU and host memory), when computable
    memory: object | None = None

    @property
    def model_config(self):
        return self.model.config


@dataclass
class Rule:
    fn: Callable
    machine: bool  # about this machine (GPUs, versions, files), not about the run
    needs_model: bool  # reads the model's config; skipped (and said so) when it cannot be read
    doc: tuple[str, str] | None  # (what must hold, what happens otherwise) for the recipe README tables
    feature: str | None
    applies: Callable | None  # for needs_model rules: whether the rule concerns this setup at all

    @property
    def name(self) -> str:
        return self.fn.__name__


RULES: list[Rule] = []


def rule(machine=False, needs_model=False, feature=None, doc=None, applies=None):
    def register(fn):
        RULES.append(Rule(fn, machine, needs_model, doc, feature, applies))
        return fn

    return register


@dataclass
class Report:
    problems: list[str]  # about the run: it cannot work anywhere
    machine_problems: list[str]  # this machine could not run it
    skipped: list[str]  # rules not checked because the model's config could not be read

    @property
    def all(self) -> list[str]:
        return self.problems + self.machine_problems


def check(setup, facts: Facts, only: Callable[[Rule], bool] | None = None) -> Report:
    """Every broken rule's message (empty lists when the setup is valid), split by kind; `only`: the rules to check
    (`python -m launch plan` checks those about the run's settings)."""
    report = Report([], [], [])
    for r in RULES:
        if only is not None and not only(r):
            continue
        if r.applies is not None and not r.applies(setup):
            continue
        if r.needs_model and facts.model_config is None:
            report.skipped.append(r.name)
            continue
        if msg := r.fn(setup, facts):
            (report.machine_problems if r.machine else report.problems).append(msg)
    return report


def features(setup) -> list[str]:
    acc = setup.accelerate
    out = []
    if acc.get("distributed_type") == "DEEPSPEED":
        out.append("deepspeed")
    if _fsdp2(setup):
        out.append("fsdp2")
    if _cp(setup) > 1:
        out.append("context_parallel")
    if _sp(setup) > 1:
        out.append("sequence_parallel")
    return out


def _fsdp2(setup) -> bool:
    return setup.layout.kind == "fsdp2"


def _sp(setup) -> int:
    return setup.layout.sp


def _cp(setup) -> int:
    return setup.layout.cp


def length_multiple_problem(setup, divisor: int, why: str) -> str | None:
    """The one divisibility check of CP and SP: every batch is padded to `pad_to_multiple_of`, which must be a
    multiple of `divisor`."""
    multiple = setup.training.get("pad_to_multiple_of")
    if multiple and int(multiple) % divisor == 0:
        return None
    return f"{why}; set pad_to_multiple_of to a multiple of {divisor} (it is {multiple})."


def probes():
    """The package launch.checks.rules, through which a rule calls the probes of this machine it needs
    (launch.facts.machine's, launch.config.adapter's quantization_on_cpu_supported): they are names of the package, so
    that replacing one there (as the tests do) reaches every rule that calls it. Imported when a rule runs, by which
    time the package is whole."""
    from launch.checks import rules

    return rules


def skipped_line(setup, facts: Facts, report: Report) -> str | None:
    """One line saying which model-dependent rules were not checked, and why."""
    if not report.skipped:
        return None
    # the memory plan needs the same config.json: say that its table is skipped too, not only the rules
    table = "; the memory table (and the fit check) skipped" if getattr(facts, "memory", None) is None else ""
    return (f"model config of {setup.training.get('model_name_or_path')} not read ({facts.model.problem}): not "
            f"checked: {', '.join(report.skipped)}{table}")
