"""Bad input, table-driven: every case is refused before any process starts, with one clear paragraph, and leaves
the disk as it was; valid input that an earlier launcher refused or mangled is accepted and passed on unchanged.

The launcher runs in-process (`launch.__main__.main`), with `subprocess.Popen` replaced by a function that fails
the test: a row that got as far as starting `accelerate launch` cannot pass. Each row snapshots the files under the
test's folder and the repository (sizes and modification times) before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers.launcher import REPO, free_port, shows
from launch.checks import rules
from launch.results import outdir
from launch.config.adapter import quantization_on_cpu_supported
from launch.__main__ import main
from launch.recipe.discovery import RECIPES_DIR, find_recipe


# ---- fixtures: each takes the test's folder and returns {placeholder: value} for the row's argv -------------------
def copy_recipe(tmp: Path, base="zero3", config=None, accelerate=None) -> Path:
    folder = tmp / "my-recipe"
    shutil.copytree(RECIPES_DIR / base, folder)
    if config:
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        cfg.update(config)
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    if accelerate:
        acc = yaml.safe_load(find_recipe(base).accelerate_config_path.read_text())
        acc.update(accelerate)
        (folder / "accelerate.yaml").write_text(yaml.safe_dump(acc))
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        cfg["accelerate_config"] = "accelerate.yaml"
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    return folder


def earlier_run(tmp: Path, checkpoint_files=None, run: dict | None = None, name="out") -> Path:
    """An output folder as an earlier run of the launcher left it: checkpoint-8, final, logs, manifest (with the
    run's identity when given, as the launcher records it)."""
    out = tmp / name
    claim = outdir.claim(outdir.check(out, resume=False, overwrite=False), command="earlier run", run=run)
    (out / "checkpoint-8").mkdir(parents=True)
    (out / "checkpoint-8" / "trainer_state.json").write_text("{}")
    for name, data in (checkpoint_files or {}).items():
        (out / "checkpoint-8" / name).write_bytes(data)
    (out / "final").mkdir()
    (out / "launch.log").write_text("earlier run\n")
    outdir.release(claim)
    return out


def truncated_safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\0" * 100  # 4096 bytes of data promised, 100 written


FIXTURES = {
    "none": lambda tmp: {},
    "learning_rate_fast": lambda tmp: {"recipe": copy_recipe(tmp, config={"learning_rate": "fast"})},
    "ga_float_in_yaml": lambda tmp: {"recipe": copy_recipe(tmp, config={"gradient_accumulation_steps": 2.5})},
    "num_processes_eight": lambda tmp: {"recipe": copy_recipe(tmp, accelerate={"num_processes": "eight"})},
    "mixed_precison": lambda tmp: {"recipe": copy_recipe(tmp, accelerate={"mixed_precison": "bf16"})},
    "multi_gpuu": lambda tmp: {"recipe": copy_recipe(tmp, accelerate={"distributed_type": "MULTI_GPUU"})},
    "zero_stag": lambda tmp: {"recipe": copy_recipe(tmp, accelerate={"deepspeed_config": {"zero_stag": 3}})},
    "ddp_loaded_in_bf16": lambda tmp: {"recipe": copy_recipe(tmp, base="ddp", config={"dtype": "bfloat16"})},
    "fsdp_activation_checkpointing": lambda tmp: {"recipe": copy_recipe(tmp, base="ring-cp-2gpu", accelerate={
        "fsdp_config": {"fsdp_version": 2, "fsdp_activation_checkpointing": True}})},
    "earlier_run": lambda tmp: {"out": earlier_run(tmp)},
    "truncated_checkpoint": lambda tmp: {"out": earlier_run(tmp, {"model.safetensors": truncated_safetensors()})},
    "foreign_file": lambda tmp: {"out": _foreign(tmp)},
    "locked": lambda tmp: {"out": _locked(tmp)},
    "broken_expected": lambda tmp: {"recipe": _broken_expected(tmp)},
    "zero3_run": lambda tmp: {"out": earlier_run(tmp, run=_identity("zero3"))},
    "zero3_run_2_processes": lambda tmp: {"out": earlier_run(tmp, run=_identity("zero3"))},
    "deepspeed_checkpoint": lambda tmp: _deepspeed_checkpoint(tmp),
    "two_runs": lambda tmp: _two_runs(tmp),
    "lora_run": lambda tmp: {"out": earlier_run(tmp, run=_identity("lora"))},
    "ddp_run": lambda tmp: {"out": earlier_run(tmp, run=_identity("ddp"))},
    "adapter_checkpoint": lambda tmp: _adapter_checkpoint(tmp),
    "duplicate_key": lambda tmp: _with_text(tmp, "zero3", _duplicate_key),
    "duplicate_accelerate_key": lambda tmp: _with_text(tmp, "ddp", lambda t: t + b"num_processes: 3\n",
                                                       which="accelerate.yaml"),
    "latin1_config": lambda tmp: _with_text(tmp, "zero3", lambda t: b"# r\xe9glages\n" + t),
    "latin1_accelerate": lambda tmp: _with_text(tmp, "ddp", lambda t: t + b"# caf\xe9\n", which="accelerate.yaml"),
    "nan_reference": lambda tmp: _nan_reference(tmp),
    "inf_bound": lambda tmp: _nan_reference(tmp, key="bounds"),
    "dangling_output": lambda tmp: _dangling(tmp),
    "accelerate_config_dir": lambda tmp: {"recipe": copy_recipe(tmp,
                                                                config={"accelerate_config": "accelerate_configs"})},
    "tiled_mlp_in_a_zero3_copy": lambda tmp: {"recipe": copy_recipe(tmp, config={"tiled_mlp": True})},
    "fsdp2_hybrid_shard": lambda tmp: {"recipe": copy_recipe(tmp, base="fsdp2", accelerate={"fsdp_config": {
        **yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())["fsdp_config"],
        "fsdp_sharding_strategy": "HYBRID_SHARD"}})},
    "fsdp_checkpointing": lambda tmp: {"recipe": copy_recipe(tmp, base="fsdp2", accelerate={"fsdp_config": {
        **yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())["fsdp_config"],
        "fsdp_activation_checkpointing": True}})},
    "fsdp1_local_state_dict": lambda tmp: {"recipe": copy_recipe(tmp, base="fsdp2", accelerate={"fsdp_config": {
        **{k: v for k, v in yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())["fsdp_config"]
           .items() if k != "fsdp_reshard_after_forward"},
        "fsdp_version": 1, "fsdp_state_dict_type": "LOCAL_STATE_DICT"}})},
    # accepted before, and lost data or time
    "corrupted_manifest": lambda tmp: _corrupted_manifest(tmp),
    "model_no_config": lambda tmp: _model_dir(tmp, None),
    "model_invalid_json": lambda tmp: _model_dir(tmp, "{not json"),
    "model_json_list": lambda tmp: _model_dir(tmp, "[1, 2]"),
    "model_unknown_type": lambda tmp: _model_dir(tmp, {"model_type": "no-such-architecture"}),
    "model_hidden_zero": lambda tmp: _model_dir(tmp, {"hidden_size": 0}),
    "model_heads_not_multiple_of_kv": lambda tmp: _model_dir(tmp, {"num_key_value_heads": 3}),
    "model_heads_not_dividing_hidden": lambda tmp: _model_dir(tmp, {"model_type": "llama", "hidden_size": 66,
                                                                  "head_dim": None}),
    "model_too_large": lambda tmp: _model_dir(tmp, {"hidden_size": 1_048_576, "num_hidden_layers": 1000,
                                                   "layer_types": None}),
    "model_config_only": lambda tmp: _model_dir(tmp, {}),
    "train_py_syntax_error": lambda tmp: _broken_script(tmp, lambda t: t + "\ndef (\n"),
    "train_py_empty": lambda tmp: _broken_script(tmp, lambda t: ""),
    "train_py_missing_module": lambda tmp: _broken_script(
        tmp, lambda t: t.replace("\nimport ", "\nimport no_such_module_xyz\nimport ", 1)),
    "user_png": lambda tmp: _user_file(tmp, "mine.png"),
    # what the ranks refused after loading, or trained nothing and exited 0
    "gpt2_model": lambda tmp: _gpt2_model(tmp),
    "fsdp2_param_offload": lambda tmp: {"recipe": copy_recipe(tmp, base="fsdp2", accelerate={"fsdp_config": {
        **_accelerate("fsdp2")["fsdp_config"], "fsdp_offload_params": True}})},
    "fsdp2_state_dict_type_misspelt": lambda tmp: {"recipe": copy_recipe(tmp, base="fsdp2", accelerate={"fsdp_config": {
        **_accelerate("fsdp2")["fsdp_config"], "fsdp_state_dict_type": "FULL_STATE_DICTS"}})},
    "adapter_config_cut": lambda tmp: _lora_run(tmp, lambda final: _cut(final / "adapter_config.json")),
    "adapter_weights_missing": lambda tmp: _lora_run(tmp, lambda final: (final / "adapter_model.safetensors").unlink()),
    "adapter_weights_cut": lambda tmp: _lora_run(tmp, lambda final: _cut(final / "adapter_model.safetensors")),
    "adapter_tokenizer_missing": lambda tmp: _lora_run(tmp, lambda final: (final / "tokenizer_config.json").unlink()),
    "adapter_and_a_base_of_another_size": lambda tmp: {**_lora_run(tmp), "model": _model_of_another_size(tmp)},
}


