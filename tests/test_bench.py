"""Throughput, MFU and memory (launch/speed/measured.py): both MFU conventions on hand-computed cases, the GPU peak
table,
the ranks' callback driven on CPU (tokens, synchronised marks, its cost), how the ranks' files combine, the planner's
prediction beside each memory figure, the longest-length search, and `bench --max-length auto` refusing a machine
without GPUs. A CPU smoke run's --bench figures in run_summary.json are checked in tests/test_smoke_recipes.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launch import memory
from launch.facts import gpus
from launch.speed import measured as throughput
from launch.rank import measure
from launch.__main__ import main

CONFIGS = Path(__file__).resolve().parents[1] / "docs" / "model_configs"


def arch_of(name: str) -> memory.Architecture:
    return memory.Architecture.from_config(json.loads((CONFIGS / name / "config.json").read_text()))


def test_mfu_on_a_hand_computed_case():
    # 6 N + 12 L H d S with N = 1000, L = 2, H = 4, d = 8, S = 16: 6,000 + 12 x 2 x 4 x 8 x 16 = 6,000 + 12,288
    assert throughput.flops_per_token(1000, 2, 4, 8, 16) == 18_288
    # causal-discounted: the attention term halved, 6,000 + 6,144
    assert throughput.flops_per_token(1000, 2, 4, 8, 16, causal=True) == 12_144
    # 1e6 tokens/s per GPU x 18,288 FLOPs per token against a 1e12 FLOP/s peak
    assert throughput.mfu(1e6, 18_288, 1e12) == pytest.approx(0.018288)
    assert throughput.mfu(1e6, 18_288, None) is None


def test_mfu_of_llama_8b_matches_torchtitans_convention():
    """torchtitan counts N without the input embedding table; for Llama-3.1-8B (untied head) at 8K that is
    6 x 7.50e9 + 12 x 32 x 32 x 128 x 8192 = 4.50e10 + 1.29e10 FLOPs per token."""
    arch = arch_of("meta-llama--Llama-3.1-8B-Instruct")
    n = arch.num_params - arch.vocab_size * arch.hidden_size
    assert throughput.flops_params(arch) == arch.matmul_params == n
    assert 7.4e9 < n < 7.6e9
    assert throughput.flops_per_token(n, 32, 32, 128, 8192) == 6 * n + 12 * 32 * 32 * 128 * 8192


def test_a_tied_lm_head_is_still_a_matmul():
    """Qwen3-0.6B ties its LM head to the embeddings: num_params counts the matrix once, as the embedding, but the
    head is a 1024 x 151,936 matmul on every token (25% of the model's matmul FLOPs), so N adds it back."""
    arch = arch_of("Qwen--Qwen3-0.6B")
    assert arch.tie_word_embeddings
    head = arch.vocab_size * arch.hidden_size
    assert throughput.flops_params(arch) == arch.num_params - arch.embedding_params + head
    assert 0.2 < head / throughput.flops_params(arch) < 0.3


def test_the_two_conventions_differ_as_published():
    """REFERENCE: at 8K for an 8B model non-causal and causal-discounted differ by about 14%; at 1M by about 2x."""
    arch = arch_of("Qwen--Qwen3-8B")
    n = throughput.flops_params(arch)

    def ratio(s):
        args = (n, arch.num_layers, arch.num_attention_heads, arch.head_dim, s)
        return throughput.flops_per_token(*args) / throughput.flops_per_token(*args, causal=True)

    assert 1.12 < ratio(8192) < 1.16
    assert 1.85 < ratio(1_048_576) < 2.0


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA GH200 480GB", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A10G", 70e12), ("NVIDIA L40S", 362e12), ("NVIDIA L4", 121e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12), ("cpu", None),
])
def test_gpu_peak_table(name, peak):
    assert gpus.peak_bf16(name) == peak


