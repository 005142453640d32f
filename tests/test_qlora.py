"""QLoRA (recipes/qlora-fsdp): a 4-bit NF4 base (bitsandbytes) with LoRA adapters under FSDP1, checked on CPU.

bitsandbytes 0.50's 4-bit path trains on CPU (launch/config/adapter.py `quantization_on_cpu_supported`), so the recipe's
smoke profile runs there: 2 processes, FSDP1 over gloo (launch/cpu/fsdp.py), bf16 (TRL casts a quantized model's
adapters to bf16). The judged run itself is tests/test_smoke_recipes.py's; here:
- its config, rules and plan on the GPU profile (fast);
- the judged smoke run really went through FSDP1, and its final folder holds a trained adapter, only (slow, shares
  the smoke run);
- a run whose rank dies after a checkpoint, resumed, equals the judged run: losses, gradient norms, final adapter
  (slow: two more runs);
- under FSDP1 each rank holds half of every decoder layer's flat parameter, the packed 4-bit storage included, the
  4-bit base is bit-for-bit the same after training, and the per-step losses equal one process's (slow: the same
  libraries as the recipe, bitsandbytes + PEFT + torch FSDP1 with PEFT's wrap policy, in 2 gloo processes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers.launcher import REPO, explain, free_port, launch_in_process, test_env
from launch.results.outdir import ADAPTER_WEIGHTS, RunFolder
from launch.cpu.fsdp import FSDP1_LINE
from launch.config.options import Options
from launch.run.resolve import resolve


# ---- fast: config, rules and plan ------------------------------------------------------------------------------
def test_gpu_profile_validates_as_fsdp1_qlora():
    proc = launch_in_process("qlora-fsdp", "--dry-run")
    assert proc.returncode == 0, explain(proc)
    assert "FSDP1" in proc.stdout and "4-bit nf4 base" in proc.stdout
    assert "--config_file accelerate_configs/qlora_fsdp.yaml" in proc.stdout


def test_plan_prints_the_adapter_terms():
    proc = launch_in_process("plan", "qlora-fsdp")
    assert proc.returncode == 0, explain(proc)
    for term in ("frozen base parameters", "adapter parameters (LoRA A, B)", "optimizer states (Adam)", "total"):
        assert term in proc.stdout, term


def test_cpu_profile_runs_fsdp1_in_bf16_without_an_accelerator_broadcast():
    setup = resolve(Options(recipe="qlora-fsdp", smoke=True, cpu=True))
    assert setup.layout.kind == "fsdp1"
    assert setup.training["dtype"] == "bfloat16" and setup.training["bnb_4bit_quant_storage"] == "bfloat16"
    assert setup.accelerate_overrides["fsdp_sync_module_states"] is False
    assert setup.accelerate_overrides["fsdp_cpu_ram_efficient_loading"] is False


# ---- slow: the judged smoke run --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_smoke_run_is_fsdp1_and_saves_a_trained_adapter(smoke_runs):
    from safetensors.torch import load_file

    proc, summary = smoke_runs.run("qlora-fsdp")
    assert proc.returncode == 0, explain(proc)
    assert FSDP1_LINE.format(shard=2) in proc.stdout  # FSDP1 really ran, not a silent MULTI_CPU (DDP) fallback
    assert summary["verdict"]["passed"] is True
    tensors = load_file(smoke_runs.output_dir("qlora-fsdp") / "final" / "adapter_model.safetensors")
    # The smoke model: 2 decoder layers x 7 linear layers (all-linear but lm_head) x lora_A, lora_B; nothing else
    # (the 4-bit base is not in the adapter). PEFT 0.21.2 writes this file empty under FSDP1 without templates/
    # train.py's fsdp1-adapter-save section.
    assert len(tensors) == 28 and all(".lora_A." in k or ".lora_B." in k for k in tensors), sorted(tensors)
    # lora_B starts at zero: every one moved, so the adapter is the trained one
    assert all(float(t.float().abs().max()) > 0 for k, t in tensors.items() if ".lora_B." in k)
    # The adapter's dtype is the one launch.config.precision reads for this run (and the memory model counts): the CPU
    # profile has no mixed precision, so TRL's bf16 cast of a quantized model's adapter stands; on a GPU (bf16)
    # Accelerate upcasts FSDP1's trainable flat parameters to fp32 (tests/test_bf16.py runs that on CPU)
    precision = resolve(Options(recipe="qlora-fsdp", smoke=True, cpu=True)).precision
    assert {str(t.dtype) for t in tensors.values()} == {f"torch.{precision.trainable_dtype}"} == {"torch.bfloat16"}


# ---- slow: a resumed run equals the uninterrupted one ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_resume_after_a_dying_rank_equals_the_uninterrupted_run(smoke_runs, tmp_path):
    """Rank 1 dies at the end of step 7 (checkpoints every 3 steps: checkpoint-6 is the newest), the run resumes with
    --resume to step 12: the same losses and gradient norms as the judged smoke run, and the same final adapter.
    The Trainer loads the checkpoint's adapter into the FSDP1-wrapped model through accelerate and PEFT, which load
    nothing there without templates/train.py's fsdp1-adapter section (`load_adapter_under_fsdp1_wrappers`): the
    resumed steps then train from the initial adapter with the restored Adam state (measured without it, step 7: loss
    4.23 against 3.76, grad_norm 1.09 against 0.50; the resumed run then also misses the recipe's recorded metrics)."""
    from safetensors.torch import load_file

    proc, whole = smoke_runs.run("qlora-fsdp")
    assert proc.returncode == 0, explain(proc)
    out = tmp_path / "out"
    died = launch_in_process("qlora-fsdp", "--smoke", "--cpu", "--save-steps", "3", "--output-dir", out,
                             fault="1:7:raise")
    assert died.returncode != 0 and "RuntimeError: injected failure" in died.stdout, explain(died)
    assert f"last complete checkpoint: {RunFolder(out).checkpoint(6)}" in died.stdout
    resumed = launch_in_process("qlora-fsdp", "--smoke", "--cpu", "--save-steps", "3", "--output-dir", out, "--resume")
    assert resumed.returncode == 0, explain(resumed)
    observed = json.loads(RunFolder(out).summary.read_text())["observed"]
    assert observed["step"] == whole["observed"]["step"] == list(range(1, 13))
    # measured: identical (0 difference in loss and grad_norm over the 12 steps), as DDP's LoRA (tests/test_lora.py)
    assert observed["loss"] == pytest.approx(whole["observed"]["loss"], abs=1e-6)
    assert observed["grad_norm"] == pytest.approx(whole["observed"]["grad_norm"], abs=1e-6)
    ours = load_file(RunFolder(out).final / ADAPTER_WEIGHTS)
    theirs = load_file(smoke_runs.output_dir("qlora-fsdp") / "final" / ADAPTER_WEIGHTS)
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)


