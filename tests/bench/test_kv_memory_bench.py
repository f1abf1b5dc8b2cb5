"""The KV-memory benchmark (provrl/bench/kv_memory.py) on the tiny model: every arm runs in
their own processes, and its summary figures follow the raw values it reports."""

from __future__ import annotations

import statistics

import pytest

from provrl.bench import kv_memory as bench


def test_every_arm_replays_and_the_savings_follow_the_raw_values():
    r = bench.run_kv_memory_benchmark(
        repeats=1, episodes=6, threads=1, dtype="float32", model="tiny"
    )
    for arm in bench.ARMS:
        (run,) = r["runs"][arm]
        assert run["episodes"] == 6 and run["processed_tokens_per_s"] > 0
        assert run["rss_peak_mb"] >= run["rss_start_mb"] > 0
        assert run["kv_growth_mb"] == pytest.approx(run["rss_peak_mb"] - run["rss_start_mb"])
    med = {a: statistics.median(x["kv_growth_mb"] for x in r["runs"][a]) for a in bench.ARMS}
    assert r["kv_growth_saved_mb"] == pytest.approx(med["keep"] - med["release"])
    assert r["kv_growth_saved_vs_huge_mb"] == pytest.approx(med["huge"] - med["release"])
    speed = {a: r["runs"][a][0]["processed_tokens_per_s"] for a in bench.ARMS}
    assert r["ratio_speed_release_over_keep"] == pytest.approx(speed["release"] / speed["keep"])
    assert r["ratio_speed_release_over_huge"] == pytest.approx(speed["release"] / speed["huge"])
    assert r["kv_allocated_mb"] > 0 and r["dtype"] == "float32"
