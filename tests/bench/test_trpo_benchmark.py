"""benchmarks/trpo_vs_sb3.py (provrl/bench/trpo_vs_sb3.py): target_met and the refusal of
tuning seeds (no training)."""

from __future__ import annotations

import importlib

import pytest

from provrl.config import ConfigError


def load_bench():
    return importlib.import_module("provrl.bench.trpo_vs_sb3")


SPREAD = (-3, 2, -1, 4, 0, 1, -2, 3, -4, 0)


def test_target_needs_ten_fresh_seeds_a_paired_difference_above_zero_and_half_the_time():
    bench = load_bench()
    p = [-150.0 + d for d in SPREAD]
    s = [x - 25.0 + 3 * d for x, d in zip(p, reversed(SPREAD), strict=True)]
    fast, slow = [5.0] * 10, [20.0] * 10
    row = bench.compare(p, s, fast, slow)
    assert row["verdict"] == "ahead" and row["diff_ci"][0] > 0 and row["target_met"]
    assert row["provrl_returns"] == p and row["time_ratio"] == 0.25
    assert row["diff_ci"][0] < row["diff_return"] < row["diff_ci"][1]
    assert not bench.compare(p[:9], s[:9], fast[:9], slow[:9])["target_met"]  # 9 seeds
    assert not bench.compare(p, s, [11.0] * 10, slow)["target_met"]  # ratio 0.55
    assert not bench.compare(p, s, fast, slow, fresh=False)["target_met"]  # seeds looked at
    one = bench.compare([-150.0], [-160.0], [5.0], [20.0])
    assert one["provrl_ci"] is None and one["verdict"] == "at par" and not one["target_met"]


def test_an_interval_above_the_peers_mean_is_not_ahead_when_the_paired_difference_spans_zero():
    """The Pendulum case of issue 27: provrl's interval lies above sb3's mean, but seed by
    seed the two are not apart — the old criterion said "ahead", the paired one "at par"."""
    bench = load_bench()
    p = [-165.0 + d for d in SPREAD]  # tight
    s = [-178.6 + 30 * d for d in reversed(SPREAD)]  # wide, and not paired with p's
    row = bench.compare(p, s, [5.0] * 10, [20.0] * 10)
    assert row["provrl_ci"][0] > row["sb3_return"]  # what the old target looked at
    assert row["diff_ci"][0] < 0 < row["diff_ci"][1]
    assert row["verdict"] == "at par" and not row["target_met"]
    behind = bench.compare(s, p, [5.0] * 10, [20.0] * 10)
    assert behind["verdict"] in ("at par", "behind")
    assert bench.verdict([-3.0, -1.0]) == "behind" and bench.verdict([0.5, 2.0]) == "ahead"
    assert bench.verdict([0.0, 2.0]) == "at par"


def test_a_return_cap_is_counted():
    bench = load_bench()
    row = bench.compare([500.0] * 10, [500.0] * 8 + [415.0, 420.0], [5.0] * 10, [20.0] * 10,
                        cap=500.0)  # fmt: skip
    assert row["provrl_seeds_at_cap"] == 10 and row["sb3_seeds_at_cap"] == 8
    assert row["provrl_ci"] == [500.0, 500.0]  # degenerate: the cap, not a spread


def test_fresh_seeds_are_neither_tuned_on_nor_seen():
    from provrl.classic.config import fresh_seeds

    assert fresh_seeds("Pendulum-v1", range(101, 111))
    assert not fresh_seeds("Pendulum-v1", [41])  # motivated bounded_mean: a tuning seed
    assert not fresh_seeds("CartPole-v1", range(45, 55))  # 45-50 were reported
    assert bench_default_first_seed() == 101


def bench_default_first_seed() -> int:
    import inspect

    return inspect.signature(load_bench().run_benchmark).parameters["first_seed"].default


def test_benchmark_refuses_tuning_seeds_before_training():
    bench = load_bench()
    with pytest.raises(ConfigError, match="tuning seeds"):
        bench.run_benchmark(["Pendulum-v1"], steps=10, seeds=10, first_seed=35, verbose=False)
    with pytest.raises(ValueError, match="eval-episodes"):
        bench.run_benchmark(["Pendulum-v1"], steps=10, seeds=1, eval_episodes=101)
