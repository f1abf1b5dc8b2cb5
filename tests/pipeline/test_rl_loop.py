"""The two orchestrations of :class:`provrl.pipeline.rl_loop.RLLoop`, each driven on its own
on the tiny model (no warm start, probe or eval around them)."""

from __future__ import annotations

from typing import Any

import pytest

from provrl.config import ConfigError, load_config
from provrl.env.build import load_split
from provrl.pipeline.rl_loop import RLLoop
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.steplog import read_steps
from provrl.run_config import RunConfig


def _loop(tmp_path, small_world, mode: str, *extra: str) -> RLLoop:
    sets = [f"pipeline.loop.mode={mode}", "pipeline.loop.steps=2", f"logging.run_dir={tmp_path}"]
    sets += list(extra)
    cfg = load_config(RunConfig, "quick", sets)
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:6]
    return RLLoop.open(cfg, RunDir(tmp_path), small_world, tasks, "tiny", progress=False)


def _two_steps(
    tmp_path, small_world, mode: str, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run only ``mode``'s loop (run_sync or run_async) for two steps: the summary and the
    step records."""
    loop = _loop(tmp_path, small_world, mode, *extra)
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
    for s in steps:  # every step says how much signal its batch and the finished groups had
        assert 0 < s["distinct_share"] <= 1 and 0 <= s["zero_signal_share"] <= 1
        assert s["finished_groups"] >= s["zero_signal_groups"] >= 0
        assert 0 <= s["kv_stale_share"] <= 1


def test_run_async_hot_loads_and_keeps_the_lag_bound(tmp_path, small_world):
    summary, steps = _two_steps(tmp_path, small_world, "async")
    assert summary["engine"]["hotloads"] >= 2  # each version loaded into the running engine
    lag = load_config(RunConfig, "quick").pipeline.loop.max_lag
    assert all(s["max_lag"] <= lag for s in steps)


def test_paced_admission_runs_and_records_what_it_paced_by(tmp_path, small_world):
    _, steps = _two_steps(tmp_path, small_world, "async", "pipeline.loop.admission=paced")
    lag = load_config(RunConfig, "quick").pipeline.loop.max_lag
    assert all(s["max_lag"] <= lag for s in steps)
    assert steps[-1]["paced_step_s"] > 0  # step 1's wall time paced step 2's starts
    assert "paced_group_s" in steps[0]


def test_a_loop_runs_only_inside_its_with_block(tmp_path, small_world):
    loop = _loop(tmp_path, small_world, "sync")
    try:
        with pytest.raises(RuntimeError, match="enter the loop"):
            loop.run_sync()
    finally:
        loop.finish()


def _group(task, rewards, r=1):
    """A finished group of ``task`` with these rewards (one action token each)."""
    from provrl.provenance import TrajectoryBuilder
    from provrl.rollout.collector import Group, group_key, traj_id

    trajs = []
    for s, rew in enumerate(rewards):
        b = TrajectoryBuilder(traj_id(task.task_id, r, s), task.task_id, meta={"group": group_key(task.task_id, r), "round": r})  # fmt: skip
        b.add_prompt([1, 2])
        b.add_actions([3], logprob=[-0.1], kept_mass=[1.0], version=0, kv_min=0, kv_max=0, replica=0)  # fmt: skip
        trajs.append(b.build(reward=rew, metrics={"exact_match": float(rew > 0)}))
    return Group(task, r, trajs)


def test_a_group_without_signal_is_skipped_never_trained_and_counted(tmp_path, small_world):
    sets = ["pipeline.curriculum.skip_zero_signal=true", "pipeline.curriculum.zero_signal_limit=3"]
    cfg = load_config(RunConfig, "quick", [*sets, f"logging.run_dir={tmp_path}"])
    tasks = [t for t in load_split(small_world, "train") if t.tier in (1, 2)][:3]
    loop = RLLoop.open(cfg, RunDir(tmp_path), small_world, tasks, "tiny", progress=False)
    try:
        flat, varied = _group(tasks[0], [-0.5] * 4), _group(tasks[1], [0.9, 0.8, -0.5, 0.9])
        loop.admit.outstanding = 2
        loop.take([flat, varied])
        assert loop.admit.ready == [varied] and loop.admit.outstanding == 1
        assert set(loop.state.skipped) == {t.traj_id for t in flat.trajectories}
        assert loop.signal.zero_signal_groups == 1 and loop.signal.groups == 2
        # a solved group whose rewards differ (fewer tool calls scored higher) has signal
        loop.take([_group(tasks[2], [0.9, 0.8, 0.9, 0.9])])
        assert len(loop.admit.ready) == 2
        with pytest.raises(ConfigError, match="3 finished groups in a row had no signal"):
            loop.take([_group(t, [0.0] * 4, r=2) for t in tasks])
        # the evidence of every group, trained or not, reached the curriculum
        ev = loop.curriculum.evidence
        assert [(e.successes, e.k) for e in ev[tasks[2].task_id]] == [(4, 4), (0, 4)]
    finally:
        loop.finish()


def test_the_signal_count_runs_across_a_resume_and_counts_a_handed_back_group_once():
    """Issue 38: a checkpoint keeps the finished groups' count as its step left it; the
    resumed run starts from it, and of the groups finished before the kill that the
    collector hands back only those the committed steps had not counted count again — the
    step records and the summary are the run's never killed (they had counted each
    handed-back group twice, and the summary only the last session's groups)."""
    import json

    from provrl.pipeline.rl_stats import SignalCount

    live = SignalCount()
    live.add(10, False, "a#r1")
    live.add(20, True, "b#r1")
    assert live.since_last_step()["finished_groups"] == 2  # step 1's record
    saved = json.loads(json.dumps(live.durable()))  # step 1's checkpoint (state.json)
    live.add(30, False, "c#r1")  # finished after the commit; then the kill
    resumed = SignalCount.restored(saved)
    # handed back: a (step 1 counted it) and c (no committed step did); d is new
    for tokens, signal, key in [(10, False, "a#r1"), (30, False, "c#r1"), (5, True, "d#r1")]:
        resumed.add(tokens, signal, key)
    live.add(5, True, "d#r1")
    step2 = {"finished_groups": 2, "zero_signal_groups": 1, "zero_signal_share": 0.5}
    assert resumed.since_last_step() == live.since_last_step() == step2
    assert resumed.summary(0) == live.summary(0) and resumed.summary(0)["groups"] == 4
    assert SignalCount.restored({}) == SignalCount()  # a checkpoint written before the count


def test_distinct_share_counts_identical_samples_of_a_group_once():
    import numpy as np

    from provrl.pipeline.rl_stats import distinct_share

    class T:
        def __init__(self, actions: list[int]) -> None:
            self.token_id = np.array([7, 7, *actions])
            self.is_action = np.array([False, False] + [True] * len(actions))

    class G:
        def __init__(self, *samples: list[int]) -> None:
            self.trajectories = [T(a) for a in samples]

    # group 1: four identical samples (1 distinct); group 2: 3 distinct of 4 (the prompt
    # tokens are equal everywhere and do not count)
    groups = [G([1, 2], [1, 2], [1, 2], [1, 2]), G([1, 2], [2, 1], [1, 2], [1])]
    assert distinct_share(groups) == (1 + 3) / 8  # type: ignore[arg-type]


def test_an_injected_nan_gradient_is_skipped_counted_and_never_saved_or_loaded(
    tmp_path, small_world, monkeypatch
):
    """``PROVRL_FAULT=rl.nan_grad:2``: the second update is refused — its batch is not
    trained, no checkpoint or hot-load of it — the next one is step 2, and its record
    counts the skip."""
    import json

    from provrl import failpoints

    failpoints.reset()
    monkeypatch.setenv("PROVRL_FAULT", "rl.nan_grad:2")
    loop = _loop(tmp_path, small_world, "sync")
    with pytest.warns(UserWarning, match="rl step 2: update not finite"), loop:
        loop.run_sync()
    summary = loop.finish()
    steps = read_steps(tmp_path)
    assert [s["step"] for s in steps] == [1, 2] and summary["final_version"] == 2
    assert [s["nonfinite_skipped"] for s in steps] == [0, 1] and summary["nonfinite_steps"] == 1
    assert summary["engine"]["hotloads"] == 2  # versions 1 and 2 only
    state = json.loads((tmp_path / "rl" / "ckpt-v2" / "state.json").read_text())
    refused = set(state["nonfinite"])
    assert refused and not refused & set(state["trained"]) and state["nonfinite_steps"] == 1


def test_repeated_non_finite_updates_stop_the_run_with_one_line(tmp_path, small_world, monkeypatch):
    from provrl import failpoints
    from provrl.train.learner import NonFiniteError

    failpoints.reset()
    monkeypatch.setenv("PROVRL_FAULT", "rl.nan_grad:1+")  # every update
    loop = _loop(tmp_path, small_world, "sync", "rl.nonfinite_limit=2")
    with pytest.raises(NonFiniteError, match="rl step 1: 2 updates in a row were not finite") as e:
        loop.run()
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "rl").glob("ckpt-v*")) and read_steps(tmp_path) == []


