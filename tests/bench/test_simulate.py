"""The async / sync simulator (provrl.bench.simulate) against cases computed on paper."""

from __future__ import annotations

import json

import numpy as np
import pytest

from provrl.bench.results import check_record
from provrl.bench.simulate import Workload, episode_draw, latency_sampler, simulate
from provrl.env.config import LatencyConfig


def constant(seconds: float):
    return lambda rng, n: np.full(n, seconds)


# Two episodes, one replica, two steps; each episode: 8 tokens, a 1 s tool call, 8 tokens.
# Engine steps 1/8 s whatever the batch, trainer 7/16 s, weight load 1/4 s (binary fractions:
# every time below is exact).
HAND = Workload(concurrency=2, batch=2, replicas=1, steps=2, tool_calls=(1, 1),
                tokens_per_turn=(8, 8), latency=constant(1.0), step_s=0.125, row_s=0.0,
                train_fixed_s=0.4375, train_per_traj_s=0.0, load_s=0.25)  # fmt: skip


def test_sync_by_hand():
    """Per step: 8 steps (1 s), the tool (1 s), 8 steps (1 s): both episodes end at 3 s;
    train 0.4375 s, drain-load 0.25 s: 3.6875 s a step, 7.375 s for two."""
    out = simulate(HAND, "sync")
    assert out.wall_s == 7.375 and out.trained == 4 and out.lag_hist == [4, 0]
    assert out.loaded_at == [3.6875, 7.375]
    assert out.trainer_busy_frac == 2 * 0.4375 / 7.375
    assert out.engine_busy_frac == 2 * 16 * 0.125 / 7.375


def test_async_by_hand():
    """Episodes 1-2 end at 3 s; the trainer takes them (3 → 3.4375 s) while episodes 3-4
    start at 3 s (outstanding 4 < (1 + 1) · 2 before, the concurrency 2 allows them). The
    load waits for the step boundary at 3.5 s (4 tokens done), pauses to 3.75 s; 4 more
    tokens → 4.25 s, tool → 5.25 s, 8 tokens → 6.25 s. Episodes 5-6 start then; the trainer
    runs 6.25 → 6.6875 s, the load waits for the boundary at 6.75 s: 7.0 s."""
    out = simulate(HAND, "async")
    assert out.wall_s == 7.0 and out.trained == 4 and out.loaded_at == [3.75, 7.0]
    assert out.lag_hist == [2, 2]  # episodes 3-4 started under version 0, trained by step 2
    assert out.episode_s_mean == (3 + 3 + 3.25 + 3.25) / 4  # 3-4 lost the 0.25 s pause


def test_sync_is_the_slowest_episode_plus_train_and_load_each_step():
    """One replica per episode and a step time that does not depend on the batch: each
    episode lasts exactly Σ n_j · step_s + Σ L_j, so a strict on-policy step lasts its
    slowest episode + train + load — computed here from the episodes' own draws."""
    lat = latency_sampler(LatencyConfig(preset="web-ai"))
    w = Workload(concurrency=4, batch=4, replicas=4, steps=3, tool_calls=(0, 12),
                 tokens_per_turn=(16, 64), latency=lat, step_s=0.01, row_s=0.0,
                 train_fixed_s=2.0, train_per_traj_s=0.5, load_s=1.0, seed=7)  # fmt: skip
    expected = 0.0
    for s in range(w.steps):
        durations = []
        for i in range(s * w.batch, (s + 1) * w.batch):
            tokens, latencies = episode_draw(w, i)
            durations.append(sum(tokens) * w.step_s + sum(latencies))
        expected += max(durations) + w.train_fixed_s + w.train_per_traj_s * w.batch + w.load_s
    assert simulate(w, "sync").wall_s == pytest.approx(expected, rel=1e-9)
    # async trains the same number of trajectories, overlapping the stragglers
    a = simulate(w, "async")
    assert a.trained == 12 and a.wall_s < expected


@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_async_never_trains_beyond_the_lag_bound(max_lag):
    """Every trained episode's lag u − v is ≤ max_lag (the histogram counts 0 … max_lag);
    max_lag 0 admits a batch only after the last one's weights are loaded: nothing stale."""
    w = Workload(concurrency=16, batch=4, replicas=2, steps=5, tool_calls=(0, 10),
                 tokens_per_turn=(4, 64), latency=latency_sampler(LatencyConfig(preset="web-serp")),
                 step_s=0.01, row_s=0.001, train_fixed_s=3.0, train_per_traj_s=0.1, load_s=0.5,
                 max_lag=max_lag, seed=11)  # fmt: skip
    out = simulate(w, "async")
    assert out.trained == 20 and sum(out.lag_hist) == 20
    if max_lag == 0:
        assert out.dropped_stale == 0


def test_runs_are_deterministic_and_contention_slows_only_overlap():
    w = Workload(concurrency=8, batch=8, replicas=2, steps=2, tool_calls=(1, 6),
                 tokens_per_turn=(8, 32), latency=latency_sampler(LatencyConfig(preset="web-serp")),
                 step_s=0.02, row_s=0.001, train_fixed_s=5.0, train_per_traj_s=0.1, load_s=1.0)  # fmt: skip
    assert simulate(w, "async") == simulate(w, "async")
    slow = Workload(**{**w.__dict__, "contention": 2.0})
    assert simulate(slow, "sync") == simulate(w, "sync")  # sync never generates while training
    assert simulate(slow, "async").wall_s > simulate(w, "async").wall_s


def test_bench_simulate_writes_a_complete_record(tmp_path):
    from typer.testing import CliRunner

    from provrl.cli import app

    out, png = tmp_path / "simulate.json", tmp_path / "simulate.png"
    args = ["bench", "simulate", "--concurrency", "2,4", "--replicas", "1,2", "--seeds", "2",
            "--steps", "2", "--tool-calls", "1,3", "--out", str(out), "--plot", str(png),
            "--set", "bench.simulate.latency.preset=web-fast", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())
    assert check_record("simulate.json", rec) == [] and rec["benchmark"] == "simulate"
    point = rec["points"]["N2"]["E4"]
    assert len(point["wall_ratio_all"]) == 2 and point["batch"] == 4
    assert point["wall_ratio_async_over_sync"] == pytest.approx(
        np.median(
            [
                a / s
                for a, s in zip(
                    point["async"]["wall_s_all"], point["sync"]["wall_s_all"], strict=True
                )
            ]
        )
    )
    assert rec["config"]["latency"]["median_s"] == 0.246  # the preset's fitted median
    assert rec["latency"]["p50"] == pytest.approx(0.25, rel=5e-3)
    assert rec["presets"]["web-serp"]["p95"] == pytest.approx(3.5, rel=5e-3)
    assert png.stat().st_size > 0
