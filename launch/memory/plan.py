"""A resolved run's memory plan for a target machine: the one place that assembles the memory model's inputs
(the model's config.json -> its `Architecture`; the run's `Layout`, configs and checkpointing -> its `RunShape`;
the target's GPUs and host memory) and its answer. The plan's lengths are its layout's (`MemoryPlan.layout`: with
`auto`, the run's layout at the length found), so a printout of both shows one length.

Used by the run's preflight and `--dry-run` (`launch.run.runner`), `python -m launch plan` and `bench`
(`launch.commands`), the README "fits on" lines (`launch.catalog.blocks`) and the bench summary. Reads only the
model's config.json (`launch.facts.hub`: a local folder, the hub cache, or the hub when reachable), never weights.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, replace

from launch import memory
from launch.facts import gpus, hub, meta_model
from launch.errors import LaunchError
from launch.config.layout import Layout

# The default target's GPU: the calibration GPU, an H100 SXM 80GB (launch.facts.gpus), and what it reports
# (torch.cuda.get_device_properties(0).total_memory, in GiB).
DEFAULT_GPU = gpus.CALIBRATION
GPU_MEMORY_GIB = DEFAULT_GPU.memory_gib
# The launcher's spare: the share of each GPU's memory a plan should leave unused, the planner's error as measured
# (launch/facts/calibration.py, one H100: the peak allocated 0-4.3% above the plan, the device memory in use from 1.0%
# below to 3.4% above it). The preflight refuses a run only above the GPU's capacity (the user's own settings; --force)
# and says so when a run is within the spare; settings the launcher chooses itself (`--fastest`) stay out of it.
SPARE = 0.05


@dataclass
class Target:
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_gib: float = GPU_MEMORY_GIB
    host_memory_gib: float | None = None  # per node; None: host checks are reported, not judged
    gpu: gpus.GPU | None = None  # the GPU model (launch.facts.gpus): its peak and rates for the throughput model

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def default_target(setup, gpu_memory_gib: float = GPU_MEMORY_GIB, host_memory_gib: float | None = None) -> Target:
    """The run's own machines: its processes per machine, its machine count."""
    return Target(setup.layout.processes_per_machine, setup.layout.num_machines, gpu_memory_gib, host_memory_gib)


def architecture(model: hub.ModelConfig) -> memory.Architecture:
    if model.config is None:
        raise LaunchError(f"The planner needs the model's config.json and could not read it: {model.problem}.")
    if problem := unmodelled(model.config):
        raise LaunchError(problem)
    return memory.Architecture.from_config(model.config)


def unmodelled(config) -> str | None:
    """Why the memory model does not describe this model, from the model's own modules (launch.facts.meta_model: built
    on the meta device): its repeated layer must hold exactly the Llama-style linear layers the memory model counts
    (`memory.architecture.LAYER_LINEARS`). None when it does, or when the model cannot be built here (the config's
    fields are then read as they are)."""
    found = meta_model.modules(config)
    if found is None:
        return None
    modelled = {f"{parent}.{name}" for name, parent in memory.LAYER_LINEARS.items()} | {memory.OUTPUT_LAYER}
    real = found.layer_linears()
    if set(real) == modelled:
        return None
    return (f"The memory model describes decoders built of Llama-style layers (linear layers "
            f"{', '.join(sorted(modelled))}: Llama, Mistral, Qwen2, Qwen3), and a {found.model_type} model is not one: "
            f"its linear layers are {', '.join(real) or 'none'}. Its memory cannot be planned here (`plan`, "
            "the memory table of a dry run and the fit check); plan a model of a Llama-style family, or run it and "
            "measure (`--bench` records each rank's peak memory).")


def run_shape(setup, environ=None) -> memory.RunShape:
    """The memory model's view of a resolved run: its layout, configs and checkpointing, each resolved once, and the
    allocator setting the ranks will run with (`environ`: the environment they inherit; default this process's)."""
    shape = memory.RunShape.from_layout(setup.layout, setup.accelerate, setup.training, setup.checkpointing,
                                        device="cpu" if setup.options.cpu else "gpu")
    environ = os.environ if environ is None else environ
    return replace(shape, expandable_segments=expandable_segments(setup.recipe.config.get("env") or {}, environ))


def expandable_segments(config_env: dict, environ) -> bool:
    """Whether the ranks' CUDA caching allocator runs with `expandable_segments:True`: PYTORCH_ALLOC_CONF (PyTorch
    2.9's name) or PYTORCH_CUDA_ALLOC_CONF, each a comma-separated `option:value` list, as the ranks see them -- the
    recipe config's `env:` block (TRL's parser sets it in each rank, over the inherited environment) first."""
    for source in (config_env, environ):
        for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
            if source.get(name) is not None:
                options = dict(o.split(":", 1) for o in str(source[name]).replace(" ", "").split(",") if ":" in o)
                return options.get("expandable_segments", "False").lower() in ("true", "1")
    return False


