"""FSDP's SHARDED_STATE_DICT still ends with loadable full weights (launch/rank/consolidate.py, train.py's section
sharded-final-save), and train.py never says "saved" without a tensor written.

- One smoke run (slow): fsdp2 with `fsdp_state_dict_type: SHARDED_STATE_DICT` (a copy of the recipe whose Accelerate
  config says so). Its final/ loads with transformers' from_pretrained and equals the FULL_STATE_DICT run's final
  weights (the shared fsdp2 smoke run: same steps, same data); both ranks wrote output files; the distributed
  checkpoint is gone once consolidated.
- In process, no training: the consolidation of a distributed checkpoint written here writes what save_pretrained
  writes (tied weights once, a MoE model's experts one per expert again, across several files with an index), a
  missing shard is named, the plan bounds every file, the one-process command (`python -m launch.rank.consolidate`)
  turns a sharded checkpoint into weights, fsdp2-70b's README states the plan's figures for Qwen2.5-72B, and train.py
  stops instead of saying "saved" over no tensor.

The LoRA adapter under FSDP2 with SHARDED_STATE_DICT is tests/test_lora.py's (equal to DDP's adapter); HSDP and
FSDP1 (full model, and qlora-fsdp's adapter) under SHARDED_STATE_DICT were checked by hand (equal to FULL_STATE_DICT's
final weights), not in CI.
"""

from __future__ import annotations

import ast
import json
import os
import shutil

import pytest
import torch
import yaml

from helpers.launcher import explain, launch_in_process
from launch.recipe.copies import sync_script
from launch.results.outdir import RunFolder
from launch.catalog.blocks import MODEL_CONFIGS
from launch.rank import consolidate
from launch.recipe.discovery import RECIPES_DIR, find_recipe
from launch.recipe.template import TEMPLATE

# DCP in one process says it assumes one process, which it is
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8)


def _load(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder))


def _checkpoint_of(model, folder):
    """`model` saved by save_pretrained, reloaded (as training starts: from_pretrained), then written as the DCP
    folder a sharded final save writes (here in one process: every tensor one chunk)."""
    import torch.distributed.checkpoint as dcp

    reference = folder / "reference"
    model.save_pretrained(reference)
    loaded = _load(reference)
    final = folder / "final"
    dcp.save({consolidate.STATE_KEY: loaded.state_dict()},
             storage_writer=dcp.FileSystemWriter(str(final / consolidate.CHECKPOINT)), no_dist=True)
    loaded.config.save_pretrained(final)
    return loaded, reference, final


def _safetensors_keys(folder) -> set[str]:
    from safetensors import safe_open

    return {k for name in os.listdir(folder) if name.endswith(".safetensors")
            for k in safe_open(os.path.join(folder, name), framework="pt").keys()}


