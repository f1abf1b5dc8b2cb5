"""The two orchestrations of :class:`provrl.pipeline.rl_loop.RLLoop`, each driven on its own
on the tiny model (no warm start, probe or eval around them)."""

from __future__ import annotations

from typing import Any

import pytest

from provrl.config import load_config
from provrl.env.build import load_split
from provrl.pipeline.rl_loop import RLLoop, read_steps
from provrl.pipeline.rundir import RunDir
from provrl.run_config import RunConfig


def _loop(tmp_path, small_world, mode: str) -> RLLoop:
    sets = [f"pipeline.loop.mode={mode}", "pipeline.loop.steps=2", f"logging.run_dir={tmp_path}"]
    cfg = load_config(RunConfig, "quick", sets)
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:6]
    return RLLoop(cfg, RunDir(tmp_path), small_world, tasks, "tiny", progress=False)


def _two_steps(tmp_path, small_world, mode: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run only ``mode``'s loop (run_sync or run_async) for two steps: the summary and the
    step records."""
    loop = _loop(tmp_path, small_world, mode)
    with loop:
        loop.run_sync() if mode == "sync" else loop.run_async()
    summary = loop.finish()
    assert summary["mode"] == mode and summary["steps"] == 2 and summary["final_version"] == 2
    return summary, read_steps(tmp_path)


def test_run_sync_trains_only_on_tokens_of_the_version_being_updated(tmp_path, small_world):
    summary, steps = _two_steps(tmp_path, small_world, "sync")
    assert [s["version"] for s in steps] == [1, 2]
    assert all(s["max_lag"] == 0 for s in steps)  # strict on-policy
    assert summary["groups_dropped_stale"] == 0


def test_run_async_hot_loads_and_keeps_the_lag_bound(tmp_path, small_world):
    summary, steps = _two_steps(tmp_path, small_world, "async")
    assert summary["engine"]["hotloads"] >= 2  # each version loaded into the running engine
    lag = load_config(RunConfig, "quick").pipeline.loop.max_lag
    assert all(s["max_lag"] <= lag for s in steps)


def test_a_loop_runs_only_inside_its_with_block(tmp_path, small_world):
    loop = _loop(tmp_path, small_world, "sync")
    try:
        with pytest.raises(RuntimeError, match="enter the loop"):
            loop.run_sync()
    finally:
        loop.finish()