def _manifest(ckpt) -> dict:
    import json

    return json.loads((ckpt / "checksums.json").read_text())["files"]


def test_a_damaged_newest_checkpoint_falls_back_and_redoes_the_lost_step_exactly(
    tmp_path, small_world
):
    """Truncate a file of the newest checkpoint (40 bytes, as issue 38's run did): the resume
    says so in one line, sets it aside, starts from the checkpoint before and redoes the
    lost step with the batch it trained — the same weights, bit for bit. A truncated
    ``steps.jsonl`` alone is written back from ``RUN/rl/steps.jsonl`` (same bytes)."""
    import shutil

    from provrl.pipeline.steplog import ResumeWarning

    base = tmp_path / "base"
    loop = _loop(base, small_world, "sync")
    first = loop.run()
    rl = base / "rl"
    assert sorted(p.name for p in rl.glob("ckpt-v*")) == ["ckpt-v1", "ckpt-v2"]  # two kept
    original = read_steps(base)
    weights = _manifest(rl / "ckpt-v2")["model.safetensors"]
    for name in ("model.safetensors", "optimizer.pt", "steps.jsonl"):
        d = tmp_path / name
        shutil.copytree(base, d)
        f = d / "rl" / "ckpt-v2" / name
        f.write_bytes(f.read_bytes()[:-40])
        with pytest.warns(ResumeWarning) as seen:
            again = _loop(d, small_world, "sync")
        lines = [str(w.message) for w in seen if w.category is ResumeWarning]
        assert len(lines) == 1 and name in lines[0], lines
        summary = again.run()
        steps = read_steps(d)
        assert [s["step"] for s in steps] == [1, 2] and summary["final_version"] == 2
        assert [s["trained"] for s in steps] == [s["trained"] for s in original]
        # the redone step counts the groups it trained, as the lost one did (issue 38)
        counts = [(s["finished_groups"], s["zero_signal_groups"]) for s in steps]
        assert counts == [(s["finished_groups"], s["zero_signal_groups"]) for s in original]
        assert summary["zero_signal"] == first["zero_signal"]
        assert _manifest(d / "rl" / "ckpt-v2")["model.safetensors"] == weights  # exact redo
        damaged = list((d / "rl").glob("damaged-ckpt-v2-*"))
        if name == "steps.jsonl":  # repaired from the other durable copy, no fallback
            assert "written back" in lines[0] and not damaged
        else:
            assert "resuming from ckpt-v1" in lines[0]
            assert "redone exactly" in lines[0] and len(damaged) == 1
            assert steps[1]["loss"] == original[1]["loss"]