# ---- slow: FSDP1 shards the 4-bit storage; the base stays frozen -----------------------------------------------
PROBE = r'''
import json, os, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from launch.config import smoke

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
    # FSDP1's gathers hold tensors a gloo worker drops at exit: without the CPU path's pause, a rank may abort after
    # its work is done ("terminate called without an active exception": seen once in a full CI run, 2026-11-28)
    from launch.cpu.gloo_exit import let_gloo_workers_finish_at_exit
    let_gloo_workers_finish_at_exit()
rank = dist.get_rank() if distributed else 0
path = smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                       bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(path, quantization_config=q, dtype=torch.bfloat16)
torch.manual_seed(0)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights="gaussian"),
                       autocast_adapter_dtype=False)
model.train()  # a CPU forward in eval mode without grad would repack the 4-bit weights (bitsandbytes' CPU kernel)
four_bit = {n: p.detach().view(torch.uint8).clone() for n, p in model.named_parameters()
            if type(p).__name__ == "Params4bit"}
layer_numel = [sum(p.numel() for n, p in model.named_parameters() if f"layers.{i}." in n and not p.requires_grad)
               for i in range(model.config.num_hidden_layers)]
out = {"four_bit_storage": sorted({str(p.dtype) for n, p in model.named_parameters() if n in four_bit}),
       "layer_numel": layer_numel}
if distributed:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from peft.utils.other import fsdp_auto_wrap_policy
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False,
                 device_id=torch.device("cpu"))
    # the frozen flat parameter of each decoder layer (its 4-bit weights and norms): this rank's shard
    out["layer_shard_numel"] = [p.numel() for n, p in model.named_parameters()
                                if ".layers." in n and n.endswith("_flat_param") and "lora_" not in n
                                and not p.requires_grad]
tok = AutoTokenizer.from_pretrained(path)
ids = tok(["sort these numbers : one , nine , three", "sort these numbers : two , zero"], return_tensors="pt",
          padding=True).input_ids
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
losses = []
for _ in range(3):
    loss = model(input_ids=ids, labels=ids).loss  # every rank the same batch: the mean gradient is one process's
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
out["losses"] = losses
if distributed:
    with FSDP.summon_full_params(model, writeback=False):
        inner = model.module
        out["base_unchanged"] = all(
            torch.equal(p.detach().view(torch.uint8), four_bit[n.replace("_fsdp_wrapped_module.", "")])
            for n, p in inner.named_parameters() if n.replace("_fsdp_wrapped_module.", "") in four_bit)
else:
    out["base_unchanged"] = all(torch.equal(p.detach().view(torch.uint8), four_bit[n])
                                for n, p in model.named_parameters() if n in four_bit)
json.dump(out, open(f"{sys.argv[1]}/rank{rank}.json", "w"))
if distributed:
    dist.destroy_process_group()
'''


@pytest.mark.slow


@pytest.mark.long
def test_fsdp1_shards_the_4bit_storage_and_leaves_the_base_unchanged(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir(), multi.mkdir()
    env = test_env()
    for cmd in ([sys.executable, str(script), str(single)],
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                 str(free_port()), str(script), str(multi)]):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one = json.loads((single / "rank0.json").read_text())
    ranks = [json.loads((multi / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert one["four_bit_storage"] == ["torch.bfloat16"]  # 4 NF4 weights per bf16 element: FSDP can shard it
    for r in ranks:
        # each rank holds half of every decoder layer's frozen flat parameter (4-bit storage + norms), padded to
        # an even split
        assert r["layer_shard_numel"] == [(n + 1) // 2 for n in one["layer_numel"]], (r, one["layer_numel"])
        assert r["base_unchanged"] is True
    assert one["base_unchanged"] is True
    # every rank trains on the same batch, so FSDP1 (gathering the 4-bit weights, reduce-scattering the adapters'
    # gradients) must train exactly as one process: measured equal to the last bit over the 3 steps
    assert ranks[0]["losses"] == ranks[1]["losses"] == one["losses"], (ranks[0]["losses"], one["losses"])
