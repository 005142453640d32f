"""The README blocks and train.py copies that are generated from the code, so that each fact is written once:

- `train.py` copies of `templates/train.py` in the recipe folders (`launch.recipe.copies`);
- blocks between `<!-- generated: NAME -->` and `<!-- end generated -->` in each recipe's README (GENERATORS:
  `rules-cp` / `rules-sp`, the rules a CP / SP configuration must keep, from `launch.checks.rules`; `fits-on`, the
  planner's line for the recipe's own hardware) and in the repository's pages, README.md and docs/*.md (PAGE_GENERATORS:
  `recipe-table` from the recipe folders, `floors` from launch/'s imports, `timings` from docs/timings.json,
  `gpu-table` from launch/facts/gpus.py, `published-runs` from benchmarks/published_runs.json, each row planned).

`python -m launch sync-scripts` rewrites them; `check()` (run by tests/test_recipe_layout.py in CI) names every copy
or block that differs from what the code generates.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from launch import REPO_ROOT, memory
from launch.catalog import floors
from launch.facts import calibration, gpus, hub
from launch.recipe import copies
from launch.catalog.table import recipe_rows
from launch.memory.plan import DEFAULT_GPU, SPARE, Target, default_target, plan_memory
from launch.config.options import Options, Parser, add_options, split_extra, values_from
from launch.speed import communication, model as throughput_model
from launch.speed.error_band import format_speed
from launch.recipe.discovery import RECIPES_DIR, find_recipe, recipe_dirs, recipe_names
from launch.run.resolve import resolve
from launch.checks.rules import RULES

BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def rules_table(features: tuple[str, ...]) -> str:
    rows = ["| the configuration must keep | otherwise |", "|---|---|"]
    rows += [f"| {r.doc[0]} | {r.doc[1]} |" for r in RULES if r.doc and r.feature in features]
    return "\n".join(rows) + "\n"


MODEL_CONFIGS = hub.SHIPPED_CONFIGS


def fits_on(folder: Path) -> str:
    """The recipe's GPU defaults planned for their stated hardware (the recipe's process count x an 80 GB GPU), with
    the model's architecture from the repository's copy of its config.json (docs/model_configs)."""
    recipe = find_recipe(str(folder))  # the folder's own config: a copied folder renders the same text
    model = str(recipe.config.get("model_name_or_path", ""))
    config_dir = MODEL_CONFIGS / model.replace("/", "--")
    if not (config_dir / "config.json").is_file():
        return (f"No planner line: {model}'s config.json is not in {MODEL_CONFIGS.relative_to(REPO_ROOT)} "
                "(add it to get one).\n")
    setup = resolve(Options(recipe=str(folder), extra=["--model_name_or_path", str(config_dir)]),
                    progress=lambda *_: None)
    config = hub.read_model_config(str(config_dir))
    target = default_target(setup)
    # the recipe's own settings (its config's env: block), not this process's environment
    plan = plan_memory(setup, target, model=config, environ={})
    longest = plan_memory(setup, target, auto=True, model=config, environ={}).longest
    est = plan.estimate
    biggest = max(est.host_terms, key=lambda term: term.gib, default=None)
    host = f"; host memory {est.host_per_node_gib:,.0f} GiB per node" + (
        f" (most of it: {biggest.name})" if biggest is not None and est.host_per_node_gib >= 16 else "")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    if not plan.run.gradient_checkpointing:  # its speed settings do without: how far checkpointing would take it
        checkpointed = memory.longest_length(plan.arch, replace(plan.run, gradient_checkpointing=True),
                                             target.gpu_memory_gib, target.host_memory_gib, plan.multiple)
        longer = f" ({checkpointed:,} with activation checkpointing on)"
    else:
        longer = ""
    machines = f"{target.nodes} machines x " if target.nodes > 1 else ""
    precision = plan.run.precision
    masters = f"fp32 masters: {precision.master}" if precision.master else "pure 16-bit, no fp32 masters"
    return (f"**Fits on** ({verdict}; predicted by `python -m launch plan` for this folder, not measured): "
            f"{machines}{target.gpus_per_node} x 80 GB GPUs ({target.gpu_memory_gib:g} GiB each) with "
            f"{est.gpu_peak_gib:.1f} GiB per GPU at max_length {plan.max_length:,} ({est.per_rank_length:,} tokens per "
            f"rank; largest term: {est.largest_gpu_term().name}; {precision.bytes_per_param} bytes per trained "
            f"parameter, {masters}){host}; the longest max_length that fits: {longest:,}{longer}.\n")


# name -> function(recipe folder) -> the block's text
GENERATORS = {
    "rules-cp": lambda folder: rules_table(("parallel", "context_parallel", "long_context")),
    "rules-sp": lambda folder: rules_table(("parallel", "sequence_parallel", "alst", "long_context")),
    "fits-on": fits_on,
}


def render(text: str, folder: Path) -> str:
    def fill(m):
        gen = GENERATORS.get(m.group("name"))
        return m.group(0) if gen is None else m.group(1) + gen(folder) + m.group(4)

    return BLOCK.sub(fill, text)


def readme_problems(folders=None) -> list[str]:
    out = []
    for folder in folders or recipe_dirs():
        readme = folder / "README.md"
        text = readme.read_text()
        for m in BLOCK.finditer(text):
            if m.group("name") not in GENERATORS:
                out.append(f"{readme}: unknown generated block `{m.group('name')}`")
        if render(text, folder) != text:
            names = [m.group("name") for m in BLOCK.finditer(text)
                     if render(m.group(0), folder) != m.group(0)]
            out.append(f"{readme}: generated block(s) {', '.join(names)} differ from what the code generates for "
                       f"this folder; run `python -m launch sync-scripts` to regenerate them")
    return out


# The repository's pages: README.md (the front page) and docs/*.md. Their blocks are generated from the whole
# repository, not from one recipe folder.
TIMINGS = REPO_ROOT / "docs" / "timings.json"
RECIPE_LINK = re.compile(r"^\| \[`[^`]+`\]\(recipes/(?P<name>[^/)]+)/README\.md\)", re.M)


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def recipe_table(body: str | None) -> str:
    """README's recipe table, one row per recipe folder (`launch.catalog.table`). `body`: the block as it stands, when
    checking: then only the recipes it lists (and that still exist) are held to their folders, so that a recipe you
    copy or fork into recipes/ does not make the shipped README stale; `sync-scripts` (body None) adds its row."""
    names = recipe_names()
    if body is not None:
        listed = {m.group("name") for m in RECIPE_LINK.finditer(body)}
        names = [name for name in names if name in listed]
    rows = ["| recipe | strategy | GPUs | GPU defaults "
            "| speed settings (checkpointing, Liger, micro-batch x accumulation) "
            "| smoke run on CPU (CI) | what it is for |",
            "|---|---|---|---|---|---|---|"]
    for r in recipe_rows(names):
        model = ", ".join(name.rsplit("/", 1)[-1] for name in (r["model"], r["dataset"]) if name)
        length = f", {r['max_length']:,} tokens" if isinstance(r["max_length"], int) else ""
        cpu = f"{r['cpu_processes']} processes, judged" if r["cpu_verified"] else "not recorded"
        rows.append(f"| [`{r['name']}`](recipes/{r['name']}/README.md) | {r['strategy']} | {r['processes']} | "
                    f"{model}{length} | {r['speed']} | {cpu} | {r['purpose']} |")
    return "\n".join(rows) + "\n"


def timings(body: str | None) -> str:
    """The launcher's own timings as `benchmarks/timings.py` last measured them (docs/timings.json)."""
    rel = TIMINGS.relative_to(REPO_ROOT)
    if not TIMINGS.is_file():
        return f"No timings recorded yet: `python benchmarks/timings.py` measures them into `{rel}`.\n"
    data = json.loads(TIMINGS.read_text())
    host = data["host"]
    rows = [f"Measured by `python benchmarks/timings.py` on {data['date'][:10]} ({host['cpus']} CPU cores, "
            f"{host['machine']}, Python {host['python']}, load average {data['load_average']:.1f} at the start;\n"
            f"offline; wall time of the whole command, median of {data['runs']} runs after {data['warmup']} "
            f"warm-up run; `{rel}` holds every run):", "",
            "| command | median (s) | fastest (s) | slowest (s) |", "|---|---|---|---|"]
    floor = next((c for c in data["commands"] if data.get("imports") and data["imports"] in c["command"]), None)
    for c in data["commands"]:
        over = f" | {c['median_s'] - floor['median_s']:+.2f}" if floor else ""
        rows.append(f"| `{c['command']}` | {c['median_s']:.2f} | {c['min_s']:.2f} | {c['max_s']:.2f}{over} |")
    if floor:  # the imports' floor: what the launcher adds to them is the last column
        rows[2:4] = ["| command | median (s) | fastest (s) | slowest (s) | over the imports (s) |",
                     "|---|---|---|---|---|"]
    return "\n".join(rows) + "\n"


