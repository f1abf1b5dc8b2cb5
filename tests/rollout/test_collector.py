"""The rollout collector (one implementation for eval, probe and RL) and the admission rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from provrl.env.build import load_split
from provrl.env.config import EnvConfig
from provrl.pipeline.admission import group_lag, may_start, split_stale
from provrl.rollout.collector import Collector, group_key, traj_id
from provrl.rollout.setup import open_policy_env
from provrl.trajlog import TrajectoryWriter, read_all


@pytest.fixture(scope="module")
def env_cfg():
    cfg = EnvConfig()
    cfg.agent.max_new_tokens, cfg.agent.max_turns, cfg.agent.max_malformed = 12, 2, 2
    cfg.eval.concurrency = 6
    return cfg


def test_groups_are_complete_seeded_and_written(small_world, env_cfg, tmp_path):
    tasks = load_split(small_world, "train")[:3]
    log = tmp_path / "t.jsonl"
    with (
        open_policy_env("tiny", small_world, env_cfg) as (env, _),
        TrajectoryWriter(log) as w,
        Collector(env, concurrency=6, seed=3, writer=w) as col,
    ):
        groups = list(col.run(tasks, 4, round=2))
        stats = col.summary()
    assert sorted(g.task.task_id for g in groups) == sorted(t.task_id for t in tasks)
    for g in groups:
        assert [t.traj_id for t in g.trajectories] == [
            traj_id(g.task.task_id, 2, s) for s in range(4)
        ]
        assert {t.meta["group"] for t in g.trajectories} == {group_key(g.task.task_id, 2)}
    assert len(read_all(log)) == 12 and stats["episodes"] == 12
    assert 0 < stats["engine_busy_frac"] <= 1 and stats["mean_batch_occupancy"] > 1


def test_done_samples_are_reused_not_rerun(small_world, env_cfg, tmp_path):
    tasks = load_split(small_world, "train")[:2]
    with open_policy_env("tiny", small_world, env_cfg) as (env, _):
        with Collector(env, concurrency=4, seed=0) as col:
            first = {g.task.task_id: g for g in col.run(tasks, 3)}
        done = [first[tasks[0].task_id].trajectories[0], *first[tasks[1].task_id].trajectories]
        with Collector(env, concurrency=4, seed=0) as col:
            again = {g.task.task_id: g for g in col.run(tasks, 3, done=done)}
            stats = col.summary()
    assert stats["episodes"] == 2 and stats["episodes_reused"] == 4  # only the missing ones ran
    for t in tasks:  # same ids and seeds → the same samples
        for a, b in zip(first[t.task_id].trajectories, again[t.task_id].trajectories, strict=True):
            assert a.traj_id == b.traj_id
            assert (a.token_id == b.token_id).all()


def test_admission_refuses_starts(small_world, env_cfg):
    tasks = load_split(small_world, "train")[:1]
    allowed = {"n": 2}

    def admit() -> bool:
        if allowed["n"] > 0:
            allowed["n"] -= 1
            return True
        return False

    with (
        open_policy_env("tiny", small_world, env_cfg) as (env, _),
        Collector(env, concurrency=4, seed=0, admit=admit) as col,
    ):
        col.submit(tasks[0], 4)
        for _ in range(200):
            col.poll(0.05)
            if col.in_flight == 0:
                break
        assert col.queued == 2 and col.stats.episodes == 2 and col.stats.episodes_refused


@dataclass
class _G:
    v: int

    def min_version(self) -> int:
        return self.v


def test_admission_rule_and_lag_split():
    # (1 + L) · G groups outstanding at most
    assert may_start(7, groups_per_step=4, max_lag=1) and not may_start(8, 4, 1)
    assert may_start(3, 4, 0) and not may_start(4, 4, 0)
    assert group_lag(_G(3), 5) == 2
    fresh, stale = split_stale([_G(5), _G(4), _G(2)], trainer_version=5, max_lag=1)
    assert [g.v for g in fresh] == [5, 4] and [g.v for g in stale] == [2]


def test_a_run_of_failed_tool_calls_stops_the_collector_in_one_line():
    """More than search.max_tool_error_rate of the last calls failed (judged from 20 calls):
    one SearchError line, not a stage scored or trained on error observations."""
    from types import SimpleNamespace

    from provrl.env.search import SearchError
    from provrl.provenance import ToolCall

    def traj(ok: bool) -> SimpleNamespace:
        return SimpleNamespace(tool_calls=[ToolCall(0, "search", "q", ok, None if ok else "down")])

    env = SimpleNamespace(search=SimpleNamespace(max_tool_error_rate=0.5))
    col = Collector(env, concurrency=1, seed=0)  # type: ignore[arg-type]
    for _ in range(10):  # 10 of 20 failed: not more than half
        col._count_tool_failures(traj(True))
        col._count_tool_failures(traj(False))
    with pytest.raises(
        SearchError, match=r"11 of the last 21 search/open calls failed .*last: down"
    ):
        col._count_tool_failures(traj(False))
    assert col.summary()["tool_errors"] == 11
    never = Collector(SimpleNamespace(search=SimpleNamespace(max_tool_error_rate=1.0)), concurrency=1, seed=0)  # type: ignore[arg-type]  # fmt: skip
    for _ in range(60):
        never._count_tool_failures(traj(False))
    col.close()
    never.close()
