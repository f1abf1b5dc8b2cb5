"""The matmul roofline: timed for a span, not a count; the peak is a high quantile."""

from __future__ import annotations

import time

import pytest
import torch

from provrl.bench.roofline import PEAK_QUANTILE, matmul_rates, roofline


def test_calls_run_for_the_span_and_at_least_the_count():
    t = time.perf_counter()
    rates = matmul_rates(8, 16, 8, min_s=0.05, min_calls=7)
    assert time.perf_counter() - t >= 0.05
    assert len(rates) >= 7 and all(r > 0 for r in rates)


def test_a_slow_path_stops_at_max_s_after_one_call():
    rates = matmul_rates(64, 64, 64, dtype=torch.float64, min_s=10.0, min_calls=10**6, max_s=0.0)
    assert len(rates) == 1


def test_the_peak_is_the_quantile_and_not_below_the_median():
    r = roofline([float(x) for x in range(1, 11)])
    assert r == {"median": 5.5, "peak": pytest.approx(1 + 9 * PEAK_QUANTILE), "calls": 10}
    assert r["peak"] >= r["median"]


def test_the_cpu_clock_times_calls_too():
    assert all(r > 0 for r in matmul_rates(64, 64, 64, min_s=0.02, clock=time.process_time))
