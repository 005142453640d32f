"""The README blocks and train.py copies in the recipe folders that are generated from the code, so that each fact
is written once:

- `train.py` copies of `templates/train.py` (`launch.copies`);
- README blocks between `<!-- generated: NAME -->` and `<!-- end generated -->`: `rules-cp` / `rules-sp` (the
  rules a CP / SP configuration must keep, from `launch.rules`), and later blocks registered in GENERATORS.

`python -m launch sync-scripts` rewrites them; `check()` (run by tests/test_recipe_layout.py in CI) names every copy
or block that differs from what the code generates.
"""

from __future__ import annotations

import re
from pathlib import Path

from launch import REPO_ROOT, copies, hub
from launch.memory_plan import default_target, plan_memory
from launch.options import Options
from launch.recipes import RECIPES_DIR, find_recipe, recipe_dirs
from launch.resolve import resolve
from launch.rules import RULES

BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def rules_table(features: tuple[str, ...]) -> str:
    rows = ["| the configuration must keep | otherwise |", "|---|---|"]
    rows += [f"| {r.doc[0]} | {r.doc[1]} |" for r in RULES if r.doc and r.feature in features]
    return "\n".join(rows) + "\n"


MODEL_CONFIGS = REPO_ROOT / "docs" / "model_configs"


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
    plan = plan_memory(setup, target, model=config)
    longest = plan_memory(setup, target, auto=True, model=config).longest
    est = plan.estimate
    biggest = max(est.host_terms, key=lambda term: term.gib, default=None)
    host = f"; host memory {est.host_per_node_gib:,.0f} GiB per node" + (
        f" (most of it: {biggest.name})" if biggest is not None and est.host_per_node_gib >= 16 else "")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    return (f"**Fits on** ({verdict}; predicted by `python -m launch plan` for this folder, not measured): "
            f"{target.gpus_per_node} x 80 GB GPUs ({target.gpu_memory_gib:g} GiB each) with "
            f"{est.gpu_peak_gib:.1f} GiB per GPU at max_length {plan.max_length:,} ({est.per_rank_length:,} tokens per "
            f"rank; largest term: {est.largest_gpu_term().name}){host}; the longest max_length that fits: "
            f"{longest:,}.\n")


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


def check(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    return copies.check_copies(recipes_dir) + readme_problems([p.parent for p in recipes_dir.glob("*/README.md")])


def sync(recipes_dir: Path = RECIPES_DIR, out=print) -> int:
    copies.sync_copies(recipes_dir, out=out)
    for readme in sorted(recipes_dir.glob("*/README.md")):
        text = readme.read_text()
        new = render(text, readme.parent)
        if new != text:
            readme.write_text(new)
            out(f"updated {readme}")
    return 0
