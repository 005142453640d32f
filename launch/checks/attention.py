"""The attention implementation each recipe gets on this machine, and why: a check per recipe, which doctor and
the image's start run with the performance traps (launch.checks.traps).

What a recipe gets follows from its `attn_implementation`, its layout (ring CP runs SDPA only; Accelerate's Ulysses
SP accepts flash_attention_2/3 and sdpa; the padded DP/ZeRO/FSDP recipes any of them), the GPU and what is installed;
where a faster route is available the check says how to opt in, and a recipe asking for an attention this machine
cannot run is a problem that names SDPA, which every recipe runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.checks.traps import (FLASH_ATTN_4, FLASH_ATTN_4_MIN_MAJOR, NOT_CHECKED, Check, _gpu, _torch,
                                 flash_attn_4_import, flash_attn_import)
from launch.constants import FLASH_ATTENTION, MESH_KEYS
from launch.facts.machine import kernels_route
from launch.recipe.discovery import find_recipe, recipe_names

# What Accelerate 1.15's ParallelismConfig accepts as sp_attn_implementation for Ulysses SP (besides hub kernels
# named org/flash-attn*): flash_attention_4 is refused there.
SP_BUILTIN_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")


@dataclass(frozen=True)
class AttentionFacts:
    """What decides the attention a recipe gets here."""

    gpu: bool
    capability: tuple[int, int] | None = None
    flash_attn_2: bool = False                # flash-attn (FLASH_ATTN=1) imports with its CUDA extension
    flash_attn_4: str | None = None           # flash-attn-4's version when installed
    flash_attn_4_error: str | None = None     # why it does not import (checked on a GPU it runs on)
    kernels: bool = False                     # the kernels hub route is usable (kernels_route)

    @property
    def flash_attn_4_runs(self) -> bool:
        return (self.gpu and self.capability is not None and self.capability[0] >= FLASH_ATTN_4_MIN_MAJOR
                and self.flash_attn_4 is not None and self.flash_attn_4_error is None)


def attention_path(accelerate: dict) -> str:
    """The layout whose attention rules apply to a recipe: "cp" (ring-attention CP: torch dispatches SDPA only), "sp"
    (Ulysses SP: Accelerate's list) or "dp" (everything else: padded batches under DDP, ZeRO or FSDP)."""
    pc = accelerate.get("parallelism_config") or {}
    if int(pc.get(MESH_KEYS["cp"], 1) or 1) > 1:
        return "cp"
    if int(pc.get(MESH_KEYS["sp"], 1) or 1) > 1:
        return "sp"
    return "dp"


def recipe_attention(recipe: str, wanted: str, facts: AttentionFacts, path: str = "dp") -> tuple[str, str | None]:
    """(what the recipe gets here and why, problem or None). A recipe asking for an attention this machine cannot
    run gets a problem that names the fallback every recipe runs, SDPA."""
    fa4 = facts.flash_attn_4
    if not facts.gpu:
        opt_in = (f"; {FLASH_ATTN_4} (flash-attn-4 {fa4}) can be chosen on compute capability >= "
                  f"{FLASH_ATTN_4_MIN_MAJOR}.0" if fa4 and path == "dp" and wanted == "sdpa" else "")
        return (f"{NOT_CHECKED}: {wanted} on a GPU{opt_in} (the --cpu profile runs flash attention settings as "
                "sdpa)"), None
    cc = f"{facts.capability[0]}.{facts.capability[1]}" if facts.capability else "?"
    fallback = ("set attn_implementation: sdpa (every recipe runs it; the same result, docs/container.md, "
                "\"Attention per recipe\")")
    if wanted == "sdpa":
        why = {"cp": "ring CP dispatches SDPA only", "sp": "the recipe's setting (Ulysses drops the mask: causal SDPA)",
               "dp": "the recipe's setting"}[path]
        faster = ""
        if path == "dp" and facts.flash_attn_4_runs:
            faster = (f"; faster on this GPU without a compile: -- --attn_implementation {FLASH_ATTN_4} "
                      f"(flash-attn-4 {fa4})")
        elif path in ("dp", "sp") and facts.flash_attn_2:
            faster = "; flash-attn is installed: -- --attn_implementation flash_attention_2"
        return f"sdpa ({why}){faster}", None
    if path == "cp":
        return "nothing: ring CP runs SDPA only", (
            f"recipe {recipe} sets attn_implementation: {wanted}, but ring-attention CP dispatches SDPA only: "
            f"{fallback}.")
    if wanted == FLASH_ATTN_4:
        if path == "sp":
            return "nothing: Accelerate refuses it for Ulysses SP", (
                f"recipe {recipe} sets attn_implementation: {FLASH_ATTN_4}, which Accelerate's ParallelismConfig "
                "refuses "
                f"for Ulysses SP (it accepts {', '.join(SP_BUILTIN_ATTENTION)}): {fallback}.")
        if facts.flash_attn_4_runs:
            return f"{FLASH_ATTN_4} (flash-attn-4 {fa4}; its kernels are JIT-compiled at first use)", None
        why = ("flash-attn-4 is not installed" if fa4 is None else
               f"this GPU's compute capability is {cc} (flash-attn-4 runs on >= {FLASH_ATTN_4_MIN_MAJOR}.0)"
               if facts.capability and facts.capability[0] < FLASH_ATTN_4_MIN_MAJOR else
               f"flash-attn-4 does not import ({facts.flash_attn_4_error})")
        return "nothing: flash-attn-4 cannot run here", (
            f"recipe {recipe} sets attn_implementation: {FLASH_ATTN_4} but {why}: {fallback}.")
    if wanted == "flash_attention_2":
        if facts.flash_attn_2:
            return "flash_attention_2 (flash-attn)", None
        if facts.kernels:
            return "kernels-community/flash-attn2 (the kernels hub, in place of flash-attn)", None
        return "nothing: flash-attn is not usable", (
            f"recipe {recipe} sets attn_implementation: {wanted} but flash-attn is not installed or does not import: "
            f"{fallback}, use {FLASH_ATTN_4} on compute capability >= {FLASH_ATTN_4_MIN_MAJOR}.0, or build the image "
            "with FLASH_ATTN=1.")
    if wanted in FLASH_ATTENTION or "/" in wanted:
        if facts.kernels:
            return f"{wanted} (the kernels hub)", None
        return f"nothing: {wanted} needs a kernel package the image does not have", (
            f"recipe {recipe} sets attn_implementation: {wanted}, which needs flash-attn-3 or the kernels hub route "
            f"({kernels_route()[1]}): {fallback}.")
    return wanted, None


def recipe_attn_settings(errors: dict[str, str] | None = None) -> dict[str, str]:
    """{recipe: attn_implementation} of every recipe folder (read as the launcher reads them). A folder the launcher
    cannot read is left out and, when `errors` is given, put there with the launcher's message."""
    from launch.errors import LaunchError

    out = {}
    for name in recipe_names():
        try:
            recipe = find_recipe(name, optional=("expected_metrics.json",))
        except LaunchError as e:
            if errors is not None:
                errors[name] = str(e)
            continue
        out[name] = str(recipe.config.get("attn_implementation") or "sdpa")
    return out


def recipe_paths(names) -> dict[str, str]:
    """{recipe: "cp" | "sp" | "dp"} from each recipe's Accelerate config (its parallelism_config)."""
    out = {}
    for name in names:
        try:
            out[name] = attention_path(find_recipe(name, optional=("expected_metrics.json",)).accelerate)
        except Exception:  # noqa: BLE001 - a recipe folder the launcher itself refuses: judged as padded batches
            out[name] = "dp"
    return out


def attention_facts(torch_module=None, state: tuple[str | None, str | None, str | None] | None = None,
                    state4: tuple[str | None, str | None] | None = None, kernels: bool | None = None) -> AttentionFacts:
    torch = _torch(torch_module)
    gpu = _gpu(torch)
    capability = tuple(torch.cuda.get_device_capability(0)) if gpu else None
    flash_2 = False
    if gpu:
        version, error, _ = flash_attn_import() if state is None else state
        flash_2 = version is not None and error is None
    runs4 = capability is not None and capability[0] >= FLASH_ATTN_4_MIN_MAJOR
    version4, error4 = flash_attn_4_import(load=runs4) if state4 is None else state4
    return AttentionFacts(gpu=gpu, capability=capability, flash_attn_2=flash_2, flash_attn_4=version4,
                          flash_attn_4_error=error4, kernels=kernels_route()[0] if kernels is None else kernels)


def check_recipes(recipe_attn: dict[str, str], torch_module=None,
                  state: tuple[str | None, str | None, str | None] | None = None,
                  paths: dict[str, str] | None = None, facts: AttentionFacts | None = None) -> list[Check]:
    facts = facts or attention_facts(torch_module, state)
    paths = paths if paths is not None else recipe_paths(recipe_attn)
    out = []
    for recipe, wanted in sorted(recipe_attn.items()):
        got, problem = recipe_attention(recipe, wanted, facts, paths.get(recipe, "dp"))
        out.append((f"attention {recipe}", got, problem))
    return out