TRACE_TABLE = REPO_ROOT / "docs" / "trace-table.json"


def trace_table(body: str | None) -> str:
    """Every recipe's GPU default, analytic and traced, as `benchmarks/trace_table.py` last measured it."""
    rel = TRACE_TABLE.relative_to(REPO_ROOT)
    if not TRACE_TABLE.is_file():
        return f"No traces recorded yet: `python benchmarks/trace_table.py` writes them into `{rel}`.\n"
    data = json.loads(TRACE_TABLE.read_text())
    rows = [f"Measured by `python benchmarks/trace_table.py` on {data['date'][:10]} ({data['host']['cpus']} CPU cores, "
            f"load average {data['load_average']:.1f} at the start; `{rel}` holds every category), each recipe's GPU "
            f"default with `-- {' '.join(data.get('training_args', [])) or 'nothing'}` (Liger's Triton kernels do "
            "not run under fake tensors; so the plans here are above the defaults' own, which count Liger's smaller "
            "activations). Allocated peak "
            "per GPU in GiB (what `torch.cuda.max_memory_allocated` reports: without the CUDA context, NCCL and the "
            "allocator's reserve, which neither side can see); ratio = traced / analytic.", "",
            "| recipe | tokens per rank | analytic (GiB) | traced (GiB) | ratio | wall (s) |",
            "|---|---|---|---|---|---|"]
    for r in data["recipes"]:
        if "error" in r:
            rows.append(f"| `{r['recipe']}` | | | error: {r['error']} | | |")
            continue
        tokens = f"{r['per_rank_length']:,}"
        if "ratio" in r:
            rows.append(f"| `{r['recipe']}` | {tokens} | {r['analytic_allocated_gib']:.2f} | "
                        f"{r['traced_allocated_gib']:.2f} | {r['ratio']:.2f} | {r['wall_s']:.0f} |")
        else:
            rows.append(f"| `{r['recipe']}` | {tokens} | {r['analytic_allocated_gib']:.2f} | "
                        f"not traced: {r['untraced']} | | |")
    return "\n".join(rows) + "\n"


