"""``provrl bench dev``'s summary of a run directory: the teacher's calls per tier, RL vs warm
start on dev, and the per-step shares, computed from the run's own files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from provrl.bench.dev import plan_split, rl_summary, summarize_run, teacher_calls, tier_blocks
from provrl.provenance import TrajectoryBuilder
from provrl.trajlog import TrajectoryWriter


def _traj(tid: str, task: str, version: int = 0, meta: dict | None = None, **metrics: float):
    b = TrajectoryBuilder(tid, task)
    b.add_prompt([1, 2, 3])
    b.add_actions([4, 5], logprob=[-0.1, -0.2], kept_mass=[1.0, 1.0], version=[version] * 2,
                  kv_min=[version] * 2, kv_max=[version] * 2, replica=0)  # fmt: skip
    t = b.build()
    t.meta.update(meta or {})
    t.metrics.update(metrics)
    t.reward = float(metrics.get("exact_match", 0.0))
    return t


def _write(path, trajs):
    path.parent.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(path) as w:
        for t in trajs:
            w.write(t)


def test_teacher_calls_per_tier(tmp_path):
    f = tmp_path / "teacher.jsonl"
    _write(f, [
        _traj("a", "t1", tier=1, num_tool_calls=2, min_searches=1, exact_match=1),
        _traj("b", "t2", tier=1, num_tool_calls=4, min_searches=1, exact_match=1),
        _traj("c", "t3", tier=2, num_tool_calls=3, min_searches=2, exact_match=0),
    ])  # fmt: skip
    s = teacher_calls(f)
    assert s["1"]["traces"] == 2 and s["1"]["tool_calls_mean"] == 3.0
    assert s["1"]["calls_over_min"] == 3.0 and s["1"]["tool_calls_max"] == 4.0
    assert s["2"]["calls_over_min"] == 1.5 and s["2"]["correct_frac"] == 0.0


def _steps(rl_dir, recs):
    rl_dir.mkdir(parents=True, exist_ok=True)
    (rl_dir / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_rl_summary_counts_trained_trajectories_not_steps(tmp_path):
    _steps(tmp_path / "rl", [
        {"step": 1, "trained": ["a", "b", "c", "d"], "mixed_version_trajectories": 0,
         "finished_groups": 3, "zero_signal_groups": 2, "distinct_share": 0.5},
        {"step": 2, "trained": ["e", "f"], "mixed_version_trajectories": 2,
         "finished_groups": 1, "zero_signal_groups": 0, "distinct_share": 1.0},
    ])  # fmt: skip
    s = rl_summary(tmp_path / "rl")
    assert s["steps"] == 2 and s["trained_trajectories"] == 6
    assert s["mixed_version_frac"] == pytest.approx(2 / 6)
    assert s["steps_with_mixed"] == 1
    assert s["zero_signal_share"] == pytest.approx(2 / 4)
    assert s["distinct_share_mean"] == pytest.approx(0.75)
    assert math.isnan(s["kv_stale_share_mean"])
    assert [r["step"] for r in s["per_step"]] == [1, 2]
    assert s["time"] == {}  # no rl/done.json yet
    (tmp_path / "rl" / "done.json").write_text(json.dumps({
        "wall_s": 100.0, "trainer_busy_s": 60.0, "trainer_idle_frac": 0.4, "session_wall_s": 40.0,
        "engine_busy_frac": 0.55, "threads": {"engine": 1, "trainer": 1, "lent": 0},
        "collector": {"tokens_per_s": 24.8, "mean_batch_occupancy": 19.9}}))  # fmt: skip
    t = rl_summary(tmp_path / "rl")["time"]
    assert t["trainer_idle_frac"] == 0.4 and t["engine_busy_frac"] == 0.55
    assert t["generated_tokens_per_s"] == 24.8 and t["threads"]["engine"] == 1


def test_summarize_run_pairs_the_two_policies_on_the_same_tasks(tmp_path):
    _write(
        tmp_path / "warmstart" / "teacher.jsonl",
        [_traj("x", "w1", tier=1, num_tool_calls=2, min_searches=1, exact_match=1)],
    )
    _write(
        tmp_path / "eval" / "warmstart" / "trajectories.jsonl",
        [
            _traj("w-a", "d1", tier=1, exact_match=1, num_tool_calls=4),
            _traj("w-b", "d2", tier=2, exact_match=0, num_tool_calls=6),
        ],
    )
    _write(tmp_path / "eval" / "rl" / "trajectories.jsonl", [
        _traj("r-a", "d1", tier=1, exact_match=1, num_tool_calls=2),
        _traj("r-b", "d2", tier=2, exact_match=1, num_tool_calls=3),
    ])  # fmt: skip
    _steps(tmp_path / "rl", [{"step": 1, "trained": ["a"], "mixed_version_trajectories": 1}])
    s = summarize_run(tmp_path)
    assert s["eval"]["accuracy_gain_points"] == pytest.approx(50.0)
    assert s["eval"]["per_tier"]["2"]["gain_points"] == pytest.approx(100.0)
    assert s["eval"]["warmstart_tool_calls_solved"] == 4.0
    assert s["eval"]["rl_tool_calls_solved"] == 2.5
    assert s["eval"]["tool_calls_solved_cut_frac"] == pytest.approx(1 - 2.5 / 4)
    assert s["eval"]["per_tier"]["1"]["warmstart_tool_calls_solved_hist"] == {"4": 1}
    assert s["eval"]["per_tier"]["2"]["rl_tool_calls_solved_hist"] == {"3": 1}
    assert s["rl"]["mixed_version_frac"] == 1.0
    assert s["teacher"]["1"]["calls_over_min"] == 2.0


def test_version_eval_pairs_an_intermediate_checkpoint_with_the_warm_start(tmp_path):
    from provrl.bench.dev import version_eval

    _write(tmp_path / "eval" / "warmstart" / "trajectories.jsonl", [
        _traj("w-a", "d1", tier=1, exact_match=0, num_tool_calls=4),
        _traj("w-b", "d2", tier=2, exact_match=1, num_tool_calls=6),
    ])  # fmt: skip
    _write(tmp_path / "eval" / "rl-v10" / "trajectories.jsonl", [
        _traj("r-a", "d1", tier=1, exact_match=1, num_tool_calls=1),
        _traj("r-b", "d2", tier=2, exact_match=1, num_tool_calls=3),
    ])  # fmt: skip
    s = version_eval(tmp_path, tmp_path / "eval" / "rl-v10")
    assert s["accuracy_gain_points"] == pytest.approx(50.0)
    assert s["rl_tool_calls_solved"] == 2.0
    assert s["tool_calls_solved_cut_frac"] == pytest.approx(1 - 2.0 / 6.0)


def test_keep_versions_survive_pruning(tmp_path):
    from provrl.pipeline.rundir import COMPLETE, RunDir

    run = RunDir(tmp_path)
    for v in range(1, 7):
        (tmp_path / "rl" / f"ckpt-v{v}").mkdir(parents=True)
        (tmp_path / "rl" / f"ckpt-v{v}" / COMPLETE).write_text("")
    run.prune_checkpoints(keep=2, also=[3])
    assert [v for v, _ in run.checkpoints()] == [3, 5, 6]
    run.prune_checkpoints(keep=2)
    assert [v for v, _ in run.checkpoints()] == [5, 6]


def test_the_filter_pools_are_counted_per_tier(tmp_path):
    from provrl.bench.dev import pool_tiers

    rows = {"kept": [1, 1, 2], "solved": [1], "unsolved": [2, 2]}
    for pool, tiers in rows.items():
        lines = [json.dumps({"task_id": f"{pool}{i}", "tier": t}) for i, t in enumerate(tiers)]
        (tmp_path / f"{pool}.jsonl").write_text("\n".join(lines) + "\n")
    assert pool_tiers(tmp_path) == {
        "1": {"kept": 2, "solved": 1, "unsolved": 0},
        "2": {"kept": 1, "solved": 0, "unsolved": 2},
    }


def test_groups_are_counted_by_version_block_and_tier(tmp_path):
    """A tier-2 group sampled at version 1 and one at version 5 fall in blocks 0-3 and 4-7
    (its oldest action token); accuracy and calls are per episode, averaged per group."""
    f = tmp_path / "rl" / "trajectories.jsonl"
    _write(f, [
        _traj("a0", "t1", 1, {"group": "t1#r1", "tier": 2}, exact_match=1, num_tool_calls=2),
        _traj("a1", "t1", 2, {"group": "t1#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("b0", "t2", 5, {"group": "t2#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("c0", "t3", 0, {"group": "t3#r1", "tier": 1}, exact_match=1, num_tool_calls=1),
    ])  # fmt: skip
    blocks = tier_blocks(f)
    assert list(blocks) == ["0-3", "4-7"]
    two = blocks["0-3"]["2"]
    assert (two["groups"], two["accuracy"], two["tool_calls"]) == (1, 0.5, 1.5)
    assert blocks["0-3"]["1"]["accuracy"] == 1.0
    late = blocks["4-7"]["2"]
    assert (late["groups"], late["accuracy"], late["tool_calls"]) == (1, 0.0, 1.0)


def test_a_blocks_search_counts_and_signal_are_per_tier(tmp_path):
    """Per cell: how many episodes made n calls and how often they were right, and the share
    of groups whose rewards are all equal (no gradient)."""
    f = tmp_path / "rl" / "trajectories.jsonl"
    _write(f, [
        _traj("a0", "t1", 0, {"group": "t1#r1", "tier": 2}, exact_match=1, num_tool_calls=2),
        _traj("a1", "t1", 0, {"group": "t1#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("a2", "t1", 0, {"group": "t1#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("b0", "t2", 1, {"group": "t2#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("b1", "t2", 1, {"group": "t2#r1", "tier": 2}, exact_match=0, num_tool_calls=1),
        _traj("c0", "t3", 0, {"group": "t3#r1", "tier": 2}, exact_match=1, num_tool_calls=2),
    ])  # fmt: skip
    cell = tier_blocks(f)["0-3"]["2"]
    assert cell["groups"] == 3 and cell["zero_signal_share"] == pytest.approx(2 / 3)
    assert cell["calls_hist"] == {"1": 4, "2": 2}
    assert cell["accuracy_by_calls"] == {"1": 0.0, "2": 1.0}
    assert cell["accuracy"] == pytest.approx((1 / 3 + 0 + 1) / 3)  # per group, then averaged


def test_the_plan_split_counts_each_first_thoughts_plan_per_tier_and_version_block(tmp_path):
    """An episode's plan is read from its first action only (a later turn's words do not
    count), per the block of its oldest version and its tier, with the accuracy of each plan."""
    texts = {
        7: "<think>The question names what it asks about, so one search should show it.",
        8: "<think>The question asks about what the name in it leads to, so I need two searches",
        9: "<think>I search.",
    }

    def traj(tid: str, tier: int, first: int, version: int, em: float, later: int = 9):
        b = TrajectoryBuilder(tid, "t")
        b.add_prompt([1, 2])
        for tok in (first, later):
            b.add_actions([tok], logprob=[-0.1], kept_mass=[1.0], version=[version],
                          kv_min=[version], kv_max=[version], replica=0)  # fmt: skip
            b.add_observation([3])
        t = b.build()
        t.metrics.update(tier=tier, exact_match=em)
        return t

    f = tmp_path / "rl" / "trajectories.jsonl"
    _write(f, [
        traj("a", 1, 7, 0, 1.0), traj("b", 1, 7, 1, 0.0), traj("c", 1, 8, 2, 0.0, later=7),
        traj("d", 2, 8, 0, 1.0), traj("e", 2, 9, 0, 0.0, later=8), traj("f", 2, 7, 5, 0.0),
    ])  # fmt: skip
    split = plan_split(f, lambda ids: " ".join(texts.get(i, "") for i in ids))
    assert split == {
        "0-3": {
            "1": {"1": {"episodes": 2, "accuracy": 0.5}, "2": {"episodes": 1, "accuracy": 0.0}},
            "2": {"2": {"episodes": 1, "accuracy": 1.0}, "none": {"episodes": 1, "accuracy": 0.0}},
        },
        "4-7": {"2": {"1": {"episodes": 1, "accuracy": 0.0}}},
    }


def test_a_resumed_runs_sessions_are_counted(tmp_path):
    """The record's wall time and RSS are the invocation's: a resumed run says so."""
    from provrl.bench.dev import run_sessions

    assert run_sessions(tmp_path) == 0
    (tmp_path / "sessions.jsonl").write_text('{"date": "a"}\n{"date": "b"}\n\n')
    assert run_sessions(tmp_path) == 2


def test_a_dev_run_keeps_only_its_newest_checkpoint_once_the_versions_are_evaluated(
    tmp_path, monkeypatch
):
    """The kept versions' checkpoints are deleted after their evals (their eval dirs hold the
    result); the newest stays. The pipeline run and the summaries are stubbed: only the
    orchestration of run_dev is under test."""
    import provrl.bench.dev as dev
    from provrl.pipeline.rundir import COMPLETE, RunDir

    d = tmp_path / "runs" / "x"
    for v in (15, 19, 20):
        (d / "rl" / f"ckpt-v{v}").mkdir(parents=True)
        (d / "rl" / f"ckpt-v{v}" / COMPLETE).write_text("")
    evaluated = []

    def fake_run(args, log):
        if "--policy" in args:  # an eval of a kept version: needs its checkpoint
            ckpt = Path(args[args.index("--policy") + 1])
            assert (ckpt / COMPLETE).is_file()
            evaluated.append(ckpt.name)
        return {"wall_s": 0.0, "peak_rss_gb": 0.0}

    monkeypatch.setattr(dev, "_run", fake_run)
    monkeypatch.setattr(dev, "eval_args", lambda *a, **k: ["eval"])
    monkeypatch.setattr(dev, "version_eval", lambda run_dir, ev: {})
    monkeypatch.setattr(dev, "summarize_run", lambda run_dir: {})
    dev.run_dev("x", runs=tmp_path / "runs", eval_versions=[15])
    assert evaluated == ["ckpt-v15"]
    assert [v for v, _ in RunDir(d).checkpoints()] == [20]
