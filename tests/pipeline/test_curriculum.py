"""The online curriculum (provrl.pipeline.curriculum): the probe's filter at version 0, pools
that follow the evidence and its age, one pool per task at every version, re-probes."""

from __future__ import annotations

import pytest

from provrl.env.tasks import Task
from provrl.pipeline.curriculum import (
    POOLS,
    Curriculum,
    Evidence,
    has_signal,
    least_started_tier,
    pool_of,
    posterior,
)
from provrl.run_config.pipeline import CurriculumConfig


def _tasks(n: int) -> list[Task]:
    return [
        Task(f"t{i}", "train", 1, "lookup", f"question {i}?", f"a{i}", [], f"e{i}", [], 1)
        for i in range(n)
    ]


CFG = CurriculumConfig()


def test_one_group_of_eight_is_the_probe_filter():
    pools = [pool_of(*posterior([Evidence("t", 0, K, 8)], 0, CFG), CFG) for K in range(9)]
    assert pools == ["unsolved"] + ["kept"] * 7 + ["solved"]
    assert not has_signal([1.0] * 8) and not has_signal([-0.5] * 8) and not has_signal([0.9])
    assert has_signal([0.9, 0.8, 0.9]) and has_signal([0.0, -0.5])  # tool-call cost, format


def test_posterior_discounts_older_versions():
    ev = [Evidence("t", 0, 8, 8), Evidence("t", 3, 0, 8)]
    a, b = posterior(ev, 3, CFG)
    assert a == pytest.approx(1 + 8 * CFG.forget**3) and b == pytest.approx(1 + 8)


def test_a_verdict_loosens_with_age_but_not_at_once():
    p, history = "solved", []
    for u in range(30):
        p = pool_of(*posterior([Evidence("t", 0, 8, 8)], u, CFG), CFG, p)
        history.append(p)
    assert history[:5] == ["solved"] * 5  # hysteresis: no flip at the first aging step
    assert history[-1] == "kept"  # an old verdict is tried again
    assert history.index("kept") > 5


def test_every_task_is_in_one_pool_at_every_version_and_moves_replay():
    tasks = _tasks(6)
    cur = Curriculum(tasks, CFG, seed=0)
    start = dict(cur.pools)
    outcomes = {0: [0, 8, 4, 8, 1, 7], 1: [0, 8, 8, 8, 0, 0], 2: [3, 8, 8, 2, 0, 0]}
    for v, ks in outcomes.items():
        for t, K in zip(tasks, ks, strict=True):
            cur.record(Evidence(t.task_id, v, K, 8))
        cur.advance(v + 1)
    # replaying the transitions from the start reproduces the pools at every version
    pools = dict(start)
    for m in cur.transitions:
        assert pools[m.task_id] == m.before
        pools[m.task_id] = m.after
    assert pools == cur.pools
    assert set(cur.pools.values()) <= set(POOLS) and len(cur.pools) == len(tasks)
    assert sum(cur.counts().values()) == len(tasks)
    assert cur.pools["t1"] == "solved" and cur.pools["t0"] == "kept"  # 0/8 then 3/8


def test_next_task_visits_kept_least_visited_and_reprobes_the_oldest_verdict():
    tasks = _tasks(4)
    cfg = CFG.model_copy(update={"reprobe_every": 3})
    cur = Curriculum(tasks, cfg, seed=1)
    for t, K in zip(tasks, [0, 4, 4, 8], strict=True):
        cur.record(Evidence(t.task_id, 0, K, 8, "probe"))
    picks = [cur.next_task() for _ in range(6)]
    names = [t.task_id for t, _, _ in picks]
    reprobes = [re for _, _, re in picks]
    assert reprobes == [False, False, True, False, False, True]
    assert {names[2], names[5]} == {"t0", "t3"}  # each out-of-band task once, oldest first
    assert sorted(names[:2]) == ["t1", "t2"] and sorted(names[3:5]) == ["t1", "t2"]
    assert [r for t, r, _ in picks if t.task_id == "t1"] == [0, 1]  # rounds count per task