# ---- fixtures of the rank-side refusals -----------------------------------------------------------------------------
def _accelerate(recipe: str) -> dict:
    return yaml.safe_load(find_recipe(recipe).accelerate_config_path.read_text())


def _gpt2_model(tmp):
    """A GPT-2 model folder holding only its config.json (a model type outside the Llama-style families: Conv1D
    layers named attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)."""
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=4).save_pretrained(tmp / "gpt2")
    return {"model": tmp / "gpt2"}


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


_ADAPTER: dict = {}


def _adapter_files() -> dict[str, bytes]:
    """PEFT's files of a LoRA adapter on the smoke model's architecture (random weights; made once per session)."""
    if not _ADAPTER:
        import tempfile

        from peft import LoraConfig, get_peft_model
        from transformers import AutoConfig, AutoModelForCausalLM

        from launch.config import smoke

        base = smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
        with tempfile.TemporaryDirectory() as folder:
            peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
            peft.peft_config["default"].base_model_name_or_path = str(base)
            peft.save_pretrained(folder)
            _ADAPTER.update({p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()})
    return _ADAPTER


def _lora_run(tmp, damage=lambda final: None) -> dict:
    """A finished lora run's folder as the launcher leaves it (its identity recorded), its adapter in final/, then
    `damage(final)`."""
    from launch.config import smoke

    out = earlier_run(tmp, run=_identity("lora"))
    final = outdir.RunFolder(out).final
    for name, data in _adapter_files().items():
        (final / name).write_bytes(data)
    for tokenizer_file in Path(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]).glob("tokenizer*"):
        shutil.copy(tokenizer_file, final / tokenizer_file.name)  # the run saves the tokenizer beside the adapter
    damage(final)
    return {"out": out}


def _model_of_another_size(tmp) -> Path:
    """The smoke model's architecture at half its hidden size, with (random) weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from launch.config import smoke

    config = AutoConfig.from_pretrained(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"])
    config.hidden_size, config.head_dim = config.hidden_size // 2, config.head_dim // 2
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp / "smaller")
    return tmp / "smaller"


def _corrupted_manifest(tmp):
    out = earlier_run(tmp)
    outdir.RunFolder(out).manifest.write_text('{"entries": ["checkpoint-8", ')  # cut short
    return {"out": out}


def _model_dir(tmp, config):
    """A model folder holding only a config.json: the smoke model's with `config` over it (None: no config.json; a
    string: the file's text as given)."""
    from launch.config import smoke

    folder = tmp / "model"
    folder.mkdir()
    if isinstance(config, dict):
        model = Path(smoke.ensure_smoke_assets(progress=lambda *_: None)["model"])
        data = json.loads((model / "config.json").read_text())
        data.update(config)
        (folder / "config.json").write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    elif config is not None:
        (folder / "config.json").write_text(config)
    return {"model": folder}


def _broken_script(tmp, edit):
    folder = copy_recipe(tmp, base="ddp")
    script = folder / "train.py"
    script.write_text(edit(script.read_text()))
    text = script.read_text()
    line = {"syntax": text.count("\n"), "import": text.splitlines().index("import no_such_module_xyz") + 1
            if "no_such_module_xyz" in text else 1}
    return {"recipe": folder, "syntax_line": line["syntax"], "import_line": line["import"]}


def _user_file(tmp, name):
    (tmp / name).write_bytes(b"\x89PNG\r\n\x1a\n my own picture")
    return {}


def _identity(recipe: str, num_processes: int | None = None) -> dict:
    """The identity a smoke CPU run of `recipe` records in its output folder (launch.run.checkpoints.identity)."""
    from launch.run.checkpoints import identity
    from launch.config.options import Options
    from launch.run.resolve import resolve

    return identity(resolve(Options(recipe=recipe, smoke=True, cpu=True, num_processes=num_processes),
                            progress=lambda *_: None))


def _deepspeed_checkpoint(tmp):
    """A checkpoint saved by plain `accelerate launch` with DeepSpeed on 2 processes (no launcher manifest)."""
    folder = tmp / "elsewhere" / "checkpoint-8"
    (folder / "global_step8").mkdir(parents=True)
    for name in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"):
        (folder / name).write_text("{}")
    return {"ckpt": folder}


def _adapter_checkpoint(tmp):
    """A LoRA checkpoint saved by plain `accelerate launch` with DDP (no launcher manifest): PEFT's adapter files."""
    folder = tmp / "elsewhere" / "checkpoint-8"
    folder.mkdir(parents=True)
    for name in ("trainer_state.json", "adapter_config.json", "optimizer.pt", "rng_state.pth"):
        (folder / name).write_text("{}")
    return {"ckpt": folder}


def _two_runs(tmp):
    """A ddp run's folder to resume from, and a zero3 run's folder as the output folder."""
    ddp = earlier_run(tmp, run=_identity("ddp"), name="ddp-run")
    zero3 = tmp / "zero3-run"
    outdir.release(outdir.claim(outdir.check(zero3, resume=False, overwrite=False), "zero3", run=_identity("zero3")))
    (zero3 / "run_summary.json").write_text("{}")
    return {"ckpt": ddp / "checkpoint-8", "out": zero3}


def _with_text(tmp, base: str, edit, which="config.yaml"):
    folder = copy_recipe(tmp, base=base, accelerate={"num_machines": 1} if which == "accelerate.yaml" else None)
    path = folder / which
    path.write_bytes(edit(path.read_bytes()))
    return {"recipe": folder}


def _duplicate_key(text: bytes) -> bytes:
    return text.replace(b"accelerate_config:", b"accelerate_config: accelerate_configs/zero3.yaml\naccelerate_config:",
                        1)


def _nan_reference(tmp, key="loss"):
    folder = copy_recipe(tmp)
    data = json.loads((folder / "expected_metrics.json").read_text())
    entry = data["profiles"]["smoke-cpu"]
    if key == "loss":
        entry["steps"]["loss"][3] = float("nan")
    else:
        entry["bounds"]["first_loss"][0] = float("inf")
    (folder / "expected_metrics.json").write_text(json.dumps(data))  # json writes NaN / Infinity
    return {"recipe": folder}


def _dangling(tmp):
    (tmp / "out").symlink_to(tmp / "missing")
    return {}


def _foreign(tmp):
    (tmp / "notes").mkdir()
    (tmp / "notes" / "README.md").write_text("my notes\n")
    return tmp / "notes"


def _locked(tmp):
    out = earlier_run(tmp)
    lock = out / ".launch" / "lock-machine0"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time() - 5,
                                "command": "python -m launch zero3 (the first launcher)"}))
    return out