def gpu_table(body=None) -> str:
    """docs/planning.md's table of the GPU models `plan --gpu` takes (`launch.facts.gpus.GPUS`)."""
    lines = ["Generated from `launch/facts/gpus.py` (`GPUS`; each row's data sheet is its source).", "",
             "| `--gpu` | memory | GiB as torch reports it | dense BF16 peak (TFLOP/s) | memory bandwidth (TB/s) "
             "| between GPUs (GB/s per GPU) | source |",
             "|---|---|---|---|---|---|---|"]
    for g in gpus.GPUS:
        lines.append(f"| `{g.name}` | {g.memory_gb:g} GB {g.memory} | {g.memory_gib:g} | {g.peak_bf16 / 1e12:,.1f} "
                     f"| {g.memory_bytes_per_s / 1e12:.3g} | {g.link} {g.link_bytes_per_s / 1e9:,.0f} | {g.source} |")
    return "\n".join(lines) + "\n"


PUBLISHED_RUNS = REPO_ROOT / "benchmarks" / "published_runs.json"


def plan_published(command: list[str]):
    """The planner on `python -m launch plan COMMAND`'s target and settings, in process and as `plan` does it (its
    options `--gpus`, `--nodes`, `--gpu`, `--gpu-memory`, `--network-gbps`, `--model`, the mesh sizes, and training
    arguments after `--`), with the recipe's own environment: (memory plan, predicted step or None). Raises what
    `plan` refuses with (LaunchError, argparse's SystemExit)."""
    p = Parser(prog="published run")
    add_options(p, ("recipe", "model", "mesh"))
    p.add_argument("--gpus", type=int)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu")
    p.add_argument("--gpu-memory", type=float)
    p.add_argument("--network-gbps", type=float, default=communication.DEFAULT_NETWORK_GBPS)
    own, extra = split_extra(command)
    ns = p.parse_args(own)
    gpu = gpus.lookup(ns.gpu) if ns.gpu else DEFAULT_GPU
    options = Options(**values_from(ns, ("recipe", "model", "mesh")), extra=extra,
                      num_machines=ns.nodes if ns.nodes > 1 or ns.gpus else None,
                      num_processes=ns.gpus * ns.nodes if ns.gpus else None)
    setup = resolve(options, progress=lambda *_: None)
    target = Target(ns.gpus or setup.layout.processes_per_machine, ns.nodes,
                    ns.gpu_memory if ns.gpu_memory is not None else gpu.memory_gib, None, gpu)
    plan = plan_memory(setup, target, environ={})
    cost = throughput_model.predict(plan.arch, plan.run, gpu=gpu, network_gbps=ns.network_gbps) \
        if plan.run.layout.max_length else None
    return plan, cost


