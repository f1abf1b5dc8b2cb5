"""Strict on-policy as the seed describes it, read from the engine's counters: at every step
the sync RL loop drains (admission stopped, in-flight turns finished), resets the caches and
waits until every replica holds the new version — in-process and on Ray replicas."""

from __future__ import annotations

from typing import Any

import pytest

from provrl.config import load_config
from provrl.env.build import load_split
from provrl.pipeline.rl_loop import RLLoop
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import read_steps
from provrl.run_config import RunConfig

STEPS = 2


def _sync(tmp_path, small_world, extra: list[str]) -> tuple[RLLoop, dict[str, float]]:
    """Run the sync loop for STEPS steps; the loop and its engine's counters (read before
    the engine closes)."""
    sets = ["pipeline.loop.mode=sync", f"pipeline.loop.steps={STEPS}",
            f"logging.run_dir={tmp_path}", *extra]  # fmt: skip
    cfg = load_config(RunConfig, "quick", sets)
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:6]
    loop = RLLoop.open(cfg, RunDir(tmp_path), small_world, tasks, "tiny", progress=False)
    try:
        with loop:
            loop.run_sync()
        stats = loop.engine.stats()
    finally:
        summary: dict[str, Any] = loop.finish()
    assert summary["steps"] == STEPS and summary["final_version"] == STEPS
    assert [s["max_lag"] for s in read_steps(tmp_path)] == [0] * STEPS
    return loop, stats


def _drained_every_step(c: dict[str, float], prefix: str = "") -> None:
    """One replica's counters (``prefix``: ``r{i}/`` in a fleet's stats): every weight load
    was a drain that reset the caches, one per step, and it ends at the last version."""
    assert c[f"{prefix}hotloads"] == STEPS, "a step's weights were not loaded (or loaded twice)"
    assert c[f"{prefix}drains"] == STEPS, "a step loaded its weights without draining"
    assert c[f"{prefix}cache_resets"] == STEPS, "a drain left old KV in the caches"
    assert c[f"{prefix}drain_wait_s"] >= 0
    assert c[f"{prefix}version"] == STEPS


def test_sync_drains_and_resets_the_in_process_engine_at_every_step(tmp_path, small_world):
    _, c = _sync(tmp_path, small_world, [])
    _drained_every_step(c)
    assert c["slots_used"] == 0 and c["active"] == 0  # nothing in flight, no KV kept


def test_sync_drains_every_ray_replica_and_waits_for_all_of_them(tmp_path, small_world):
    pytest.importorskip("ray")
    ray = ["backend=ray", "ray.replicas=2", "ray.num_cpus=2", "ray.object_store_mb=256"]
    loop, c = _sync(tmp_path, small_world, ray)
    assert c["replicas"] == 2
    for i in range(2):
        _drained_every_step(c, f"r{i}/")
    # the last load returned only once both replicas had swapped, each by a drain
    reports = loop.engine.last_reports  # type: ignore[attr-defined]
    assert [(r.mode, r.new_version) for r in reports] == [("drain", STEPS)] * 2
    assert c["drains"] == c["cache_resets"] == 2 * STEPS  # the fleet's sums