def test_tied_weights_are_written_once_as_save_pretrained_writes_them(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    loaded, reference, final = _checkpoint_of(Qwen3ForCausalLM(Qwen3Config(**TINY, tie_word_embeddings=True)), tmp_path)
    files = consolidate.consolidate(str(final / consolidate.CHECKPOINT), str(final), loaded)
    assert [f.name for f in files] == ["model.safetensors"]
    assert _safetensors_keys(final) == _safetensors_keys(reference)  # lm_head.weight, tied, left out as upstream does
    again = _load(final).state_dict()
    assert all(torch.equal(t, again[k]) for k, t in loaded.state_dict().items())


def test_converted_weights_are_reverted_per_file_across_several_files(tmp_path, monkeypatch):
    """Qwen3-MoE: transformers fuses the experts when loading (`mlp.experts.gate_up_proj`) and splits them again when
    saving; the consolidation reverts per output file and writes save_pretrained's names, over several files."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2))
    loaded, reference, final = _checkpoint_of(moe, tmp_path)
    assert any(k.endswith("experts.gate_up_proj") for k in loaded.state_dict())  # fused in memory
    monkeypatch.setattr(consolidate, "SHARD_BYTES", 20_000)
    files = consolidate.consolidate(str(final / consolidate.CHECKPOINT), str(final), loaded)
    assert len(files) > 2 and all(f.name == f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                  for i, f in enumerate(files, start=1))
    assert _safetensors_keys(final) == _safetensors_keys(reference)  # one tensor per expert, as upstream saves
    index = json.loads((final / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == _safetensors_keys(reference)
    assert index["metadata"]["total_size"] == sum(os.path.getsize(final / f.name) for f in files) - sum(
        8 + int.from_bytes((final / f.name).read_bytes()[:8], "little") for f in files)  # the tensors' bytes
    again = _load(final).state_dict()
    assert all(torch.equal(t, again[k]) for k, t in loaded.state_dict().items())


def test_the_plan_bounds_each_file_and_spreads_the_work(tmp_path, monkeypatch):
    """A file holds at most min(SHARD_BYTES, 1/world of the model) bytes, a larger tensor alone; here (tensors small
    against the model) that gives every rank at least one file."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    loaded, _, final = _checkpoint_of(Qwen3ForCausalLM(Qwen3Config(**TINY)), tmp_path)
    checkpoint = str(final / consolidate.CHECKPOINT)
    total = sum(t.numel() * t.element_size() for t in loaded.state_dict().values())
    for world in (1, 2, 4):
        files = consolidate.plan(checkpoint, loaded, world)
        assert len(files) >= world and sum(f.nbytes for f in files) == total
        assert all(f.nbytes <= -(-total // world) or len(f.tensors) == 1 for f in files)
    monkeypatch.setattr(consolidate, "SHARD_BYTES", 1)  # every tensor alone
    assert len(consolidate.plan(checkpoint, loaded, 1)) == len(loaded.state_dict())


def test_a_shard_this_process_cannot_see_is_named(tmp_path):
    """What a machine without the others' shards sees (no shared storage): the consolidation stops before writing."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    loaded, _, final = _checkpoint_of(Qwen3ForCausalLM(Qwen3Config(**TINY)), tmp_path)
    checkpoint = final / consolidate.CHECKPOINT
    assert consolidate.storage_problems(str(checkpoint)) == []
    shard = next(p for p in checkpoint.iterdir() if p.suffix == ".distcp")
    shard.unlink()
    [problem] = consolidate.storage_problems(str(checkpoint))
    assert f"1 of its 1 shard files are not in {checkpoint} ({shard.name})" == problem
    with pytest.raises(FileNotFoundError, match="is not a whole distributed checkpoint"):
        consolidate.consolidate(str(checkpoint), str(final), loaded)
    assert not list(final.glob("*.safetensors"))
    (checkpoint / ".metadata").unlink()
    assert consolidate.storage_problems(str(checkpoint)) == [f"{checkpoint}/.metadata is missing"]


def test_the_one_process_command_consolidates_a_checkpoint_for_the_model_named(tmp_path, capsys):
    """`python -m launch.rank.consolidate FOLDER --model M --out DIR` (a checkpoint-N holds no config.json): the
    architecture from M's config on the meta device, the files and config.json into DIR."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    loaded, reference, final = _checkpoint_of(Qwen3ForCausalLM(Qwen3Config(**TINY, tie_word_embeddings=True)), tmp_path)
    checkpoint = tmp_path / "checkpoint-12"
    shutil.move(final / consolidate.CHECKPOINT, checkpoint / consolidate.CHECKPOINT)
    assert consolidate.main([str(checkpoint), "--model", str(reference), "--out", str(tmp_path / "weights")]) == 0
    assert "1 safetensors file(s) in " in capsys.readouterr().out
    assert _safetensors_keys(tmp_path / "weights") == _safetensors_keys(reference)
    again = _load(tmp_path / "weights").state_dict()
    assert all(torch.equal(t, again[k]) for k, t in loaded.state_dict().items())


def _no_weights_check():
    """train.py's check after the final save (the `if` in main that imports safe_open), as a function of (trainer,
    final_dir): the template's own lines, compiled alone."""
    tree = ast.parse(TEMPLATE.read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    [check] = [n for n in ast.walk(main) if isinstance(n, ast.If) and "safe_open" in ast.unparse(n.body[0])]
    code = compile(ast.Module(body=[check], type_ignores=[]), str(TEMPLATE), "exec")

    def run(trainer, final_dir):
        exec(code, {"os": os, "trainer": trainer, "final_dir": str(final_dir)})

    return run


def test_train_py_stops_rather_than_say_saved_when_no_tensor_was_written(tmp_path):
    """No final folder, or one whose only safetensors file holds no tensor (PEFT's empty adapter): an error on the
    main process, before the "saved" line; a file with a tensor passes. The other ranks do not look."""
    from types import SimpleNamespace

    from safetensors.torch import save_file

    check = _no_weights_check()
    main, other = (SimpleNamespace(accelerator=SimpleNamespace(is_main_process=m)) for m in (True, False))
    with pytest.raises(RuntimeError, match="No weights in .*missing: transformers writes them under FSDP only with"):
        check(main, tmp_path / "missing")
    save_file({}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="No weights in"):
        check(main, tmp_path)
    check(other, tmp_path / "missing")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    check(main, tmp_path)


def test_the_fsdp2_70b_readme_states_what_the_consolidation_plans():
    """fsdp2-70b's README figures for a SHARDED_STATE_DICT final save of Qwen2.5-72B (its size, its files and their
    largest, the files per process and the host memory of a machine) are the plan's: computed here from the model's
    config (built on the meta device; fp32, as FSDP2 keeps the parameters) and the Accelerate config's processes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    recipe = find_recipe("fsdp2-70b")
    world, machines = int(recipe.accelerate["num_processes"]), int(recipe.accelerate["num_machines"])
    config = AutoConfig.from_pretrained(MODEL_CONFIGS / recipe.config["model_name_or_path"].replace("/", "--"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    sizes = [t.numel() * 4 for k, t in model.state_dict().items() if k not in model.all_tied_weights_keys]
    groups = consolidate.file_groups(sizes, world)
    largest = max(sum(sizes[i] for i in g) for g in groups)
    per_process = max(len(groups[r::world]) for r in range(world))
    text = (recipe.path / "README.md").read_text()
    assert f"final save ({round(sum(sizes) / 1e9)} GB:" in text
    assert f"{len(groups)} safetensors files of at most {largest / 1e9:.2f} GB" in text
    assert f"the {world} processes write at most {per_process} files each" in text
    assert f"{round(world // machines * largest / 1e9)} GB on a machine of {world // machines}" in text


@pytest.mark.slow


@pytest.mark.long
def test_a_sharded_fsdp2_run_ends_with_the_full_state_dict_runs_weights(smoke_runs, tmp_path):
    copy = tmp_path / "fsdp2-sharded"
    shutil.copytree(RECIPES_DIR / "fsdp2", copy)
    accelerate = yaml.safe_load(find_recipe("fsdp2").accelerate_config_path.read_text())
    accelerate["fsdp_config"]["fsdp_state_dict_type"] = "SHARDED_STATE_DICT"
    (copy / "accelerate.yaml").write_text(yaml.safe_dump(accelerate))
    config = yaml.safe_load((copy / "config.yaml").read_text())
    (copy / "config.yaml").write_text(yaml.safe_dump({**config, "accelerate_config": "accelerate.yaml"}))
    sync_script(copy / "train.py", out=lambda line: None)
    out = tmp_path / "out"
    proc = launch_in_process(copy, "--smoke", "--cpu", "--output-dir", out)
    assert proc.returncode == 0, explain(proc)
    assert f"Model saved to {RunFolder(out).final}." in proc.stdout

    full_proc, _ = smoke_runs.run("fsdp2")  # FULL_STATE_DICT, the same 12 steps on the same data
    assert full_proc.returncode == 0, explain(full_proc)
    full, sharded = RunFolder(smoke_runs.output_dir("fsdp2")).final, RunFolder(out).final
    names = sorted(p.name for p in sharded.iterdir())
    assert not (sharded / consolidate.CHECKPOINT).exists()  # removed once the files checked out
    # each of the 2 ranks wrote output files (the model cut into 1/2-size files: 3 here)
    assert names == ["chat_template.jinja", "config.json", "generation_config.json",
                     "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json", "tokenizer.json",
                     "tokenizer_config.json", "training_args.bin"]
    assert json.loads((sharded / "config.json").read_text()) == json.loads((full / "config.json").read_text())
    a, b = _load(full).state_dict(), _load(sharded).state_dict()
    assert a.keys() == b.keys() and {t.dtype for t in b.values()} == {torch.float32}
    # tolerance: fp32 noise; measured (torch 2.13 CPU, 2 processes over gloo): 0.0, the same numbers (the same
    # sharded fp32 parameters, gathered by FULL_STATE_DICT, or written by each rank and read back)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
