"""--bench: the MFU convention on a hand-computed case, the GPU peak table, how the ranks' measurements combine, the
longest-length search, and `bench --max-length auto` refusing a machine without GPUs. A CPU smoke run's --bench
figures in run_summary.json are checked in tests/test_smoke_recipes.py."""

from __future__ import annotations

import json

import pytest

from launch import bench
from launch.__main__ import main
from launch.memory import Architecture


def test_mfu_on_a_hand_computed_case():
    # 6 N + 12 L H d S with N = 1000, L = 2, H = 4, d = 8, S = 16: 6,000 + 12 x 2 x 4 x 8 x 16 = 6,000 + 12,288
    assert bench.flops_per_token(1000, 2, 4, 8, 16) == 18_288
    # 1e6 tokens/s per GPU x 18,288 FLOPs per token against a 1e12 FLOP/s peak
    assert bench.mfu(1e6, 18_288, 1e12) == pytest.approx(0.018288)
    assert bench.mfu(1e6, 18_288, None) is None


def test_mfu_of_llama_8b_matches_torchtitans_convention():
    """torchtitan counts N without the input embedding table; for Llama-3.1-8B at 8K that is 6 x 7.50e9 + 12 x 32 x
    32 x 128 x 8192 = 4.50e10 + 1.29e10 FLOPs per token."""
    arch = Architecture(hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
    n = arch.num_params - arch.vocab_size * arch.hidden_size
    assert arch.matmul_params == n
    assert 7.4e9 < n < 7.6e9
    fpt = bench.flops_per_token(arch.matmul_params, 32, 32, 128, 8192)
    assert fpt == 6 * n + 12 * 32 * 32 * 128 * 8192


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10G", 70e12),
    ("NVIDIA GeForce RTX 4090", None), ("cpu", None),
])
def test_gpu_peak_table(name, peak):
    assert bench.gpu_peak_flops(name) == peak


def _rank_file(folder, rank, times, tokens, device="NVIDIA H100 80GB HBM3", reserved=40.0):
    steps = [{"step": i + 1, "time_s": t, "tokens": tokens, "max_allocated_gib": reserved - 2,
              "max_reserved_gib": reserved, "peak_rss_gib": 3.0, "host_used_gib": 100.0}
             for i, t in enumerate(times)]
    (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "warmup": 2, "device": device,
                                                         "steps": steps}))


def test_summary_excludes_warmup_takes_the_slowest_rank_and_computes_mfu(tmp_path):
    _rank_file(tmp_path, 0, [9.0, 5.0, 1.0, 1.0], tokens=1000)
    _rank_file(tmp_path, 1, [9.0, 5.0, 2.0, 1.0], tokens=1000, reserved=42.0)
    arch = Architecture(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=128, vocab_size=64, tie_word_embeddings=False)
    summary = bench.summarize(tmp_path, arch, seq_len=128)
    o = summary["overall"]
    assert o["measured_steps"] == 2 and o["warmup_steps"] == 2
    assert [s["time_s"] for s in summary["per_step"]] == [2.0, 1.0]  # the step ends with its slowest rank
    assert o["tokens_per_s_per_gpu"] == pytest.approx(2000 / 3.0)  # 2 steps x 1000 tokens per GPU in 3 s
    fpt = bench.flops_per_token(arch.matmul_params, 2, 4, 16, 128)
    assert o["mfu"] == pytest.approx(2000 / 3.0 * fpt / 989e12)
    assert o["peak_reserved_gib"] == 42.0 and "torchtitan" in o["mfu_convention"]
    comparison = bench.compare_with_plan(o, {"gpu_peak_gib": 46.2}, o["device"])
    assert comparison["relative_error"] == pytest.approx((46.2 - 42.0) / 42.0)


def test_an_unknown_gpu_gets_no_mfu_and_says_so(tmp_path):
    _rank_file(tmp_path, 0, [1.0, 1.0, 1.0], tokens=10, device="NVIDIA GeForce RTX 4090")
    o = bench.summarize(tmp_path, None, None)["overall"]
    assert o["mfu"] is None and "not in the table of known GPU peaks" in o["mfu_note"]


@pytest.mark.parametrize("start,threshold", [(640, 1000), (4096, 1000), (16, 100_000), (320, 10)])
def test_search_finds_the_longest_multiple_that_trains(start, threshold):
    trains = lambda n: (n <= threshold, "trains" if n <= threshold else "out of memory")  # noqa: E731
    longest, tries = bench.search_longest(start, 16, trains, max_tries=40)
    assert longest == (threshold // 16 * 16 if threshold >= 16 else 0)
    assert all(n % 16 == 0 for n, _, _ in tries)


def test_search_stops_after_max_tries():
    longest, tries = bench.search_longest(1024, 16, lambda n: (n <= 5000, ""), max_tries=4)
    assert len(tries) <= 4 and longest <= 5000


def test_bench_search_refuses_a_machine_without_gpus(capsys):
    rc = main(["bench", "ring-cp-8gpu", "--max-length", "auto"])
    err = capsys.readouterr().err
    assert rc == 2 and "it has none" in err and "python -m launch plan" in err