# ---- the ranks' callback, driven on CPU -----------------------------------------------------------------------------
class _Trainerless:
    """Drives a TrainerCallback as the Trainer does, with a tiny embedding as the model."""

    def __init__(self, callback, max_steps):
        import torch

        self.cb, self.torch = callback, torch
        self.model = torch.nn.Sequential(torch.nn.Embedding(10, 4))
        self.model.get_input_embeddings = lambda: self.model[0]
        self.state = SimpleNamespace(global_step=0, max_steps=max_steps)
        self.cb.on_train_begin(None, self.state, None, model=self.model)

    def step(self, micro_batches=2, rows=3, length=5):
        self.cb.on_step_begin(None, self.state, None)
        for _ in range(micro_batches):
            self.model(self.torch.zeros(rows, length, dtype=self.torch.long))
        self.state.global_step += 1
        self.cb.on_step_end(None, self.state, None)

    def end(self):
        self.cb.on_train_end(None, self.state, None)


def test_the_callback_counts_tokens_marks_and_writes_after_warmup(tmp_path):
    run = _Trainerless(measure.measure_callback(tmp_path, warmup=2), max_steps=14)
    for _ in range(14):
        run.step()
    run.end()
    info = json.loads((tmp_path / "rank0.json").read_text())
    assert info["device"] == "cpu" and info["warmup"] == 2 and info["sync_every_step"] is False
    assert [s["step"] for s in info["steps"]] == list(range(3, 15))  # warm-up steps 1-2 not measured
    assert all(s["tokens"] == 2 * 3 * 5 for s in info["steps"])  # every micro-batch's input_ids, through the hook
    assert all(s["real_tokens"] == 30 for s in info["steps"])  # no attention_mask: every token is real
    # marks: the first measured step's start, every 10 measured steps, the last step
    assert [m["steps"] for m in info["marks"]] == [0, 10, 12]
    assert info["marks"][-1]["tokens"] == info["marks"][-1]["real_tokens"] == 12 * 30
    assert info["memory"]["peak_rss_gib"] > 0
    summary = throughput.summarize(tmp_path)
    assert summary["overall"]["timing"] == "synchronised marks"
    assert summary["overall"]["tokens_per_s_per_gpu"] == pytest.approx(360 / info["marks"][-1]["time_s"])
    assert summary["overall"]["padding_fraction"] == 0


def test_the_callback_costs_little_per_step(tmp_path):
    """Host-side cost of the always-on measurement per optimizer step (hook on 2 micro-batches, timestamps, a mark
    and a file write every 10 steps), against the same loop without the callback. Measured on the 2-core CI
    machine: 92 to 145 microseconds of CPU per step; the bound is loose. Counted in this process's CPU time, the
    cost asked about: in wall time, beside CI's other worker and a CPU-bound process, the loop read 1.30 and then
    1.25 ms per step (with the fastest of the blocks below), the file write and rename every 10 steps waiting on a disk
    the other worker's runs were writing checkpoints to. The two loops alternate in blocks, each keeping its fastest."""
    blocks, steps = 8, 50
    plain = _Trainerless(SimpleNamespace(on_train_begin=lambda *a, **k: None, on_step_begin=lambda *a: None,
                                         on_step_end=lambda *a: None, on_train_end=lambda *a: None), blocks * steps)
    measured = _Trainerless(measure.measure_callback(tmp_path, warmup=0), blocks * steps)

    def block(run) -> float:
        t0 = time.process_time()
        for _ in range(steps):
            run.step()
        return time.process_time() - t0

    fastest = {id(run): float("inf") for run in (plain, measured)}
    for _ in range(blocks):
        for run in (plain, measured):
            fastest[id(run)] = min(fastest[id(run)], block(run))
    per_step = (fastest[id(measured)] - fastest[id(plain)]) / steps
    print(f"bench callback: {1e6 * per_step:.0f} us of CPU per step on this host")
    assert per_step < 1e-3


