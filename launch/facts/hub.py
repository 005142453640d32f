"""What a run needs from the Hugging Face Hub, found before any process starts: the model's architecture (read
with transformers' own `AutoConfig`, from a local folder or the hub cache), and whether the model and the dataset
a recipe names can be found at all.

Offline (`HF_HUB_OFFLINE=1`) nothing is downloaded and nothing is retried. Online, the hub is probed once with a
short timeout before `AutoConfig` may download a `config.json` (a few kB): without that probe an unreachable hub
costs ~25 s of huggingface_hub's retries.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from launch import REPO_ROOT

PROBE_TIMEOUT_S = 3.0
# config.json of each model the recipes name, as <org>--<name>/config.json: the planner's answer offline
SHIPPED_CONFIGS = REPO_ROOT / "docs" / "model_configs"


@dataclass
class ModelConfig:
    config: object | None  # transformers PretrainedConfig of the text model (get_text_config()), or None
    problem: str | None = None  # why it could not be read (one sentence)
    source: str | None = None  # "local folder", "hub cache" or "hub"


def offline() -> bool:
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def looks_local(name: str) -> bool:
    """A path rather than a hub id (`org/name`): absolute, relative with ./ or ../, ~, or more than one slash."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


@lru_cache(maxsize=None)
def hub_reachable() -> str | None:
    """None if the hub endpoint accepts a TCP connection within PROBE_TIMEOUT_S; else why not."""
    # HF_ENDPOINT as huggingface_hub parsed it: the endpoint its downloads will use (launch.config.envvars says why
    # here)
    from huggingface_hub.constants import ENDPOINT as endpoint
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"{url.hostname}:{port} is not reachable ({e.strerror or e})"


@lru_cache(maxsize=None)
def read_model_config(name_or_path: str | None) -> ModelConfig:
    """The model's text config, from a local folder, the hub cache, the hub (online, hub reachable), or else the copy
    docs/model_configs/ ships of a recipe's model."""
    if not name_or_path:
        return ModelConfig(None, "no model_name_or_path is set")
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return ModelConfig(None, f"{path} has no config.json")
        return _load(str(path), "local folder", local_files_only=True)
    if looks_local(name_or_path):
        return ModelConfig(None, f"{name_or_path} does not exist")
    if problem := repo_id_problem(name_or_path):
        return ModelConfig(None, f"{name_or_path} is {problem}")
    if _config_in_hub_cache(name_or_path):
        cached = _load(name_or_path, "hub cache", local_files_only=True)
        if cached.config is not None:
            return cached
    hint = (f"copy its config.json into a folder and pass that folder, or run `hf download {name_or_path} config.json` "
            "on a machine that is online")
    shipped = SHIPPED_CONFIGS / name_or_path.replace("/", "--")
    if (shipped / "config.json").is_file() and (offline() or hub_reachable()):
        # a fresh clone offline: the copy this repository ships of the recipes' models (docs/model_configs/README.md)
        return _load(str(shipped), "shipped copy (docs/model_configs)", local_files_only=True)
    if offline():
        return ModelConfig(None, f"offline (HF_HUB_OFFLINE) and config.json of {name_or_path} is not in the Hugging "
                                 f"Face cache; {hint}")
    if why := hub_reachable():
        return ModelConfig(None, f"config.json of {name_or_path} is not cached and the hub cannot be reached ({why}); "
                                 f"{hint}")
    return _load(name_or_path, "hub")


def _config_in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _load(name: str, source: str, **kwargs) -> ModelConfig:
    # imported only when there is a config to read: importing AutoConfig costs ~0.8 s (transformers.models scans
    # every model folder), a third of an offline dry run whose model is not cached
    from transformers import AutoConfig

    try:
        full = AutoConfig.from_pretrained(name, **kwargs)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError/ValueError/KeyError for gated, unknown, corrupt
        # the first line, and the next one where the first only announces it (transformers' validators: "Class
        # validation error for validator 'validate_architecture':" then the ValueError)
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        first = (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0]) if lines else type(e).__name__
        return ModelConfig(None, f"AutoConfig could not read {name} ({first})")
    get_text = getattr(full, "get_text_config", None)
    return ModelConfig(get_text() if get_text else full, None, source)


def input_problem(name: str | None, kind: str) -> str | None:
    """None if the model (kind "model") or dataset (kind "dataset") can be found from this machine: an existing local
    path (a folder, for a model), or a well-formed hub id that is in the cache when offline."""
    if not name:
        return None
    key = "model_name_or_path" if kind == "model" else "dataset_name"
    path = Path(name).expanduser()
    if path.exists():
        return f"the {kind} path {name} is not a folder" if kind == "model" and not path.is_dir() else None
    if looks_local(name):
        return f"the {kind} {'folder ' if kind == 'model' else ''}{name} does not exist"
    if problem := repo_id_problem(name):
        return f"{key} `{name}`: {problem}"
    if offline() and not in_hub_cache(name, kind):
        return (f"offline (HF_HUB_OFFLINE) and the {kind} {name} is not in the Hugging Face cache ({_cache_dir()}); "
                f"download it on a machine that is online, or point {key} at a local copy")
    return None