def published_runs(body=None) -> str:
    """docs/planning.md's table of published multi-GPU runs (benchmarks/published_runs.json), each row's command
    planned in process and its predicted tokens/s per GPU set beside the published figure."""
    rel = PUBLISHED_RUNS.relative_to(REPO_ROOT)
    lines = [f"Generated from `{rel}` (each row's source, published figure, conversion and assumptions) by planning "
             "each row's command in process as `python -m launch plan COMMAND` does; predicted with the throughput "
             "model's error band (`launch/speed/error_band.py`); error = predicted / published - 1.", "",
             "| row | command | predicted per GPU | published (tokens/s per GPU) | error | fitted on it | source |",
             "|---|---|---|---|---|---|---|"]
    for row in json.loads(PUBLISHED_RUNS.read_text())["rows"]:
        plan, cost = plan_published(row["command"])
        published = row["published_tokens_per_s_per_gpu"]
        command = "python -m launch plan " + " ".join(f'"{a}"' if " " in a else a for a in row["command"])
        if cost:
            predicted = cost.tokens_per_s_per_gpu
            cells = f"{format_speed(predicted, calibration.ERROR_BAND)} | {published:,.0f} | " \
                    f"{predicted / published - 1:+.1%}"
        else:  # reported, not hidden
            cells = f"no prediction | {published:,.0f} | "
        fit = "" if plan.fits else " (planned not to fit)"
        lines.append(f"| {row['label']}{fit} | `{command}` | {cells} | {'yes' if row['fitted'] else 'no'} | "
                     f"{row['source']} |")
    return "\n".join(lines) + "\n"


# docs/planning.md "Packed rows": the recipes, lengths and micro-batches whose packed attention is set against
# padded rows (a small model, where attention weighs most, and the lora recipe's Qwen3-8B)
PACKING_RECIPES = ("ddp", "lora")
PACKING_LENGTHS = (2048, 4096, 8192)
PACKING_BATCHES = (1, 2)