@dataclass
class MemoryPlan:
    estimate: memory.Estimate
    arch: memory.Architecture
    run: memory.RunShape  # its layout is the run's, at the length planned
    target: Target
    longest: int | None  # with auto: the longest global length that fits

    @property
    def layout(self) -> Layout:
        """The run's layout at the length the estimate is for (with auto: the length found)."""
        return self.run.layout

    @property
    def max_length(self) -> int:
        return self.layout.max_length

    @property
    def multiple(self) -> int:
        """What the length search steps by: the layout's `seq_multiple`."""
        return self.layout.seq_multiple

    @property
    def fits(self) -> bool:
        return memory.fits(self.estimate, self.target.gpu_memory_gib, self.target.host_memory_gib)

    @property
    def fits_with_spare(self) -> bool:
        """Fits with the launcher's spare (`SPARE`) left unused on every GPU."""
        return self.fits and self.estimate.gpu_peak_gib <= self.target.gpu_memory_gib * (1 - SPARE)

    def with_run(self, run: memory.RunShape) -> "MemoryPlan":
        """The plan of the same model on the same target with another run shape (another length: `run.with_length`;
        other speed settings: `launch.speed.fastest`): the one way to re-plan a changed run."""
        return replace(self, estimate=memory.estimate(self.arch, run), run=run, longest=None)

    def as_json(self) -> dict:
        est = self.estimate
        return {
            "fits": self.fits,
            "gpu_peak_gib": round(est.gpu_peak_gib, 3),
            "gpu_allocated_peak_gib": round(est.allocated_peak_gib, 3),
            "host_peak_gib": round(est.host_per_node_gib, 3),
            "host_per_process_gib": round(est.host_per_process_gib, 3),
            "max_length": self.longest if self.longest is not None else self.max_length,
            "per_rank_length": est.per_rank_length,
            "length_multiple": self.multiple,
            "breakdown": {t.name: round(t.gib, 3) for t in est.gpu_terms if t.counted},
            "host_breakdown": {t.name: round(t.gib, 3) for t in est.host_terms},
            "target": {"gpus_per_node": self.target.gpus_per_node, "nodes": self.target.nodes,
                       "gpu_memory_gib": self.target.gpu_memory_gib, "host_memory_gib": self.target.host_memory_gib},
            "largest_term": est.largest_gpu_term().name,
            "precision": {**dataclasses.asdict(self.run.precision),
                          "bytes_per_trainable_param": self.run.precision.bytes_per_param},
            "advice": est.advice(self.target.gpu_memory_gib, self.target.host_memory_gib),
            "notes": est.notes,
            **({"gpu": self.target.gpu.as_json()} if self.target.gpu is not None else {}),
        }


def plan_memory(setup, target: Target, auto: bool = False, model: hub.ModelConfig | None = None,
                environ=None, data=None) -> MemoryPlan:
    """The memory plan of a resolved run on `target`; with `auto`, at the longest global length that fits (a
    multiple of the layout's `seq_multiple`). `model`: its config.json when the caller has read it already;
    `environ`: the environment the ranks inherit (default this process's; the README lines plan the recipe alone).
    `data`: the dataset's measured length profile (`launch.facts.dataset.Profile`): the run is planned at the row
    length its batches peak at (a padded batch's longest row; a packed row's max_length) and carries its real-token
    share; without it, at max_length. Raises LaunchError when the model's config.json cannot be read."""
    model = model if model is not None else hub.read_model_config(setup.training.get("model_name_or_path"))
    arch = architecture(model)
    run = run_shape(setup, environ)
    if data is not None:
        run = replace(run, real_token_share=data.real_share, conversation_length=data.attention_length)
        if not auto:
            run = run.with_length(data.peak_length(run.layout.seq_multiple))
    longest = None
    if auto:
        multiple = run.layout.seq_multiple
        longest = memory.longest_length(arch, run, target.gpu_memory_gib, target.host_memory_gib, multiple)
        run = run.with_length(longest or multiple)
    return MemoryPlan(memory.estimate(arch, run), arch, run, target, longest)


def describe(plan: MemoryPlan) -> str:
    t = plan.target
    lines = [f"Target: {t.nodes} node(s) x {t.gpus_per_node} GPU(s) of {t.gpu_memory_gib:g} GiB, host memory "
             + (f"{t.host_memory_gib:g} GiB per node" if t.host_memory_gib is not None else "unknown (not judged)")]
    if t.gpu is not None:
        lines.append(f"GPU: {t.gpu.describe()}")
    if plan.longest is not None:
        lines.append(f"Longest global max_length that fits: {plan.longest:,} tokens (a multiple of {plan.multiple}); "
                     "the table is for that length.")
    lines.append(memory.format_table(plan.estimate, t.gpu_memory_gib, t.host_memory_gib))
    lines.append("Predicted by the memory model (launch/memory/), not measured; `--bench` on a run measures it.")
    return "\n".join(lines)


def trace_plan(plan: MemoryPlan, setup) -> tuple[str, dict]:
    """`plan --trace`: one step of the run's real model traced under fake tensors (`launch.memory.trace`), as the
    text printed under the plan and its JSON. A layout that cannot be traced gives its one-line reason."""
    from launch.memory import trace

    why = trace.untraceable(plan.run)
    if why:
        return f"Not traced: {why}.", {"untraced": [why]}
    model = hub.read_model_config(setup.training.get("model_name_or_path"))
    traced = trace.trace(model.config, plan.run, analytic=plan.estimate)
    return trace.format_comparison(traced, plan.estimate), trace.compare(traced, plan.estimate)