def test_balanced_tiers_give_the_smaller_tier_as_many_groups():
    # six tier-1 tasks and two tier-2 tasks, all kept: one pool visits tier 2 a quarter of the
    # time; balanced, every other group is a tier-2 task (least visited within the tier)
    tasks = _tasks(6) + [
        Task(f"u{i}", "train", 2, "two_hop", f"q{i}?", f"b{i}", [], f"f{i}", [], 2)
        for i in range(2)
    ]
    for balance, share in ((False, 0.25), (True, 0.5)):
        cfg = CFG.model_copy(update={"reprobe_every": 0, "balance_tiers": balance})
        cur = Curriculum(tasks, cfg, seed=3)
        picks = [cur.next_task()[0] for _ in range(16)]
        assert sum(t.tier == 2 for t in picks) / 16 == share
        tier2 = [t.task_id for t in picks if t.tier == 2]
        assert all(tier2.count(x) == len(tier2) // 2 for x in ("u0", "u1"))  # evenly within


def test_least_started_tier_breaks_ties_by_the_lower_tier():
    kept, tier = ["a", "b", "c"], {"a": 2, "b": 1, "c": 2}
    assert least_started_tier(kept, {}, tier) == ["b"]
    assert least_started_tier(kept, {1: 3, 2: 2}, tier) == ["a", "c"]
    assert least_started_tier(["a"], {1: 0, 2: 5}, tier) == ["a"]  # only tiers with a kept task


@pytest.mark.parametrize("count", ["with_probe", "loop"])
def test_balance_counts_the_probe_or_only_the_loop(count):
    """Six tier-1 and two tier-2 kept tasks, each probed once. balance_count=with_probe counts
    the probe's round: tier 2 gets the first four groups (until 2 + 4 = 6), then the tiers
    alternate; loop counts only the loop's groups: the tiers alternate from the first."""
    tasks = _tasks(6) + [
        Task(f"u{i}", "train", 2, "two_hop", f"q{i}?", f"b{i}", [], f"f{i}", [], 2)
        for i in range(2)
    ]
    from provrl.rollout.collector import Group

    cfg = CFG.model_copy(update={"reprobe_every": 0, "balance_tiers": True, "balance_count": count})
    probe = [Group(t, 0, _samples(t, 0, 4, 8)) for t in tasks]  # K = 4 of 8: all kept
    cur = Curriculum.restored(tasks, cfg, 3, probe, [], k=8, version=0)
    tiers = [cur.next_task()[0].tier for _ in range(8)]
    assert tiers == ([2, 2, 2, 2, 1, 2, 1, 2] if count == "with_probe" else [1, 2] * 4)


def test_unknown_task_and_empty_curriculum_are_refused():
    with pytest.raises(ValueError, match="no task"):
        Curriculum([], CFG)
    cur = Curriculum(_tasks(1), CFG)
    with pytest.raises(KeyError, match="unknown task"):
        cur.record(Evidence("nope", 0, 1, 8))


def test_a_group_reported_twice_counts_once():
    """A resume replays the log's complete groups, then the collector hands back the
    untrained ones: the second report of a group changes nothing (issue 38: pools 2 / 6
    against 4 / 4 in an uninterrupted run)."""
    tasks = _tasks(2)
    cur = Curriculum(tasks, CFG)
    e = Evidence(tasks[0].task_id, 0, 0, 8, "rl", tasks[0].task_id + "#r1")
    assert cur.record(e) is not None and cur.pools[tasks[0].task_id] == "unsolved"
    before = (dict(cur.pools), list(cur.evidence[tasks[0].task_id]))
    assert cur.record(e) is None
    assert (dict(cur.pools), list(cur.evidence[tasks[0].task_id])) == before
    cur.record(Evidence(tasks[0].task_id, 0, 0, 8))  # no key: always counted
    assert len(cur.evidence[tasks[0].task_id]) == 2


def _samples(task: Task, r: int, K: int, k: int, stamp: dict | None = None) -> list:
    """A group's ``k`` samples (``K`` solved) as the collector logs them: the group's key,
    round and sample in their metadata, plus the curriculum's ``stamp``."""
    from provrl.provenance import TrajectoryBuilder
    from provrl.rollout.collector import group_key

    out = []
    for s in range(k):
        b = TrajectoryBuilder(f"{task.task_id}-r{r}-s{s}", task.task_id)
        b.add_prompt([1, 2])
        b.add_actions([3], logprob=[-0.1], kept_mass=[1.0], version=0, kv_min=0, kv_max=0, replica=0)  # fmt: skip
        meta = {"group": group_key(task.task_id, r), "round": r, "sample": s, **(stamp or {})}
        em = float(s < K)
        out.append(b.build(metrics={"exact_match": em}, reward=em, meta=meta))
    return out


def test_a_resumed_curriculum_starts_what_the_uninterrupted_one_starts():
    """Issue 38: replaying the log gives the resumed run the live run's starts — each task's
    last start (which re-probe is oldest), the re-probes, the start count — so it starts
    the same tasks next. Without the stamps every task's last start was forgotten and the
    resumed run re-probed the same task again and again."""
    from provrl.rollout.collector import Group

    tasks, k = _tasks(5), 8
    cfg = CFG.model_copy(update={"reprobe_every": 2})
    outcome = {"t0": 0, "t1": 0, "t2": 0, "t3": 4, "t4": 4}  # three unsolved, two kept
    probe = [Group(t, 0, _samples(t, 0, outcome[t.task_id], k)) for t in tasks]
    live = Curriculum(tasks, cfg, seed=3)
    live.replay(probe, [], k, 0)
    logged: list = []
    for _ in range(7):
        task, r, _ = live.next_task()
        group = _samples(task, r, outcome[task.task_id], k, live.stamp(task.task_id, r))
        logged += group
        live.observe(Group(task, r, group))
    resumed = Curriculum(tasks, cfg, seed=3)
    resumed.replay(probe, logged, k, 0)
    assert resumed.started == live.started and resumed.reprobes == live.reprobes
    assert resumed.last_start == live.last_start and resumed.visits == live.visits
    assert [resumed.next_task() for _ in range(8)] == [live.next_task() for _ in range(8)]


def test_a_group_killed_before_its_first_sample_is_started_again_under_its_old_number():
    """The crash matrix's ``collector.written`` kill (CI, 2026-12-06): a later group's sample
    was logged before any of an earlier group's, so the log's newest stamp counted the
    earlier group, which the resumed run then started again and counted a second time
    (``groups_started`` 17, the run never killed 16). Its number is a gap below the newest
    stamp: given out again, the resumed run starts what the live run started, numbered
    alike (re-probes included), and counts each group once."""
    from provrl.rollout.collector import Group

    tasks, k = _tasks(5), 8
    cfg = CFG.model_copy(update={"reprobe_every": 2})
    outcome = {"t0": 0, "t1": 0, "t2": 0, "t3": 4, "t4": 4}
    probe = [Group(t, 0, _samples(t, 0, outcome[t.task_id], k)) for t in tasks]
    live = Curriculum(tasks, cfg, seed=3)
    live.replay(probe, [], k, 0)
    groups = []
    for _ in range(6):
        task, r, reprobe = live.next_task()
        groups.append(((task, r, reprobe), _samples(task, r, outcome[task.task_id], k, live.stamp(task.task_id, r))))  # fmt: skip
    lost = 3  # the fourth group (a re-probe: 4 % 2 == 0) logged nothing before the kill
    logged = [t for i, (_, g) in enumerate(groups) if i != lost for t in g]
    resumed = Curriculum(tasks, cfg, seed=3)
    resumed.replay(probe, logged, k, 0)
    assert resumed.lost == [lost + 1] and resumed.started == live.started == 6
    assert resumed.next_task() == groups[lost][0]  # the same task, round and re-probe
    assert resumed.started == live.started and resumed.last_start == live.last_start
    assert [resumed.next_task() for _ in range(6)] == [live.next_task() for _ in range(6)]