def packing_costs(body=None) -> str:
    """docs/planning.md's table of what a packed row costs by attention kernel: each of PACKING_RECIPES at its GPU
    defaults on the default GPU, at each length and micro-batch, planned padded (full rows, causal attention without
    a mask), packed under SDPA (transformers' block mask: the whole flat row's square) and packed under
    FlashAttention varlen (each conversation's causal triangle); and the SDPA backend each GPU of the table runs the
    mask on (`throughput_model.masked_sdpa_backend`)."""
    gpu = DEFAULT_GPU
    modes = (("padded", {"padding_free": False}),
             ("packed, sdpa (block mask)", {"padding_free": True, "attn_implementation": "sdpa"}),
             ("packed, flash varlen", {"padding_free": True, "attn_implementation": "flash_attention_2"}))
    kernels: dict[str, list[str]] = {}
    for g in gpus.GPUS:
        kernels.setdefault(throughput_model.masked_sdpa_backend(g), []).append(g.name)
    lines = [f"Generated by `launch/catalog/blocks.py` (`packing_costs`) from the planner, per GPU of the recipe's "
             f"defaults on {gpu.name}s: predicted tokens/s per GPU (all tokens of the planned rows) and peak GiB per "
             f"GPU (of {gpu.memory_gib:g}; \"does not fit\": not within the launcher's spare), the recipe's "
             "checkpointing and "
             "Liger settings kept. No dataset profile is read here (the recipes' datasets are not in this checkout): "
             "full-length conversations, so a padded row has no padding and FlashAttention varlen computes what the "
             "padded row does; with a measured dataset `plan` counts its conversations' lengths "
             "(`RunShape.conversation_length`) and padding (`real_token_share`). Which SDPA backend runs the mask: "
             + "; ".join(f"{kernel} on {', '.join(names)}" for kernel, names in kernels.items())
             + " (torch 2.13's dispatch as `masked_sdpa_backend` reads it; not measured here). FlashAttention varlen "
             "is opt-in on every GPU (`flash_attention_4` on compute capability 9.0 and newer, `flash_attention_2` "
             "with `FLASH_ATTN=1`).", "",
             "| recipe | max_length | micro-batch | " + " | ".join(f"{m}: tokens/s, GiB" for m, _ in modes) + " |",
             "|---|---|---|" + "---|" * len(modes)]
    for name in PACKING_RECIPES:
        plan, _cost = plan_published([name])
        model = plan.run  # the recipe's defaults as planned
        assert model.padding_free, f"{name}: the recipe no longer packs; PACKING_RECIPES names recipes that do"
        label = f"`{name}` ({find_recipe(name).config['model_name_or_path'].rsplit('/', 1)[-1]}, " \
                f"{plan.run.layout.world_size} GPUs)"
        for length in PACKING_LENGTHS:
            for batch in PACKING_BATCHES:
                layout = replace(model.layout.with_length(length), per_device_train_batch_size=batch)
                cells = []
                for _mode, change in modes:
                    run = replace(model, layout=layout, **change)
                    est = memory.estimate(plan.arch, run)
                    cost = throughput_model.predict(plan.arch, run, gpu=gpu)
                    over = "" if est.gpu_peak_gib <= gpu.memory_gib * (1 - SPARE) else " (does not fit)"
                    cells.append(f"{cost.tokens_per_s_per_gpu:,.0f}, {est.gpu_peak_gib:.1f}{over}")
                lines.append(f"| {label} | {length:,} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# name -> function(the block as it stands when checking, None when syncing) -> the block's text
PAGE_GENERATORS = {
    "packing-costs": packing_costs,
    "gpu-table": gpu_table,
    "published-runs": published_runs,
    "recipe-table": recipe_table,
    "floors": lambda body: floors.floor_table(),
    "timings": timings,
    "trace-table": trace_table,
}


def render_page(text: str, checking: bool = False) -> str:
    def fill(m):
        gen = PAGE_GENERATORS.get(m.group("name"))
        return m.group(0) if gen is None else m.group(1) + gen(m.group("body") if checking else None) + m.group(4)

    return BLOCK.sub(fill, text)


def page_problems(paths=None) -> list[str]:
    out = []
    for page in paths or pages():
        text = page.read_text()
        rel = page.relative_to(REPO_ROOT) if page.is_relative_to(REPO_ROOT) else page
        for m in BLOCK.finditer(text):
            if m.group("name") not in PAGE_GENERATORS:
                out.append(f"{rel}: unknown generated block `{m.group('name')}`")
            elif render_page(m.group(0), checking=True) != m.group(0):
                out.append(f"{rel}: generated block `{m.group('name')}` differs from what the code generates; run "
                           "`python -m launch sync-scripts` to regenerate it")
    return out


def check(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    problems = copies.check_copies(recipes_dir) + readme_problems([p.parent for p in recipes_dir.glob("*/README.md")])
    # the repository's pages describe the repository's own recipes folder, not a copy of one elsewhere
    return problems + (page_problems() if recipes_dir == RECIPES_DIR else [])


def sync(recipes_dir: Path = RECIPES_DIR, out=print) -> int:
    copies.sync_copies(recipes_dir, out=out)
    readmes = sorted(recipes_dir.glob("*/README.md"))
    for readme in readmes + (pages() if recipes_dir == RECIPES_DIR else []):
        text = readme.read_text()
        new = render(text, readme.parent) if readme in readmes else render_page(text)
        if new != text:
            readme.write_text(new)
            out(f"updated {readme}")
    return 0