def _broken_expected(tmp):
    folder = copy_recipe(tmp)
    text = (folder / "expected_metrics.json").read_text()
    (folder / "expected_metrics.json").write_text(text[: len(text) // 2])
    return folder


# ---- the table: (id, argv, fixture, exit status, message fragment) ----------------------------------------------
REFUSED = [
    # output folder (README.md replaced by a model card, checkpoints rotated away, two launchers in one folder)
    ("output-dir-is-the-repo", "ddp --smoke --cpu --save-steps 6 --output-dir {repo}", "none", 2,
     "already holds files this launcher did not write there"),
    ("output-dir-with-foreign-files", "ddp --smoke --cpu --output-dir {out}", "foreign_file", 2,
     "already holds files this launcher did not write there (README.md)"),
    ("earlier-checkpoints-without-resume", "ddp --smoke --cpu --output-dir {out}", "earlier_run", 2,
     "holds an earlier run's checkpoints or final weights (checkpoint-8, final). Pass --resume"),
    ("second-launcher-same-folder", "ddp --smoke --cpu --resume --output-dir {out}", "locked", 2,
     f"Another launcher is using {{out}}: process {os.getpid()}"),
    ("two-output-folders", "ddp --smoke --cpu --output-dir {tmp}/a -- --output_dir {tmp}/b", "none", 2,
     "Two output folders were given"),
    # training arguments, typed by the recipe's own TrlParser
    ("ga-not-an-integer", "ddp --smoke --cpu --dry-run -- --gradient_accumulation_steps 2.5", "none", 2,
     "the training arguments after `--`: `gradient_accumulation_steps` is '2.5'; expected an integer"),
    ("ga-float-in-config-yaml", "{recipe} --smoke --cpu --dry-run", "ga_float_in_yaml", 2,
     "`gradient_accumulation_steps: 2.5`: expected an integer"),
    ("learning-rate-fast-under-smoke", "{recipe} --smoke --cpu --dry-run", "learning_rate_fast", 2,
     "config.yaml: `learning_rate` is 'fast'; expected a number"),
    ("unknown-key-abbreviation", "ddp --smoke --cpu --dry-run -- --learning_rat 1", "none", 2,
     "`learning_rat` in the training arguments after `--` (did you mean learning_rate?)"),
    ("bad-choice", "ddp --smoke --cpu --dry-run -- --lr_scheduler_type fastest", "none", 2,
     "`lr_scheduler_type` is 'fastest'; expected one of 'linear'"),
    ("bad-json-dict", "ddp --smoke --cpu --dry-run -- --model_init_kwargs {{oops", "none", 2,
     "`model_init_kwargs` is not valid JSON"),
    # Accelerate config, checked with Accelerate's own classes
    ("num-processes-eight-under-smoke", "{recipe} --smoke --cpu --dry-run", "num_processes_eight", 2,
     "`num_processes: 'eight'`: expected an integer"),
    ("accelerate-key-typo", "{recipe} --smoke --cpu --dry-run", "mixed_precison", 2,
     "unknown key `mixed_precison` (did you mean mixed_precision?)"),
    ("accelerate-enum-typo", "{recipe} --smoke --cpu --dry-run", "multi_gpuu", 2,
     "'MULTI_GPUU' is not a valid DistributedType"),
    ("accelerate-nested-key-typo", "{recipe} --smoke --cpu --dry-run", "zero_stag", 2,
     "`deepspeed_config.zero_stag` is not an `accelerate launch` setting"),
    # numbers and layout
    ("zero-processes", "ddp --smoke --cpu --num-processes 0", "none", 2, "--num-processes 0: process counts"),
    ("negative-sp", "alst-ulysses-4gpu --smoke --cpu --sp-size -2 --dry-run", "none", 2, "--sp-size -2"),
    ("negative-dp-shard", "alst-ulysses-4gpu --smoke --cpu --dp-shard-size -1 --dry-run", "none", 2,
     "--dp-shard-size -1"),
    ("zero-max-steps", "ddp --smoke --cpu --max-steps 0", "none", 2, "max_steps 0 (a positive number of steps"),
    ("negative-save-steps", "ddp --smoke --cpu --save-steps -4", "none", 2, "save_steps -4 with save_strategy steps"),
    ("zero-save-steps", "ddp --smoke --cpu --save-steps 0", "none", 2, "save_steps 0 with save_strategy steps"),
    ("layout-does-not-use-the-processes", "alst-ulysses-4gpu --smoke --cpu --num-processes 3", "none", 2,
     "does not use 3 processes"),
    ("cp-and-sp-together", "ring-cp-2gpu --smoke --cpu --num-processes 4 --sp-size 2", "none", 2,
     "mutually exclusive"),
    # precision: pure bf16 where Adam's updates round away, on the GPU profile and in a CPU bf16 run
    ("pure-bf16-ddp", "{recipe} --dry-run", "ddp_loaded_in_bf16", 2,
     "This run trains pure bfloat16: `dtype: bfloat16` ("),
    ("pure-bf16-on-cpu", "ddp --smoke --cpu --dry-run -- --bf16 true --dtype bfloat16", "none", 2,
     "at learning_rate 0.003 every update of the weights near 1.0 (the RMSNorm scales) is lost"),
    ("fp16-on-cpu", "ddp --smoke --cpu --dry-run -- --fp16 true --bf16 false", "none", 2,
     "fp16 mixed precision was asked for a CPU run"),
    ("fsdp-with-activation-checkpointing", "{recipe} --smoke --cpu -- --activation_checkpointing true",
     "fsdp_activation_checkpointing", 2, "cannot both be on"),
    # multi-node
    ("two-machines-no-address", "ddp --smoke --cpu --num-machines 2", "none", 2,
     "--main-process-ip (the address of machine rank 0) is not set"),
    ("machine-rank-outside", "ddp --smoke --cpu --num-machines 2 --machine-rank 3 --main-process-ip 127.0.0.1",
     "none", 2, "--machine-rank 3 makes this machine rank 3, but the job has machine ranks 0..1 only"),
    ("rendezvous-unreachable", "ddp --smoke --cpu --num-machines 2 --machine-rank 1 --main-process-ip 127.0.0.1 "
     "--main-process-port {port} --rendezvous-timeout 2 --output-dir {out}", "none", 2,
     "Machine rank 0 at 127.0.0.1:{port} did not answer within 2 s"),
    ("port-out-of-range", "ddp --smoke --cpu --num-machines 2 --main-process-ip 127.0.0.1 --main-process-port 70000",
     "none", 2, "--main-process-port 70000 is not a TCP port"),
    # inputs that do not exist, found before the ranks start
    ("model-path-missing", "ddp --smoke --cpu -- --model_name_or_path ./no-such-model", "none", 2,
     "the model folder ./no-such-model does not exist"),
    ("dataset-path-missing", "ddp --smoke --cpu -- --dataset_name /no/such/data", "none", 2,
     "the dataset /no/such/data does not exist"),
    ("hub-id-malformed", "ddp --smoke --cpu -- --model_name_or_path not//valid", "none", 2,
     "the model folder not//valid does not exist"),
    ("hub-id-invalid-characters", "ddp --smoke --cpu -- --model_name_or_path some-org/name!", "none", 2,
     "model_name_or_path `some-org/name!`: not a valid hub id"),
    ("hub-id-not-cached-offline", "ddp --smoke --cpu -- --model_name_or_path some-org/not-cached", "none", 2,
     "offline (HF_HUB_OFFLINE) and the model some-org/not-cached is not in the Hugging Face cache"),
    ("expected-metrics-truncated", "{recipe} --smoke --cpu", "broken_expected", 2,
     "expected_metrics.json is not valid JSON"),
    ("resume-from-truncated-weights", "ddp --smoke --cpu --output-dir {out} --resume {out}/checkpoint-8",
     "truncated_checkpoint", 2, "model.safetensors: truncated"),
    ("resume-latest-truncated-weights", "ddp --smoke --cpu --output-dir {out} --resume", "truncated_checkpoint", 2,
     "no complete checkpoint"),
    ("unknown-recipe", "zero4 --smoke --cpu", "none", 2, "Unknown recipe `zero4`. Did you mean"),
    # a checkpoint resumed only by a run like the one that saved it; never over another run's results
    ("resume-a-zero3-checkpoint-with-ddp", "ddp --smoke --cpu --output-dir {out} --resume {out}/checkpoint-8",
     "zero3_run", 2, "was saved by another kind of run (recorded in {out}/.launch/manifest.json): recipe 'zero3'"),
    ("resume-on-another-world-size", "zero3 --smoke --cpu --num-processes 4 --output-dir {out} --resume",
     "zero3_run_2_processes", 2, "world_size 2 (this run: 4)"),
    ("resume-a-deepspeed-checkpoint-under-fsdp2", "ring-cp-2gpu --smoke --cpu --resume {ckpt} --output-dir {out}",
     "deepspeed_checkpoint", 2, "(read from its files): strategy 'deepspeed' (this run: 'fsdp2')"),
    ("resume-into-another-runs-folder", "ddp --smoke --cpu --resume {ckpt} --output-dir {out}", "two_runs", 2,
     "holds the results of another run (zero3, deepspeed), which this run would write over"),
    # an adapter checkpoint holds only the adapter's weights and optimizer state, a full fine-tune's all
    ("resume-an-adapter-checkpoint-in-a-full-fine-tune", "lora --smoke --cpu --output-dir {out} --resume -- --use_peft "
     "false", "lora_run", 2, "it is an adapter (lora) run's checkpoint and this run is a full fine-tune"),
    ("resume-a-full-checkpoint-in-an-adapter-run", "ddp --smoke --cpu --output-dir {out} --resume -- --use_peft true",
     "ddp_run", 2, "it is a full fine-tune's checkpoint and this run is an adapter (lora) run"),
    ("resume-adapter-files-in-a-full-fine-tune", "ddp --smoke --cpu --resume {ckpt} --output-dir {out}",
     "adapter_checkpoint", 2, "(read from its files): it is an adapter run's checkpoint and this run is a full "
     "fine-tune"),
    # the hang watchdog takes positive seconds or `off`
    ("hang-timeout-negative", "ddp --smoke --cpu --hang-timeout -1", "none", 2,
     "-1 seconds: give a positive number of seconds, or `off`"),
    ("hang-timeout-zero", "zero3 --smoke --cpu --hang-timeout 0", "none", 2,
     "0 seconds: give a positive number of seconds, or `off`"),
    # the deprecated checkpointing name where transformers would ignore it
    ("gradient-checkpointing-ignored", "ring-cp-2gpu --smoke --cpu -- --gradient_checkpointing false", "none", 2,
     "transformers ignores the deprecated `gradient_checkpointing` whenever `activation_checkpointing` is set"),
    ("no-gradient-checkpointing-ignored", "alst-ulysses-8gpu --smoke --cpu -- --no_gradient_checkpointing", "none", 2,
     "`-- --activation_checkpointing false`"),
    # partial checkpointing: 1 to L layers, and only where something checkpoints
    ("checkpointing-layers-without-checkpointing", "ddp --smoke --cpu -- --activation_checkpointing false "
     "--checkpointing_layers 1", "none", 2, "but this run checkpoints none"),
    ("checkpointing-layers-zero", "ddp --smoke --cpu -- --checkpointing_layers 0", "none", 2,
     "the number of decoder layers to checkpoint is 1 or more"),
    ("checkpointing-layers-past-the-model", "ddp --smoke --cpu -- --checkpointing_layers 3", "none", 2,
     "is more than the model's 2 decoder layers"),
    # a key written twice in a YAML file the launcher reads
    ("duplicated-key-in-config-yaml", "{recipe} --smoke --cpu --dry-run", "duplicate_key", 2,
     "the key `accelerate_config` is given twice, on lines"),
    ("duplicated-key-in-accelerate-config", "{recipe} --smoke --cpu --dry-run", "duplicate_accelerate_key", 2,
     "the key `num_processes` is given twice, on lines"),
    # expected metrics holding NaN or infinity are refused at the start
    ("nan-in-expected-metrics", "{recipe} --smoke --cpu", "nan_reference", 2,
     "`profiles.smoke-cpu.steps.loss` holds NaN or infinity"),
    ("infinity-in-expected-bounds", "{recipe} --smoke --cpu", "inf_bound", 2,
     "`profiles.smoke-cpu.bounds` holds a value that is not a finite number"),
    # one paragraph instead of a traceback
    ("non-utf8-config-yaml", "{recipe} --smoke --cpu --dry-run", "latin1_config", 2,
     "config.yaml:1: byte 0xe9 is not UTF-8"),
    ("non-utf8-accelerate-config", "{recipe} --smoke --cpu --dry-run", "latin1_accelerate", 2, "is not UTF-8"),
    ("output-dir-dangling-symlink", "ddp --smoke --cpu --output-dir {out}", "dangling_output", 2,
     "is a symbolic link to {tmp}/missing, which does not exist"),
    ("main-process-port-zero-one-machine", "ddp --smoke --cpu --main-process-port 0", "none", 2,
     "--main-process-port 0 is not a TCP port (1-65535): it is the ranks' rendezvous port, also on one machine"),
    ("accelerate-config-is-a-directory", "{recipe} --smoke --cpu --dry-run", "accelerate_config_dir", 2,
     "accelerate_config `accelerate_configs` is a directory"),
    # a copy holds only the template's sections its configs turned on when it was synced
    ("section-its-copy-lacks", "{recipe} --smoke --cpu --dry-run", "tiled_mlp_in_a_zero3_copy", 2,
     "needs: tiled-mlp (needed for `tiled_mlp: true` in config.yaml). It is a copy, which holds the sections its "
     "configs turned on when it was last synced (none): `python -m launch sync-scripts {recipe}` rewrites it"),
]
REFUSED += [
    # data lost or replaced
    ("resume-with-overwrite", "ddp --smoke --cpu --save-steps 4 --output-dir {out} --resume --overwrite", "earlier_run",
     2, "--resume and --overwrite contradict each other"),
    ("record-a-synthetic-run", "record ddp --smoke --cpu --synthetic --max-steps 2", "none", 2,
     "a synthetic run (random weights and tokens) has none: drop --synthetic"),
    # processes started that should have been refused (a model folder read as the ranks will read it)
    ("synthetic-model-without-config", "ddp --smoke --cpu --synthetic --model {model}", "model_no_config", 2,
     "The model folder {model} cannot be read as the ranks will read it: {model} has no config.json"),
    ("synthetic-model-invalid-json", "ddp --smoke --cpu --synthetic --model {model}", "model_invalid_json", 2,
     "The model folder {model} cannot be read as the ranks will read it: AutoConfig could not read"),
    ("synthetic-model-json-list", "ddp --smoke --cpu --synthetic --model {model}", "model_json_list", 2,
     "The model folder {model} cannot be read as the ranks will read it: AutoConfig could not read"),
    ("synthetic-model-unknown-type", "ddp --smoke --cpu --synthetic --model {model}", "model_unknown_type", 2,
     "no-such-architecture"),
    ("synthetic-model-hidden-size-zero", "ddp --smoke --cpu --synthetic --model {model}", "model_hidden_zero", 2,
     "describes a model that cannot be built or trained: hidden_size is 0 (a positive integer)"),
    ("synthetic-model-heads-not-multiple-of-kv", "ddp --smoke --cpu --synthetic --model {model}",
     "model_heads_not_multiple_of_kv", 2, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("synthetic-model-heads-not-dividing-hidden", "ddp --smoke --cpu --synthetic --model {model}",
     "model_heads_not_dividing_hidden", 2,
     "The hidden size (66) is not a multiple of the number of attention heads (4)"),
    ("synthetic-model-no-machine-holds", "ddp --smoke --cpu --synthetic --model {model}", "model_too_large", 2,
     "parameters, more than any machine holds"),
    ("model-folder-without-weights", "ddp --smoke --cpu --model {model}", "model_config_only", 2,
     "The model folder {model} holds no weights"),
    # answers that look valid but are not
    ("output-dir-inside-recipes", "ddp --smoke --cpu --output-dir {repo}/recipes/ddp/run1", "none", 2,
     "is inside {repo}/recipes, which holds the recipes"),
    ("output-dir-empty", "ddp --smoke --cpu --output-dir=", "none", 2, "--output-dir is empty"),
    ("rendezvous-timeout-negative", "ddp --smoke --cpu --num-machines 2 --machine-rank 1 --main-process-ip 127.0.0.1 "
     "--rendezvous-timeout -5", "none", 2, "--rendezvous-timeout -5: give a positive number of seconds"),
    ("corrupted-manifest", "ddp --smoke --cpu --output-dir {out}", "corrupted_manifest", 2,
     "{out}/.launch/manifest.json is corrupted"),
    ("train-py-syntax-error", "{recipe} --smoke --cpu --dry-run", "train_py_syntax_error", 2,
     "{recipe}/train.py:{syntax_line}: SyntaxError: invalid syntax"),
    ("train-py-empty", "{recipe} --smoke --cpu --dry-run", "train_py_empty", 2,
     "{recipe}/train.py:1: defines no make_parser()"),
    ("train-py-imports-a-missing-module", "{recipe} --smoke --cpu --dry-run", "train_py_missing_module", 2,
     "{recipe}/train.py:{import_line}: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("plan-gpu-memory-nan", "plan ddp --gpu-memory nan", "none", 2, "must be positive finite numbers"),
    ("plan-gpu-memory-inf", "plan ddp --gpu-memory inf", "none", 2, "must be positive finite numbers"),
    ("plan-host-memory-nan", "plan ddp --host-memory nan", "none", 2, "must be positive finite numbers"),
    ("plan-max-length-zero", "plan ddp --max-length 0", "none", 2, "--max-length 0: give a positive number"),
    ("plan-max-length-negative", "plan ddp --max-length -4096", "none", 2, "--max-length -4096: give a positive"),
    ("plan-hidden-size-zero", "plan ddp --model {model}", "model_hidden_zero", 2, "hidden_size is 0"),
    ("compare-out-replaces-a-users-file", "compare {tmp}/a {tmp}/b --out {tmp}/mine.png", "user_png", 2,
     "--out {tmp}/mine.png already exists and is not a plot `compare` wrote"),
]
# FSDP2 settings and adapters
REFUSED += [
    ("fsdp2-with-an-fsdp1-strategy", "{recipe} --smoke --cpu --dry-run", "fsdp2_hybrid_shard", 2,
     "fsdp_sharding_strategy: HYBRID_SHARD (HSDP in FSDP2 is parallelism_config"),
    # a copy of fsdp2 whose Accelerate config checkpoints with FSDP (the smoke profile itself checkpoints an adapter
    # run with transformers')
    ("adapter-under-fsdp-activation-checkpointing", "{recipe} --smoke --cpu --dry-run -- --use_peft true",
     "fsdp_checkpointing", 2,
     "A LoRA / QLoRA run under FSDP cannot use fsdp_activation_checkpointing: true"),
    ("fsdp1-local-state-dict", "{recipe} --smoke --cpu --dry-run", "fsdp1_local_state_dict", 2,
     "fsdp_state_dict_type LOCAL_STATE_DICT in"),
    ("lora-rank-zero", "ddp --smoke --cpu --dry-run -- --use_peft true --lora_r 0", "none", 2, "lora_r is 0"),
    ("lora-targets-match-nothing",
     "ddp --smoke --cpu --dry-run -- --use_peft true --lora_target_modules query_key_value dense", "none", 2,
     "lora_target_modules ['query_key_value', 'dense'] match none of the linear layers"),
    ("four-bit-base-fsdp-uint8-storage", "fsdp2 --smoke --cpu --dry-run -- --use_peft true --load_in_4bit true",
     "none", 2, "load_in_4bit under FSDP2 needs bnb_4bit_quant_storage equal to the model's dtype"),
    # only while bitsandbytes' 4-bit path cannot train on CPU (launch.config.adapter.quantization_on_cpu_supported)
    *([("qlora-on-cpu", "ddp --smoke --cpu --dry-run -- --use_peft true --load_in_4bit true", "none", 2,
        "bitsandbytes' quantized training does not run")] if not quantization_on_cpu_supported() else []),
]
# what the ranks refused after loading, what trained nothing and exited 0, and tracebacks
REFUSED += [
    ("lora-dropout-above-one", "lora --smoke --cpu -- --lora_dropout 1.5", "none", 2,
     "lora_dropout is 1.5: it is the probability that LoRA drops each input element"),
    ("lora-alpha-zero", "lora --smoke --cpu -- --lora_alpha 0", "none", 2,
     "lora_alpha is 0: LoRA scales its update B A x by lora_alpha / lora_r"),
    ("quantized-base-without-an-adapter", "ddp --smoke --cpu -- --load_in_4bit true", "none", 2,
     "load_in_4bit is on but use_peft is off"),
    ("four-and-eight-bit-together", "lora --smoke --cpu -- --load_in_4bit true --load_in_8bit true", "none", 2,
     "load_in_4bit and load_in_8bit are both on"),
    ("lora-targets-not-in-a-gpt2", "lora --smoke --cpu --synthetic --model {model} -- --lora_target_modules q_proj "
     "v_proj", "gpt2_model", 2, "lora_target_modules ['q_proj', 'v_proj'] match none of the linear layers of {model} "
     "(PEFT would stop every rank after loading with \"Target modules ... not found in the base model\"). Its linear "
     "layers are attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, lm_head"),
    ("fsdp2-param-offload-on-cpu-without-cp", "{recipe} --smoke --cpu", "fsdp2_param_offload", 2,
     "fsdp_offload_params: true moves FSDP2's parameters from the accelerator to host memory"),
    ("fsdp2-mesh-with-nothing-to-shard", "fsdp2-70b --smoke --cpu --num-processes 4 --dp-replicate-size 4 "
     "--dp-shard-size 1", "none", 2, "no dimension for FSDP to shard across"),
    ("accelerate-state-dict-type-misspelt", "{recipe} --smoke --cpu", "fsdp2_state_dict_type_misspelt", 2,
     "`fsdp_config.fsdp_state_dict_type`: 'FULL_STATE_DICTS' is not a valid FSDP_STATE_DICT_TYPE; expected one of "
     "FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT (did you mean FULL_STATE_DICT"),
    ("rendezvous-address-does-not-resolve", "ddp --smoke --cpu --num-machines 2 --machine-rank 1 --main-process-ip "
     "no-such-host.invalid --output-dir {out}", "none", 2, "The address of machine rank 0, 'no-such-host.invalid', "
     "does not resolve"),
    ("merge-adapter-config-cut", "merge {out}", "adapter_config_cut", 2,
     "{out}/final cannot be merged: adapter_config.json is not valid JSON"),
    ("merge-adapter-weights-missing", "merge {out}", "adapter_weights_missing", 2,
     "its weights (adapter_model.safetensors) are missing"),
    ("merge-adapter-weights-cut", "merge {out}", "adapter_weights_cut", 2, "adapter_model.safetensors: truncated"),
    ("merge-adapter-without-its-tokenizer", "merge {out}", "adapter_tokenizer_missing", 2,
     "its tokenizer (tokenizer_config.json) is missing"),
    ("merge-onto-a-base-of-another-size", "merge {out} --base {model}", "adapter_and_a_base_of_another_size", 2,
     "{out}/final does not fit the base {model}: its weights have another model's shapes (size mismatch"),
    ("plan-a-gpt2", "plan ddp --model {model}", "gpt2_model", 2,
     "and a gpt2 model is not one: its linear layers are attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, lm_head"),
    ("learning-rate-with-its-quotes", "ddp --smoke --cpu -- --learning_rate '1e-5'", "none", 2,
     "`learning_rate` is \"'1e-5'\" (its quotes are part of the value"),
    ("resume-from-final", "ddp --smoke --cpu --output-dir {out} --resume {out}/final", "earlier_run", 2,
     "{out}/final is the run's final model (or adapter), not a checkpoint: it holds the weights only"),
]
ENV_REFUSED = [
    ("min-free-not-a-number", "ddp --smoke --cpu --dry-run", {"LAUNCH_MIN_FREE_MB": "abc"}, 2,
     "LAUNCH_MIN_FREE_MB='abc' is not an integer"),
    ("slurm-nnodes-not-a-number", "ddp --smoke --cpu --dry-run", {"SLURM_NNODES": "two"}, 2,
     "SLURM_NNODES='two' is not an integer"),
    ("master-port-out-of-range", "ddp --smoke --cpu", {"MASTER_PORT": "99999"}, 2,
     "MASTER_PORT=99999 (from the environment) is not a TCP port"),
    ("master-port-out-of-range-zero3", "zero3 --smoke --cpu --dry-run", {"MASTER_PORT": "70000"}, 2,
     "Unset MASTER_PORT or set it to a free port"),
    ("recipes-cache-not-writable", "ddp --smoke --cpu", {"RECIPES_CACHE": "/dev/null/llm-recipes"}, 2,
     "Set RECIPES_CACHE to a folder you can write to"),
    ("recipes-cache-not-writable-zero3", "zero3 --smoke --cpu --dry-run", {"RECIPES_CACHE": "/dev/null/x"}, 2,
     "cannot be built in /dev/null/x/smoke/"),
    # the port's real source is named, not always MASTER_PORT
    ("trainjob-port-out-of-range", "ddp --smoke --cpu --dry-run", {"PET_MASTER_PORT": "99999"}, 2,
     "PET_MASTER_PORT=99999 (from the environment) is not a TCP port"),
    # a machine rank not below the machine count, from any scheduler; SkyPilot's address list with commas
    ("stray-trainjob-node-rank", "ddp --smoke --cpu --output-dir {out}", {"PET_NODE_RANK": "1"}, 2,
     "PET_NODE_RANK=1 (from the environment) makes this machine rank 1, but the job has machine ranks 0..0 only"),
    ("slurm-node-id-beyond-the-allocation", "ddp --smoke --cpu --output-dir {out}",
     {"SLURM_NNODES": "2", "SLURM_NODEID": "2", "MASTER_ADDR": "127.0.0.1"}, 2,
     "SLURM_NODEID=2 (from the environment) makes this machine rank 2, but the job has machine ranks 0..1 only "
     "(machine count SLURM_NNODES=2 (from the environment))"),
    ("skypilot-node-rank-beyond-the-nodes", "ddp --smoke --cpu --output-dir {out}",
     {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "5", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.2"}, 2,
     "SKYPILOT_NODE_RANK=5 (from the environment) makes this machine rank 5"),
    ("skypilot-node-ips-comma-separated", "ddp --smoke --cpu --main-process-port {port} --rendezvous-timeout 2 "
     "--output-dir {out}", {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1",
                            "SKYPILOT_NODE_IPS": "127.0.0.1,127.0.0.2"}, 2,
     "Machine rank 0 at 127.0.0.1:{port} did not answer within 2 s"),
]


def _snapshot(*roots: Path) -> dict:
    files = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", "__pycache__", ".pytest_cache")]
            for name in filenames + dirnames:
                p = Path(dirpath) / name
                st = p.lstat()
                files[str(p)] = (st.st_size if p.is_file() else -1, st.st_mtime_ns)
    return files


# packed conversations that would attend to each other (launch.checks.rules.packing)
REFUSED += [
    ("packing-with-an-attention-blind-to-boundaries", "ddp --smoke --cpu --dry-run -- --packing true "
     "--attn_implementation paged|eager", "none", 2, "attn_implementation paged|eager does not read their boundaries "
     "from the position_ids"),
    ("padding-free-with-an-attention-blind-to-boundaries", "zero3 --smoke --cpu --dry-run -- --padding_free true "
     "--model_init_kwargs {{\"attn_implementation\":\"paged|eager\"}}", "none", 2,
     "Set attn_implementation to one of those (sdpa runs everywhere)"),
    ("eval-packing-without-packing", "ddp --smoke --cpu --dry-run -- --eval_packing true --eval_strategy steps "
     "--eval_steps 4", "none", 2, "eval_packing: true packs the eval set (bfd) while packing: false leaves TRL's "
     "collator padded"),
]


@pytest.fixture
def no_spawn(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError(f"the launcher started a process: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)


def _run(argv: str, values: dict, capsys) -> tuple[int, str, str]:
    tokens = [t.format(**values) for t in argv.split()]
    rc = main(tokens)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _values(tmp_path, fixture) -> dict:
    values = {"repo": str(REPO), "tmp": str(tmp_path), "out": str(tmp_path / "out"), "recipe": "zero3",
              "port": str(free_port())}  # nothing listens there
    values.update({k: str(v) for k, v in FIXTURES[fixture](tmp_path).items()})
    return values


@shows(rules.numbers_positive)
@shows(rules.rendezvous_port)
@shows(rules.multinode_rendezvous)
@shows(rules.model_and_data_found)
@shows(rules.script_holds_its_sections)
@shows(rules.model_folder_loads)
@shows(rules.output_dir_outside_recipes)
@shows(rules.model_architecture_valid)
@shows(rules.lora_alpha_positive)
@shows(rules.lora_dropout_in_range)
@shows(rules.quantized_base_needs_adapter)
@shows(rules.quantization_one_kind)
@shows(rules.fsdp2_has_a_shard_dimension)
@shows(rules.rendezvous_address_resolves)
@shows(rules.packed_attention_keeps_conversations_apart)
@shows(rules.eval_packing_keeps_conversations_apart)
@shows(rules.checkpointing_layers_within_the_model)
@shows(rules.checkpointing_layers_with_checkpointing)
@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_bad_input_is_refused_before_anything_starts(case, tmp_path, capsys, no_spawn):
    _id, argv, fixture, status, fragment = case
    values = _values(tmp_path, fixture)
    roots = (tmp_path, REPO / "recipes", REPO / "accelerate_configs", REPO / "outputs", REPO / "templates")
    before = _snapshot(*roots) | {str(p): None for p in REPO.iterdir()}
    rc, out, err = _run(argv, values, capsys)
    assert rc == status, f"exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
    assert fragment.format(**values) in err, err[-3000:]
    assert "Traceback" not in err + out
    assert _snapshot(*roots) | {str(p): None for p in REPO.iterdir()} == before, "files were created or changed"


@pytest.mark.parametrize("case", ENV_REFUSED, ids=[c[0] for c in ENV_REFUSED])
def test_bad_environment_variable_is_named(case, tmp_path, capsys, no_spawn, monkeypatch):
    _id, argv, env, status, fragment = case
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    values = _values(tmp_path, "none")
    roots = (tmp_path, REPO / "recipes", REPO / "accelerate_configs", REPO / "outputs", REPO / "templates")
    before = _snapshot(*roots) | {str(p): None for p in REPO.iterdir()}
    rc, out, err = _run(argv, values, capsys)
    assert rc == status and fragment.format(**values) in err and "Traceback" not in err, err
    assert _snapshot(*roots) | {str(p): None for p in REPO.iterdir()} == before, "files were created or changed"


# ---- a setting whose package this machine lacks (launch.checks.rules' optional-package rules) -------------------
# (id, argv, what this machine is made to lack, message fragment). A package of launch.facts.machine.REPORTED is faked
# not installed through the launcher's version lookup (launch.run.runner's installed_versions); a build tool of
# DeepSpeed's JIT ops (launch.facts.machine.jit_build_tools) faked not found, with no op prebuilt. The kernels hub
# route, FlashAttention's fallback, is faked unusable (the CPU lock has no `kernels` either). GPU rows run on this
# GPU-less machine too: their message comes with enough_gpus'.
MISSING_PACKAGE = [
    ("liger-without-liger-kernel", "ddp --smoke --cpu -- --use_liger_kernel true", ("liger-kernel",),
     "`use_liger_kernel: true` (the training arguments after `--`) needs liger-kernel, which is not installed here"),
    ("report-to-trackio-without-trackio", "ddp --smoke --cpu", ("trackio",),
     "`report_to: trackio` (the smoke/CPU profile) needs trackio, which is not installed here"),
    ("qlora-without-bitsandbytes", "qlora-fsdp --output-dir {out}", ("bitsandbytes",),
     "quantizes the base model with bitsandbytes, which is not installed here"),
    ("flash-attention-2-without-flash-attn", "ddp --output-dir {out} -- --attn_implementation flash_attention_2",
     ("flash-attn",), "`attn_implementation: flash_attention_2` (the training arguments after `--`) needs the "
     "flash-attn package or, when it is missing, a build of the Hugging Face kernels hub"),
    ("flash-attention-4-without-flash-attn-4", "ddp --output-dir {out} -- --attn_implementation flash_attention_4",
     ("flash-attn-4",), "Install it (`pip install flash-attn-4[cu13]=="),
    ("offloaded-optimizer-without-ninja", "zero3-offload --smoke --cpu", ("ninja",),
     "so DeepSpeed runs Adam with its cpu_adam op, which this DeepSpeed did not build when installed and compiles at "
     "the first step; the compile needs ninja, which this machine lacks"),
]


@shows(rules.liger_kernel_installed)
@shows(rules.trackio_installed)
@shows(rules.bitsandbytes_usable)
@shows(rules.flash_attention_installed)
@shows(rules.deepspeed_cpu_adam_buildable)
@pytest.mark.parametrize("case", MISSING_PACKAGE, ids=[c[0] for c in MISSING_PACKAGE])
def test_a_setting_whose_package_is_missing_is_refused_before_start(case, tmp_path, capsys, no_spawn, monkeypatch):
    from launch.facts import machine
    from launch.run import runner

    _id, argv, lacking, fragment = case
    versions = machine.installed_versions()
    monkeypatch.setattr(runner, "installed_versions", lambda *a, **k: {**versions, **{p: None for p in lacking
                                                                                       if p in versions}})
    tools = machine.jit_build_tools()
    monkeypatch.setattr(rules, "jit_build_tools", lambda: {k: None if k in lacking else v for k, v in tools.items()})
    monkeypatch.setattr(rules, "deepspeed_prebuilt_ops", lambda: (set(), None))
    monkeypatch.setattr(rules, "kernels_route", lambda *a: (False, "faked unusable"))
    values = _values(tmp_path, "none")
    roots = (tmp_path, REPO / "recipes", REPO / "outputs")
    before = _snapshot(*roots)
    rc, out, err = _run(argv, values, capsys)
    assert rc == 2, f"exit {rc}\n{out[-2000:]}\n{err[-2000:]}"
    assert fragment.format(**values) in err and "Traceback" not in err + out, err[-3000:]
    assert _snapshot(*roots) == before, "files were created or changed"


def test_ctrl_c_during_the_checks_is_one_line_and_status_130(tmp_path, capsys, no_spawn, monkeypatch):
    from launch.run import runner

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "gather_facts", interrupted)
    rc, out, err = _run("ddp --smoke --cpu --output-dir {out}", _values(tmp_path, "none"), capsys)
    assert rc == 130
    assert err.strip() == "[launch] interrupted (Ctrl-C)" and "Traceback" not in out
    assert not (tmp_path / "out").exists()


# ---- valid input: accepted and passed on unchanged ----------------------------------------------------------------
def _dry_run(argv: str, tmp_path, capsys) -> tuple[str, list[str]]:
    own, dashes, extra = argv.partition(" -- ")
    rc, out, err = _run(own + " --dry-run" + dashes + extra, _values(tmp_path, "none"), capsys)
    assert rc == 0, err[-3000:]
    return out, [line.strip().rstrip("\\").strip() for line in out.splitlines()]


@pytest.mark.parametrize("extra,passed", [
    ("--no_dataloader_pin_memory", "--no_dataloader_pin_memory"),  # a `--no_X` flag of TrainingArguments
    ("--lora_target_modules q_proj v_proj", "--lora_target_modules q_proj v_proj"),
    ("--run_name 007", "--run_name 007"),
    ("--gradient_accumulation_steps 2", "--gradient_accumulation_steps 2"),
])
def test_valid_training_arguments_pass_through_unchanged(extra, passed, tmp_path, capsys, no_spawn):
    out, _lines = _dry_run(f"ddp --smoke --cpu -- {extra}", tmp_path, capsys)
    assert " ".join(passed.split()) in " ".join(out.replace("\\\n", " ").split())


def test_plan_shows_the_values_passed(tmp_path, capsys, no_spawn):
    out, _ = _dry_run("ddp --smoke --cpu -- --gradient_accumulation_steps 3 --per_device_train_batch_size 2", tmp_path,
                      capsys)
    assert "gradient accumulation    3" in out and "effective global batch   12 sequences" in out  # 2 x 2 x 3


def test_output_dir_tilde_is_expanded_and_the_launcher_owns_it(tmp_path, capsys, no_spawn, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    out, _ = _dry_run("ddp --smoke --cpu --output-dir=~/x", tmp_path, capsys)
    assert f"--output_dir {tmp_path}/x" in out
    out, _ = _dry_run("ddp --smoke --cpu -- --output_dir 2024", tmp_path, capsys)
    assert f"--output_dir {Path.cwd() / '2024'}" in out


def test_extra_training_arguments_keep_the_recorded_smoke_layout(tmp_path, capsys, no_spawn):
    out, _ = _dry_run("ddp --smoke --cpu -- --seed 7", tmp_path, capsys)
    assert "world size               2 process(es)" in out  # the recorded layout, not the config's 8
    out, _ = _dry_run("ddp --smoke --cpu --num-processes 4", tmp_path, capsys)
    assert "smoke layout changed to 4 process(es)" in out and "not judged" in out


@pytest.mark.parametrize("recipe,processes", [("alst-ulysses-4gpu", 4), ("ddp", 2)])
def test_the_recorded_layout_given_explicitly_is_not_a_change(recipe, processes, tmp_path, capsys, no_spawn):
    """`--num-processes N` equal to the recorded smoke layout is judged, not reported as a changed layout."""
    out, _ = _dry_run(f"{recipe} --smoke --cpu --num-processes {processes}", tmp_path, capsys)
    assert "smoke layout changed" not in out and "not judged" not in out
    from launch.config.options import Options
    from launch.run.resolve import resolve

    recorded = json.loads((RECIPES_DIR / recipe / "expected_metrics.json").read_text())["profiles"]["smoke-cpu"]
    setup = resolve(Options(recipe=recipe, smoke=True, cpu=True, num_processes=processes), progress=lambda *_: None)
    assert setup.invocation == recorded["invocation"]


@pytest.mark.parametrize("value", ["off", "OFF"])
def test_the_hang_watchdog_can_be_turned_off(value, tmp_path, capsys, no_spawn):
    _dry_run(f"ddp --smoke --cpu --hang-timeout {value}", tmp_path, capsys)
    from launch.config.options import hang_timeout

    assert hang_timeout(value) == float("inf") and hang_timeout("2.5") == 2.5


def test_record_creates_a_missing_expected_metrics_file_and_a_run_says_how(tmp_path, capsys, no_spawn):
    """`record` for a recipe without expected_metrics.json says it will create it; a run without one is
    refused with the record command that creates it."""
    folder = copy_recipe(tmp_path, base="ddp")
    (folder / "expected_metrics.json").unlink()
    rc, out, err = _run(f"record {folder} --smoke --cpu --num-processes 2 --dry-run", {}, capsys)
    assert rc == 0, err
    assert f"{folder / 'expected_metrics.json'} does not exist yet: this run's metrics will create it" in out
    rc, out, err = _run(f"{folder} --smoke --cpu --dry-run", {}, capsys)
    assert rc == 2 and "has no expected_metrics.json yet" in err
    assert f"python -m launch record {folder} --smoke --cpu" in err


@pytest.mark.parametrize("damage", ["truncate", "nan"])
def test_expected_metrics_broken_during_the_run_still_give_a_summary(damage, tmp_path, capsys, monkeypatch):
    """A reference that becomes unreadable (or NaN) while the run trains: the summary is written, and the
    judge says it could not judge with its own exit status (4), not the "refused before start" status 2. The
    training itself is replaced by a fake that writes what a finished run writes."""
    from launch.run import supervise
    from launch.results import judge

    folder = copy_recipe(tmp_path, base="ddp")
    expected = folder / "expected_metrics.json"
    steps = json.loads(expected.read_text())["profiles"]["smoke-cpu"]["steps"]

    def fake_training(cmd, log_path, env=None, watchdog=None, **_):
        out = Path(cmd[cmd.index("--output_dir") + 1])
        history = [{"step": i + 1, "loss": loss, "grad_norm": g} for i, (loss, g) in
                   enumerate(zip(steps["loss"], steps["grad_norm"]))]
        (out / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        log_path.write_text("trained\n")
        text = expected.read_text()
        expected.write_text(text[:40] if damage == "truncate" else text.replace(str(steps["loss"][0]), "NaN", 1))
        return 0, None

    monkeypatch.setattr(supervise, "run", fake_training)
    rc, out, err = _run(f"{folder} --smoke --cpu --output-dir {tmp_path / 'out'}", {}, capsys)
    assert rc == judge.UNREADABLE_REFERENCE == 4, out + err
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["verdict"]["passed"] is None and "expected metrics unreadable" in summary["verdict"]["reason"]
    assert "not judged: the expected metrics cannot be read any more" in out


# ---- options accepted before that lost data or time: beside the table -----------------------------------------------
def test_record_keeps_the_recorded_layout_unless_one_is_given(tmp_path, capsys, no_spawn):
    """`record ddp --smoke --cpu` records on the 2 processes ddp's smoke profile was recorded with, not on the
    config's 8 (which every later smoke run would then inherit)."""
    rc, out, err = _run("record ddp --smoke --cpu --dry-run", {}, capsys)
    assert rc == 0, err
    assert "world size               2 process(es)" in out
    rc, out, err = _run("record ddp --smoke --cpu --num-processes 4 --dry-run", {}, capsys)
    assert rc == 0 and "world size               4 process(es)" in out, err


def test_plan_says_plainly_when_nothing_fits(capsys, no_spawn):
    model = REPO / "docs" / "model_configs" / "Qwen--Qwen3-8B"
    rc, out, err = _run(f"plan ddp --model {model} --max-length auto --gpu-memory 1", {}, capsys)
    assert rc == 1, out + err
    assert out.startswith("Nothing fits: even ") and "Longest global max_length that fits: 0" not in out


def test_a_cpu_dry_run_that_does_not_fit_says_so(capsys, no_spawn):
    """The table says "does NOT fit": the dry run says it under "the plan is valid, but this machine could not run
    it" and exits 0, the documented status of that case (docs/running.md)."""
    model = REPO / "docs" / "model_configs" / "Qwen--Qwen3-8B"
    rc, out, err = _run(f"ring-cp-8gpu --cpu --dry-run --synthetic --model {model}", {}, capsys)
    assert rc == 0, err
    assert "Verdict: does NOT fit" in out
    assert "the plan is valid, but this machine could not run it" in out
    assert "The memory plan above does NOT fit its target" in out


def test_doctor_recipe_runs_the_runs_preflight(capsys, no_spawn):
    rc, out, err = _run("doctor alst-ulysses-4gpu --cpu --num-processes 3", {}, capsys)
    assert rc == 1, out + err
    assert "PROBLEM: The recipe's parallel layout" in out and "does not use 3 processes" in out


def test_compare_replaces_its_own_plot_only(tmp_path, capsys):
    from launch.results import plots

    runs = []
    for name, loss in (("a", [2.0, 1.5]), ("b", [2.0, 1.4])):
        (tmp_path / name).mkdir()
        history = [{"step": i + 1, "loss": v, "grad_norm": 1.0} for i, v in enumerate(loss)]
        (tmp_path / name / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        runs.append(str(tmp_path / name))
    out = tmp_path / "plot.png"
    for _ in range(2):  # written, then replaced: it is ours
        rc, _out, err = _run(f"compare {runs[0]} {runs[1]} --out {out}", {}, capsys)
        assert rc == 0 and plots.written_by_us(out), err
    (tmp_path / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n my own picture")
    rc, _out, err = _run(f"compare {runs[0]} {runs[1]} --out {tmp_path / 'mine.png'} --overwrite", {}, capsys)
    assert rc == 0 and plots.written_by_us(tmp_path / "mine.png"), err


def test_a_readme_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from launch.catalog.table import recipe_row
    from launch.errors import LaunchError

    folder = copy_recipe(tmp_path, base="ddp")
    readme = folder / "README.md"
    readme.write_bytes(b"# ddp\n\nR\xe9glages de base.\n")
    with pytest.raises(LaunchError, match=r"README.md:3: byte 0xe9 is not UTF-8"):
        recipe_row(str(folder))


def test_sync_scripts_names_a_train_py_that_is_a_folder(tmp_path):
    from launch.recipe import copies
    from launch.errors import LaunchError

    shutil.copytree(RECIPES_DIR / "ddp", tmp_path / "ddp")
    (tmp_path / "ddp" / "train.py").unlink()
    (tmp_path / "ddp" / "train.py").mkdir()
    with pytest.raises(LaunchError, match=r"ddp/train.py is a folder, not a train script"):
        copies.sync_copies(tmp_path)


# ---- rank-side refusals and tracebacks: beside the table -------------------------------------------------------------
@pytest.mark.parametrize("extra,fragment", [
    ("--lora_alpha -16", "lora_alpha is -16: LoRA scales its update B A x by lora_alpha / lora_r"),
    ("--lora_dropout 1", "a dropout of 1 zeroes the adapter's input at every training step"),
    ("--lora_dropout -0.1", "lora_dropout is -0.1"),
])
def test_lora_alpha_and_dropout_bounds(extra, fragment, tmp_path, capsys, no_spawn):
    rc, out, err = _run(f"lora --smoke --cpu --dry-run -- {extra}", _values(tmp_path, "none"), capsys)
    assert rc == 2 and fragment in err, err
    rc, out, err = _run("lora --smoke --cpu --dry-run -- --lora_alpha 1 --lora_dropout 0", _values(tmp_path, "none"),
                        capsys)
    assert rc == 0, err  # the smallest valid values pass


def test_every_enum_valued_accelerate_key_is_checked_against_its_upstream_enum(tmp_path):
    """One table (launch.config.accelerate_config.ENUMS): for each key, a value of upstream's enum passes (spelled as
    Accelerate writes it) and a misspelt one is refused with the enum's values; a value Accelerate folds (INDUCTOR,
    BF16) is not refused by the launch parser's lower-case choices."""
    from launch.config import accelerate_config

    for key, enum in accelerate_config.ENUMS.items():
        fsdp = {"fsdp_version": 1}
        config = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        nested = {"fsdp_": "fsdp_config", "dynamo_": "dynamo_config", "fp8_": "fp8_config"}
        section = next((s for prefix, s in nested.items() if key.startswith(prefix)), None)
        if key in ("offload_optimizer_device", "offload_param_device", "deepspeed_multinode_launcher"):
            section = "deepspeed_config"
        values = enum.values(config)
        assert values, key
        for value, refused in ((values[0], False), ("NOT_" + str(values[-1]) + "S", True)):
            data = {**config, section: {**config.get(section, {}), key: value}} if section else {**config, key: value}
            found = [p for p in accelerate_config.problems(tmp_path / "a.yaml", data) if f"{key}`" in p]
            assert bool(found) == refused, (key, value, found)
            if refused:
                assert f"is not a valid {enum.name}" in found[0] and str(values[0]) in found[0]
    folded = {"distributed_type": "MULTI_GPU", "mixed_precision": "BF16",
              "dynamo_config": {"dynamo_backend": "INDUCTOR"}, "fsdp_config": {"fsdp_sharding_strategy": "full_shard"}}
    assert accelerate_config.problems(tmp_path / "a.yaml", folded) == []


def test_a_slurm_machine_rank_0_says_what_it_waits_for_and_how_long(tmp_path, capsys, no_spawn, monkeypatch):
    """Machine rank 0 of a 2-node allocation started on one node: torchrun's static rendezvous waits for the other
    node; the run says so with its bound, --rendezvous-timeout, which reaches torchrun as rdzv_conf timeout."""
    for k, v in {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(k, v)
    rc, out, err = _run("ddp --smoke --cpu --dry-run --num-processes 4 --rendezvous-timeout 120",
                        _values(tmp_path, "none"), capsys)
    assert rc == 0, err
    assert ("machine rank 0: training starts once the other 1 machine(s) have joined at 127.0.0.1:29500; torchrun "
            "waits up to 120 s (--rendezvous-timeout) for them, then fails") in out
    assert "--rdzv_conf timeout=120" in out


@pytest.mark.parametrize("flag,line", [
    ("--num-processes 4", "processes: 4 in all (2 per machine) from --num-processes, not PET_NPROC_PER_NODE=auto: a "
                          "flag wins over the scheduler's variables"),
    ("", "processes: 2 in all (1 per machine) from the Accelerate config's num_processes: PET_NPROC_PER_NODE=auto "
         "asks torchrun to count this machine's devices"),
])
def test_which_process_count_won_is_said(flag, line, tmp_path, capsys, no_spawn, monkeypatch):
    for k, v in {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1",
                 "PET_NPROC_PER_NODE": "auto"}.items():
        monkeypatch.setenv(k, v)
    rc, out, err = _run(f"ddp --smoke --cpu --dry-run {flag}", _values(tmp_path, "none"), capsys)
    assert rc == 0, err
    assert line in out


def test_a_plan_that_does_not_fit_the_host_names_a_host_term(capsys, no_spawn):
    rc, out, err = _run("plan zero3-offload --host-memory 8", {}, capsys)
    assert rc == 1, out + err
    verdict = next(line for line in out.splitlines() if line.startswith("Verdict:"))
    assert "The largest host-memory term is offloaded optimizer states" in verdict
    assert "change offload_optimizer_device" in verdict and "The largest term is" not in verdict  # no GPU term


def test_merge_of_a_whole_adapter_folder_still_merges(tmp_path, capsys):
    """The checks of the table's merge rows refuse only what is broken: the same folder, whole, merges."""
    out = _lora_run(tmp_path)["out"]
    rc, stdout, err = _run(f"merge {out}", {}, capsys)
    assert rc == 0, err
    assert (outdir.RunFolder(out).merged / "model.safetensors").is_file()


def test_a_resumed_lora_run_says_its_merged_model_is_stale(tmp_path, capsys, monkeypatch):
    """`merge` wrote RUN_DIR/merged from final/; a --resume of the run writes a new final/: the end of the run and
    its summary say merged/ is stale, with the command that rebuilds it. The training is replaced by a fake that
    writes what a finished lora run writes (trainer_state.json, final/ with the adapter's files)."""
    from launch.run import supervise

    out = _lora_run(tmp_path)["out"]
    merged = outdir.RunFolder(out).merged
    merged.mkdir()
    (merged / "model.safetensors").write_bytes(b"merged earlier")
    outdir.record_entry(out, merged.name)
    steps = json.loads((RECIPES_DIR / "lora" / "expected_metrics.json").read_text())["profiles"]["smoke-cpu"]["steps"]

    def fake_training(cmd, log_path, env=None, watchdog=None, **_):
        folder = outdir.RunFolder(Path(cmd[cmd.index("--output_dir") + 1]))
        history = [{"step": i + 1, "loss": loss, "grad_norm": g} for i, (loss, g) in
                   enumerate(zip(steps["loss"], steps["grad_norm"]))]
        folder.trainer_state.write_text(json.dumps({"log_history": history}))
        for name, data in _adapter_files().items():
            (folder.final / name).write_bytes(data)
        log_path.write_text("trained\n")
        return 0, None

    monkeypatch.setattr(supervise, "run", fake_training)
    rc, stdout, err = _run(f"lora --smoke --cpu --output-dir {out} --resume", {}, capsys)
    assert rc == 0, stdout + err
    assert f"{merged} is stale: it was merged from the final/ of the run before this one" in stdout
    assert f"`rm -r {merged} && python -m launch merge {out}`" in stdout
    assert json.loads(outdir.RunFolder(out).summary.read_text())["stale"] == [str(merged)]
