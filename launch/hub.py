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

PROBE_TIMEOUT_S = 3.0


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
    # HF_ENDPOINT as huggingface_hub parsed it: the endpoint its downloads will use (launch.envvars says why here)
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
    """The model's text config, from a local folder, the hub cache, or (online, hub reachable) the hub."""
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
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
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
    if offline() and not _in_hub_cache(name, kind):
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


def _in_hub_cache(repo_id: str, repo_type: str) -> bool:
    from huggingface_hub.file_download import repo_folder_name

    return (Path(_cache_dir()) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)).is_dir()