def repo_id_problem(name: str) -> str | None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as e:
        return f"not a valid hub id ({str(e).splitlines()[0]})"
    return None


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def in_hub_cache(repo_id: str, repo_type: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of the repository (`repo_type` "model" or "dataset")."""
    from huggingface_hub.file_download import repo_folder_name

    return (Path(_cache_dir()) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)).is_dir()


def rope_parameters(config) -> dict:
    """The RoPE settings of a transformers config as the model has them (5.x: `rope_parameters`; older:
    `rope_scaling` + `rope_theta`), rope_theta included. Read by the RoPE rule (launch.checks.rules) and the loss
    sentinel's run identity (launch.results.sentinel)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params) if isinstance(params, dict) else {}
    if "rope_theta" not in params and getattr(config, "rope_theta", None) is not None:
        params["rope_theta"] = config.rope_theta
    return params


# ---- a model checked the way the ranks will load it (unchecked, each of these starts ranks that die 40-65 s later) --
# A parameter count no machine holds: 10^13 parameters are 20 TB in bf16 (the largest open models have ~10^12); a
# typo in config.json (hidden_size 409600) gives such counts, and random init or loading would run out of memory.
MAX_PARAMETERS = 10**13


def rough_parameters(config) -> int:
    """Embeddings, attention and MLP of a dense decoder (enough to tell a plausible size from an impossible one)."""
    h, layers = int(getattr(config, "hidden_size", 0) or 0), int(getattr(config, "num_hidden_layers", 0) or 0)
    inter, vocab = int(getattr(config, "intermediate_size", 0) or 4 * h), int(getattr(config, "vocab_size", 0) or 0)
    experts = int(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0) or 1)
    return 2 * vocab * h + layers * (4 * h * h + 3 * h * inter * experts)


def architecture_problem(config) -> str | None:
    """What in the model's (text) config crashes the ranks at model creation or at the first step, which
    AutoConfig does not check: non-positive sizes, query heads not a multiple of the KV heads, heads that do not
    divide the hidden size (when the config sets no head_dim of its own), a size no machine holds."""
    bad = []
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
                "num_key_value_heads", "head_dim"):
        value = getattr(config, key, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            bad.append(f"{key} is {value!r} (a positive integer)")
    if bad:
        return "; ".join(bad)
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if heads and kv and heads % kv:
        bad.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv} (grouped-query "
                   "attention shares each KV head among the same number of query heads)")
    hidden = getattr(config, "hidden_size", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    if heads and hidden and hidden % heads and head_dim == hidden // heads:  # head_dim derived by floor division
        bad.append(f"hidden_size {hidden} is not divisible by num_attention_heads {heads} (and no head_dim is set)")
    elif head_dim and head_dim % 2:  # RoPE rotates pairs of dimensions: an odd head_dim fails in the first forward
        bad.append(f"the head dimension is {head_dim}, odd (RoPE needs an even one)")
    if (n := rough_parameters(config)) > MAX_PARAMETERS:
        bad.append(f"about {n:.2g} parameters, more than any machine holds (hidden_size {hidden}, "
                   f"num_hidden_layers {getattr(config, 'num_hidden_layers', None)}, vocab_size "
                   f"{getattr(config, 'vocab_size', None)})")
    return "; ".join(bad) or None


def _has_weights(folder: Path) -> bool:
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    return any((folder / n).is_file() for n in names) or any(folder.glob("*.safetensors"))


def model_problem(name_or_path: str | None, synthetic: bool = False) -> str | None:
    """Why the ranks could not load this model, found before they start; None when they can (or it cannot be told
    here: a model not found at all is `input_problem`'s, a hub id whose config is not cached is skipped and said).
    A local folder must hold a config.json AutoConfig reads and, unless the run is synthetic (random weights from
    the config), the weights from_pretrained reads; any config read must describe a model that can be built."""
    if not name_or_path:
        return None
    model = read_model_config(name_or_path)
    if model.config is None:
        return folder_problem(name_or_path, synthetic)
    if problem := architecture_problem(model.config):
        return architecture_message(name_or_path, model.source, problem)
    return folder_problem(name_or_path, synthetic)


def architecture_message(name_or_path, source, problem: str) -> str:
    return (f"the model {name_or_path} ({source}) describes a model that cannot be built or trained: {problem}. Fix "
            "its config.json, or pass another model.")


def folder_problem(name_or_path: str | None, synthetic: bool = False) -> str | None:
    """A local model folder the ranks could not load: its config.json unreadable by AutoConfig, or (unless the run
    is synthetic) no weights."""
    if not name_or_path or not (path := Path(name_or_path).expanduser()).is_dir():
        return None
    model = read_model_config(name_or_path)
    if model.config is None:
        return (f"the model folder {name_or_path} cannot be read as the ranks will read it: {model.problem}. Point "
                "--model (or model_name_or_path) at a folder holding the model's config.json as saved by "
                "`save_pretrained` or downloaded from the hub.")
    if not synthetic and not _has_weights(path):
        return (f"the model folder {name_or_path} holds no weights (no model.safetensors, pytorch_model.bin or their "
                "sharded index): the ranks would fail loading it. Add the weights, or pass --synthetic to train "
                "the architecture from its config.json with random weights (throughput and memory runs).")
    return None