# ---- the launcher's side ---------------------------------------------------------------------------------------------
def _rank_file(folder, rank, times, tokens, device="NVIDIA H100 80GB HBM3", allocated=38.0, reserved=40.0,
               marks=None, warmup=2):
    steps = [{"step": warmup + i + 1, "time_s": t, "tokens": tokens} for i, t in enumerate(times)]
    info = {"rank": rank, "warmup": warmup, "device": device, "power_limit_w": 700.0, "sync_every_step": False,
            "steps": steps, "marks": marks or [],
            "memory": {"max_allocated_gib": allocated, "max_reserved_gib": reserved, "device_used_gib": reserved + 1,
                       "peak_rss_gib": 3.0, "host_used_gib": 100.0}}
    (folder / f"rank{rank}.json").write_text(json.dumps(info))


SMALL = memory.Architecture(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            intermediate_size=128, vocab_size=64, tie_word_embeddings=False)


def test_summary_takes_the_slowest_rank_and_computes_both_mfus(tmp_path):
    _rank_file(tmp_path, 0, [1.0, 1.0], tokens=1000)
    _rank_file(tmp_path, 1, [2.0, 1.0], tokens=1000, allocated=39.0, reserved=42.0)
    summary = throughput.summarize(tmp_path, SMALL, seq_len=128)
    o = summary["overall"]
    assert o["measured_steps"] == 2 and o["warmup_steps"] == 2 and o["timing"] == "sum of per-step times"
    assert [s["time_s"] for s in summary["per_step"]] == [2.0, 1.0]  # the step ends with its slowest rank
    assert o["tokens_per_s_per_gpu"] == pytest.approx(2000 / 3.0)  # 2 steps x 1000 tokens per GPU in 3 s
    n = throughput.flops_params(SMALL)
    assert o["mfu"] == pytest.approx(2000 / 3.0 * throughput.flops_per_token(n, 2, 4, 16, 128) / 989e12)
    assert o["mfu_causal"] == pytest.approx(2000 / 3.0 * throughput.flops_per_token(n, 2, 4, 16, 128, True) / 989e12)
    assert o["mfu"] > o["mfu_causal"]
    assert "torchtitan" in o["mfu_convention"] and "non-causal" in o["mfu_convention"] and "989" in o["mfu_convention"]
    assert "attention halved" in o["mfu_causal_convention"]
    # memory of each rank, not only the worst
    assert [r["max_reserved_gib"] for r in summary["per_rank"]] == [40.0, 42.0]
    assert o["peak_reserved_gib"] == 42.0 and o["power_limit_w"] == 700.0


def test_overall_comes_from_the_synchronised_marks_of_the_slowest_rank(tmp_path):
    """The per-step times are the host's view; the overall figure is the synchronised one, at the last mark every
    rank reached."""
    _rank_file(tmp_path, 0, [0.5, 0.5, 0.5], tokens=100, marks=[{"steps": 0, "time_s": 0, "tokens": 0},
                                                                {"steps": 3, "time_s": 6.0, "tokens": 300}])
    _rank_file(tmp_path, 1, [0.5, 0.5, 0.5], tokens=100, marks=[{"steps": 0, "time_s": 0, "tokens": 0},
                                                                {"steps": 3, "time_s": 5.0, "tokens": 300}])
    o = throughput.summarize(tmp_path, SMALL, 128)["overall"]
    assert o["timing"] == "synchronised marks"
    assert o["tokens_per_s_per_gpu"] == pytest.approx(300 / 6.0)
    assert o["step_time_s_mean"] == pytest.approx(2.0)


def _estimate(device="gpu"):
    terms = [memory.Term("parameters", 10.0, "x", "gpu"), memory.Term("CUDA context + NCCL buffers", 1.0, "x", "gpu"),
             memory.Term("allocator reserve (fragmentation)", 0.8, "x", "gpu")]
    return memory.Estimate(gpu_terms=terms, host_terms=[], gpu_peak_gib=41.8, host_per_process_gib=1.0,
                           host_per_node_gib=2.0, per_rank_length=128, allocated_peak_gib=40.0, device=device)