def test_a_checkpoint_short_of_step_records_is_filled_from_the_run_copy_or_refused(tmp_path):
    """No checksums (an older checkpoint): the checkpoint's ``steps.jsonl`` holds fewer
    records than ``state.steps`` — filled from ``RUN/rl/steps.jsonl`` when it has them after
    the same lines, else refused in one line; never settled by dropping a good line."""
    from provrl.pipeline.steplog import ResumeWarning, StepLogError, restore_steps, step_line

    rl, ckpt = tmp_path / "rl", tmp_path / "rl" / "ckpt-v2"
    ckpt.mkdir(parents=True)
    lines = [step_line({"step": s, "version": s, "trained": [f"t{s}"]}) for s in (1, 2)]
    (rl / "steps.jsonl").write_bytes(b"".join(lines))
    (ckpt / "steps.jsonl").write_bytes(lines[0])
    with pytest.warns(ResumeWarning, match="1 step records for 2 steps"):
        assert restore_steps(rl, ckpt, 2) == lines
    assert (ckpt / "steps.jsonl").read_bytes() == (rl / "steps.jsonl").read_bytes() == b"".join(lines)  # fmt: skip
    (ckpt / "steps.jsonl").write_bytes(lines[0])
    (rl / "steps.jsonl").write_bytes(lines[0])  # no copy holds step 2
    with pytest.raises(StepLogError, match="1 step records, but the checkpoint says 2") as e:
        restore_steps(rl, ckpt, 2)
    assert "\n" not in str(e.value) and (rl / "steps.jsonl").read_bytes() == lines[0]


