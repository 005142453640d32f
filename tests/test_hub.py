"""launch/facts/hub.py: a model's config.json is read with AutoConfig from the hub cache when it is there, and its
absence offline is reported without importing transformers' model registry (the cost of an offline dry run)."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.launcher import REPO, test_env

PROBE = """
import json, sys
from launch.facts import hub
missing = hub.read_model_config("org/not-cached")
registry_imported = "transformers.models" in sys.modules
cached = hub.read_model_config("org/cached")
print(json.dumps({"missing": missing.problem, "registry_imported": registry_imported, "source": cached.source,
                  "problem": cached.problem, "layers": getattr(cached.config, "num_hidden_layers", None)}))
"""


def test_config_from_the_hub_cache_and_none_offline_without_loading_the_model_registry(tmp_path):
    # the hub cache's layout: models--ORG--NAME/{refs/main, snapshots/REVISION/config.json}
    repo = tmp_path / "hub" / "models--org--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    config = json.loads((REPO / "docs" / "model_configs" / "Qwen--Qwen3-0.6B" / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps(config))

    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=test_env({"HF_HUB_CACHE": str(tmp_path / "hub")}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert ("offline (HF_HUB_OFFLINE) and config.json of org/not-cached is not in the Hugging Face cache"
            in out["missing"])
    assert out["registry_imported"] is False
    assert (out["source"], out["problem"], out["layers"]) == ("hub cache", None, config["num_hidden_layers"])