def test_report_puts_the_planners_prediction_beside_each_measured_figure(tmp_path):
    _rank_file(tmp_path, 0, [1.0, 1.0], tokens=1000)
    _rank_file(tmp_path, 1, [1.0, 1.0], tokens=1000, allocated=39.0, reserved=42.0)
    rep = throughput.report(tmp_path, SMALL, 128, _estimate())
    rows = {r["what"]: r for r in rep["memory_vs_plan"]}
    allocated = rows["peak allocated (torch)"]
    assert allocated["per_rank_gib"] == [38.0, 39.0] and allocated["predicted_gib"] == 40.0
    assert allocated["ratio"] == pytest.approx(39.0 / 40.0)
    # reserved: the planner's total without the CUDA context, which PyTorch does not count
    assert rows["peak reserved (torch)"]["predicted_gib"] == pytest.approx(40.8)
    assert rows["device memory in use (driver)"]["predicted_gib"] == 41.8
    assert rows["device memory in use (driver)"]["measured_gib"] == 43.0
    assert rows["host memory in use (node)"]["predicted_gib"] is None
    assert rows["peak reserved (torch)"]["ratio"] == pytest.approx(42.0 / 40.8)
    text = throughput.format_report(rep)
    assert "rank 0" in text and "rank 1" in text and "planner" in text and "0.97" in text
    assert "MFU" in text and "causal-discounted" in text and "tokens/s/GPU" in text
    assert "tokens/s/GPU" not in throughput.format_report(rep, per_step=False)  # no per-step table for a long run


def test_a_cpu_run_is_compared_on_its_resident_set(tmp_path):
    _rank_file(tmp_path, 0, [1.0], tokens=10, device="cpu")
    rep = throughput.report(tmp_path, SMALL, 128, _estimate("cpu"))
    assert rep["overall"]["mfu"] is None and "CPU" in rep["overall"]["mfu_note"]
    rows = {r["what"]: r for r in rep["memory_vs_plan"]}
    assert rows["peak RSS per process"]["ratio"] == pytest.approx(3.0 / 41.8)
    assert rows["peak RSS per process"]["predicted_gib"] == 41.8
    assert "MFU omitted (a CPU run" in throughput.format_report(rep)


def test_a_cpu_report_counts_per_process_and_omits_mfu_throughout(tmp_path):
    """On CPU a rank is a process, not a GPU; with no peak there is no MFU: no columns, no conventions line."""
    _rank_file(tmp_path, 0, [1.0, 1.0], tokens=100, device="cpu")
    _rank_file(tmp_path, 1, [1.0, 1.0], tokens=100, device="cpu")
    rep = throughput.report(tmp_path, SMALL, 128, _estimate("cpu"))
    text = throughput.format_report(rep)
    assert "per GPU" not in text and "tokens/s/GPU" not in text and "tokens/s/proc" in text and "MFU causal" not in text
    assert "(100.0 per process), MFU omitted (a CPU run has no GPU peak to compare with)" in text
    assert [line for line in text.splitlines() if "MFU" in line] == [
        line for line in text.splitlines() if "MFU omitted" in line]


def test_the_overall_line_prints_the_jobs_tokens_per_second_that_the_summary_holds(tmp_path):
    _rank_file(tmp_path, 0, [1.0, 1.0], tokens=1000)
    _rank_file(tmp_path, 1, [1.0, 1.0], tokens=1000)
    rep = throughput.report(tmp_path, SMALL, 128, _estimate())
    o = rep["overall"]
    assert o["tokens_per_s"] == pytest.approx(2 * o["tokens_per_s_per_gpu"]) == pytest.approx(2000.0)
    text = throughput.format_report(rep, per_step=False)
    assert "2000.0 tokens/s (1000.0 per GPU), MFU " in text and "torchtitan" in text


def test_an_unknown_gpu_gets_no_mfu_and_says_so(tmp_path):
    # a GPU of no row of the table (the RTX 4090 it named has one now)
    _rank_file(tmp_path, 0, [1.0, 1.0, 1.0], tokens=10, device="NVIDIA Some Future GPU")
    o = throughput.summarize(tmp_path, SMALL, 128)["overall"]
    assert o["mfu"] is None and o["mfu_causal"] is None and "not in the table of known GPU peaks" in o["mfu_note"]
    assert "not in the table" in throughput.format_report(throughput.summarize(tmp_path, SMALL, 128))


