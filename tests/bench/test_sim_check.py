"""provrl.bench.sim_check: the simulator's prediction at a measured async / sync point, on a
hand-made async_vs_sync JSON whose one-step run is derived on paper."""

from __future__ import annotations

import json

import pytest

from provrl.bench.sim_check import check_against_simulator, workload_from_measured
from provrl.bench.simulate import simulate


def measured(steps: int = 1, concurrency: int = 1, batch: int = 1) -> dict:
    """One mode's measured block: every episode is 2 tokens, a 1.0 s search, 3 tokens."""
    return {
        "concurrency": concurrency,
        "batch": batch,
        "steps": steps,
        "max_lag": 1,
        "replicas": 1,
        "wall_s": [10.0],
        "trainer_step_s": [1.0, 1.5, 2.0],  # median 1.5
        "save_s": [0.5],
        "load_s": [0.25, 0.25],
        "engine_step_s": 0.5,
        "turn_tokens": [[2, 3]],
        "waits": [[1.0]],
        "tool_latency_s": [1.0],
        "episode_s": [3.5],
    }


def test_one_step_by_hand(tmp_path):
    """Sync: the episode takes 2 · 0.5 + 1.0 + 3 · 0.5 = 3.5 s, then train 1.5 + save 0.5,
    then load 0.25: 5.75 s. Async with one step is the same step (the second episode it
    starts at 3.5 s overlaps the training and is never trained): 5.75 s. Ratio 1."""
    data = {"wall_ratio_async_over_sync": 0.9, "measured": {"sync": measured(), "async": measured()}}  # fmt: skip
    path = tmp_path / "avs.json"
    path.write_text(json.dumps(data))
    r = check_against_simulator(path, seeds=2)
    assert r["modes"]["sync"]["predicted_wall_s"] == 5.75
    assert r["modes"]["async"]["predicted_wall_s"] == 5.75
    assert r["predicted_ratio"] == 1.0
    assert r["relative_error"] == pytest.approx(0.1 / 0.9) and r["within"]
    data["wall_ratio_async_over_sync"] = 0.8  # 25 % off
    assert not check_against_simulator(data, seeds=1)["within"]


def test_the_workload_is_the_measured_one():
    m = measured(steps=3, concurrency=4, batch=2)
    eps = (((2, 3), (1.0,)), ((4,), ()))
    w = workload_from_measured(m, eps, seed=1)
    assert (w.concurrency, w.batch, w.steps, w.max_lag) == (4, 2, 3, 1)
    assert (w.step_s, w.row_s, w.train_fixed_s, w.load_s) == (0.5, 0.0, 2.0, 0.25)
    assert w.episodes == eps
    r = check_against_simulator(
        {"wall_ratio_async_over_sync": 0.5, "measured": {"sync": m, "async": m}}, seeds=1
    )
    expect = simulate(workload_from_measured(m, (((2, 3), (1.0,)),)), "async").wall_s
    assert r["modes"]["async"]["predicted_wall_s"] == expect
    assert r["predicted_ratio"] < 1.0  # three steps: async overlaps training with rollouts


def test_no_episodes_is_named():
    m = measured() | {"turn_tokens": [], "waits": []}
    with pytest.raises(ValueError, match="no episodes"):
        check_against_simulator({"wall_ratio_async_over_sync": 1, "measured": {"sync": m, "async": m}})  # fmt: skip
