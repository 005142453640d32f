"""Checking the rules on copies of real recipe folders: a changed copy, this machine as the tests see it, and the
messages a resolved run gets (used by tests/test_rules.py, test_layout.py and test_bad_input.py)."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import yaml

from launch.checks import rules
from launch.facts import hub
from launch.checks.doctor import read_pins
from launch.facts.machine import REPORTED
from launch.recipe.discovery import RECIPES_DIR, find_recipe

# The versions of the fake machine: every package the launcher looks up (launch.facts.machine.REPORTED), at its pin, as
# in the image (the optional packages a setting needs included: launch.checks.rules' optional-package rules)
PINNED = {name: read_pins()[name] for name in REPORTED}


def make_recipe(tmp_path, base="zero3", config=None, accelerate=None, name="my-recipe"):
    """A copy of a real recipe folder, with config.yaml keys and/or its Accelerate config changed."""
    folder = tmp_path / name
    shutil.copytree(RECIPES_DIR / base, folder)
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    if accelerate is not None:
        acc = yaml.safe_load(find_recipe(base).accelerate_config_path.read_text())
        acc.update(accelerate)
        (folder / "accelerate.yaml").write_text(yaml.safe_dump(acc))
        cfg["accelerate_config"] = "accelerate.yaml"
    for key, value in (config or {}).items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


def facts(model_config: dict | None = None, **kw) -> rules.Facts:
    """This machine as the tests see it: 8 GPUs, the pinned versions, the model's config as given (attributes read
    like a transformers config), model and dataset found."""
    model = hub.ModelConfig(SimpleNamespace(**model_config) if model_config is not None else None, "not given")
    return rules.Facts(**{"versions": dict(PINNED), "gpu_count": 8, "model": model, **kw})


def messages(setup, f=None) -> list[str]:
    return rules.check(setup, f or facts()).all