@pytest.mark.parametrize("start,threshold", [(640, 1000), (4096, 1000), (16, 100_000), (320, 10)])
def test_search_finds_the_longest_multiple_that_trains(start, threshold):
    trains = lambda n: (n <= threshold, "trains" if n <= threshold else "out of memory")  # noqa: E731
    longest, tries = throughput.search_longest(start, 16, trains, max_tries=40)
    assert longest == (threshold // 16 * 16 if threshold >= 16 else 0)
    assert all(n % 16 == 0 for n, _, _ in tries)


def test_search_stops_after_max_tries():
    longest, tries = throughput.search_longest(1024, 16, lambda n: (n <= 5000, ""), max_tries=4)
    assert len(tries) <= 4 and longest <= 5000


def test_bench_search_refuses_a_machine_without_gpus(capsys):
    rc = main(["bench", "ring-cp-8gpu", "--max-length", "auto"])
    err = capsys.readouterr().err
    assert rc == 2 and "it has none" in err and "python -m launch plan" in err


def test_the_callback_records_attention_backend_checkpointing_and_liger_from_the_run(tmp_path):
    """The rank records its setup from its resolved arguments and model, and the SDPA backend the dispatcher picks
    for the first attention call (on CPU: torch's CPU flash kernel for these shapes), asked once, then unhooked."""
    import torch

    class Attention(torch.nn.Module):
        config = SimpleNamespace(_attn_implementation="sdpa")

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 16)
            self.calls = 0

        def get_input_embeddings(self):
            return self.embed

        def forward(self, ids):
            x = self.embed(ids).view(ids.shape[0], 1, ids.shape[1], 16)
            self.calls += 1
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)

    model = Attention()
    args = SimpleNamespace(activation_checkpointing=True, activation_checkpointing_kwargs={"offload": True},
                           use_liger_kernel=False, activation_offloading=False)
    plain_run = measure.measure_callback(tmp_path / "plain", warmup=0, sync_every_step=False)
    plain_run.on_train_begin(args, SimpleNamespace(global_step=0, max_steps=2), None, model=model)
    # no probe outside --bench: the model's one pre-hook is the non-pad token count
    assert list(model._forward_pre_hooks.values()) == [plain_run._count_real]
    assert plain_run.setup["sdpa_backend"] is None
    plain_run.on_train_end(args, SimpleNamespace(global_step=0, max_steps=2), None)
    cb = measure.measure_callback(tmp_path, warmup=0, sync_every_step=True)  # --bench
    state = SimpleNamespace(global_step=0, max_steps=2)
    cb.on_train_begin(args, state, None, model=model)
    for _ in range(2):
        cb.on_step_begin(args, state, None)
        model(torch.zeros(2, 8, dtype=torch.long))
        state.global_step += 1
        cb.on_step_end(args, state, None)
    cb.on_train_end(args, state, None)
    setup = json.loads((tmp_path / "rank0.json").read_text())["setup"]
    assert setup == {"attn_implementation": "sdpa", "sdpa_backend": "FLASH_ATTENTION", "sdpa_device": "cpu",
                     "checkpointing": "on + offload", "checkpointing_by": "transformers", "liger": False,
                     "adapter": None}
    assert not model._forward_pre_hooks and not model._forward_hooks  # the probe is gone after the first forward
    plain = measure.run_setup(SimpleNamespace(gradient_checkpointing=False, use_liger_kernel=True), model)
    assert plain["checkpointing"] == "off" and plain["liger"] is True
    assert measure.run_setup(None, None)["checkpointing"] is None  # unknown, not "off"
    model.peft_config = {"default": SimpleNamespace(peft_type=SimpleNamespace(value="LORA"))}
    assert measure.run_setup(None, model)["adapter"] == "LORA"