def test_lend_cores_gives_the_engine_the_learners_core_while_the_learner_waits(
    tmp_path, small_world, monkeypatch
):
    """pipeline.loop.lend_cores: with split_cores the engine computes on its half while a step
    trains and on every core while the learner waits (set_threads around each step), and
    ends on its own half; without it the engine's count is never touched."""
    import torch

    from provrl.engine.local import LocalEngine
    from provrl.pipeline.build import split_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the machine's two cores
    calls: list[int] = []
    set_threads = LocalEngine.set_threads
    monkeypatch.setattr(LocalEngine, "set_threads", lambda self, n: (calls.append(n), set_threads(self, n))[1])  # fmt: skip
    split = ("pipeline.loop.split_cores=true",)
    cfg = load_config(RunConfig, "quick", [*split, "pipeline.loop.mode=async"])
    assert split_threads(cfg) == (1, 1, 0, 0)
    _two_steps(tmp_path / "off", small_world, "async", *split)
    assert calls == []
    lend = (*split, "pipeline.loop.lend_cores=true")
    assert split_threads(load_config(RunConfig, "quick", [*lend, "pipeline.loop.mode=async"])) == (1, 1, 2, 0)  # fmt: skip
    summary, _ = _two_steps(tmp_path / "on", small_world, "async", *lend)
    assert calls == [2, 1, 2, 1, 2, 1]  # wait, step 1, wait, step 2, wait, the end
    assert summary["threads"] == {
        "engine": 1,
        "trainer": 1,
        "lent": 2,
        "borrowed": 0,
        "micro_batches": {},
    }


@pytest.mark.parametrize(("engine_load", "ran_on"), [(0, "borrowed"), (3, "own")])
def test_borrow_cores_gives_the_learner_the_engines_core_while_the_engine_has_nothing_to_do(
    tmp_path, small_world, monkeypatch, engine_load, ran_on
):
    """pipeline.loop.borrow_cores: each learner micro-batch asks for its threads; with the
    engine idle (no turn generating or queued) it runs on every core, else on its half —
    and torch's count is set on the learner's thread to what it asked for."""
    import threading

    import torch

    import provrl.pipeline.build as build

    count = threading.local()  # torch's count is per thread: two cores unless set
    set_on: list[tuple[str, int]] = []

    def set_threads(n: int) -> None:
        set_on.append((threading.current_thread().name, n))
        count.n = n

    monkeypatch.setattr(torch, "get_num_threads", lambda: getattr(count, "n", 2))
    monkeypatch.setattr(torch, "set_num_threads", set_threads)
    monkeypatch.setattr(build, "engine_load", lambda engine: engine_load)
    borrow = ("pipeline.loop.split_cores=true", "pipeline.loop.borrow_cores=true")
    assert build.split_threads(load_config(RunConfig, "quick", [*borrow, "pipeline.loop.mode=async"])) == (1, 1, 0, 2)  # fmt: skip
    summary, _ = _two_steps(tmp_path, small_world, "async", *borrow)
    threads = summary["threads"]
    assert threads["borrowed"] == 2 and set(threads["micro_batches"]) == {ran_on}
    assert threads["micro_batches"][ran_on] >= 2  # at least one micro-batch a step
    learner = [n for name, n in set_on if name.startswith("learner")]
    # its half when the thread starts, then all cores for every micro-batch (set once)
    assert learner == ([1] if ran_on == "own" else [1, 2])
