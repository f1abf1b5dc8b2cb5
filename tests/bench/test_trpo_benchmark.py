"""benchmarks/trpo_vs_sb3.py (provrl/bench/trpo_vs_sb3.py): target_met and the refusal of
tuning seeds (no training)."""

from __future__ import annotations

import importlib

import pytest

from provrl.config import ConfigError


def load_bench():
    return importlib.import_module("provrl.bench.trpo_vs_sb3")


def test_target_needs_ten_seeds_the_interval_above_the_peer_mean_and_half_the_time():
    bench = load_bench()
    p = [-150.0 + d for d in (-3, 2, -1, 4, 0, 1, -2, 3, -4, 0)]
    s = [-175.0 + 20 * d for d in (-3, 2, -1, 4, 0, 1, -2, 3, -4, 0)]
    fast, slow = [5.0] * 10, [20.0] * 10
    row = bench.compare(p, s, fast, slow)
    assert row["target_met"] and row["provrl_ci"][0] >= row["sb3_return"]
    assert row["provrl_returns"] == p and row["time_ratio"] == 0.25
    assert row["diff_ci"][0] < row["diff_return"] < row["diff_ci"][1]
    assert not bench.compare(p[:9], s[:9], fast[:9], slow[:9])["target_met"]  # 9 seeds
    assert not bench.compare(p, s, [11.0] * 10, slow)["target_met"]  # ratio 0.55
    wide = [-150.0 + 40 * d for d in (-3, 2, -1, 4, 0, 1, -2, 3, -4, 0)]
    row = bench.compare(wide, s, fast, slow)
    assert row["provrl_return"] > row["sb3_return"] and not row["target_met"]  # CI dips below
    one = bench.compare([-150.0], [-160.0], [5.0], [20.0])
    assert one["provrl_ci"] is None and not one["target_met"]


def test_benchmark_refuses_tuning_seeds_before_training():
    bench = load_bench()
    with pytest.raises(ConfigError, match="tuning seeds"):
        bench.run_benchmark(["Pendulum-v1"], steps=10, seeds=10, first_seed=35, verbose=False)
    with pytest.raises(ValueError, match="eval-episodes"):
        bench.run_benchmark(["Pendulum-v1"], steps=10, seeds=1, eval_episodes=101)
