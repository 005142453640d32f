"""benchmarks/bench_overhead.py compares each pair's own ratio: the machine's load drifts between pairs, not within
one, so unpaired medians of the two columns can show an overhead no pair has."""

import importlib.util

from launch import REPO_ROOT

spec = importlib.util.spec_from_file_location("bench_overhead", REPO_ROOT / "benchmarks" / "bench_overhead.py")
bench_overhead = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_overhead)


def test_paired_ratios_cancel_a_drift_between_pairs():
    plain = [10.0, 20.0, 40.0]  # the machine got busier between pairs
    bench = [10.5, 21.0, 42.0]  # every pair: +5%
    assert [round(r, 6) for r in bench_overhead.paired_ratios(plain, bench)] == [1.05, 1.05, 1.05]
    # pairs in a different order within each column: the unpaired medians would move, the paired ratios cannot
    assert sorted(bench_overhead.paired_ratios([40.0, 10.0, 20.0], [42.0, 10.5, 21.0])) == [1.05] * 3
