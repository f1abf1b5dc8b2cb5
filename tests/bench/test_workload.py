"""The recorded workload: episodes read from trajectories, token counts, workload files."""

from __future__ import annotations

import json

import pytest

from provrl.bench.workload import (
    Episode,
    Turn,
    WorkloadError,
    episode_from_trajectory,
    episodes_in_start_order,
    read_workload,
    take,
    token_counts,
    write_workload,
)
from provrl.provenance import ToolCall, TrajectoryBuilder


def trajectory(tid, group, sample, prompt, turns, latencies=()):
    """A trajectory as the agent loop builds it: prompt, then (actions, observation) turns."""
    b = TrajectoryBuilder(tid, "task")
    b.add_prompt(prompt)
    for j, (acts, obs) in enumerate(turns):
        n = len(acts)
        b.add_actions(acts, logprob=[-1.0] * n, kept_mass=[1.0] * n, version=0, kv_min=0,
                      kv_max=0, replica=0)  # fmt: skip
        if obs:
            b.next_turn()
            b.add_observation(obs)
        if j < len(latencies):
            b.add_tool_call(ToolCall(j, "search", "q", True, None, latencies[j]))
    return b.build(reward=0.0, meta={"group": group, "sample": sample})


def test_an_episode_is_its_contexts_and_action_lengths():
    t = trajectory("t0", "g", 0, [1, 2, 3], [([4, 5], [6, 7, 8]), ([9], None)], [0.25])
    ep = episode_from_trajectory(t)
    assert ep.turns == (Turn((1, 2, 3), 2, 0.0), Turn((6, 7, 8), 1, 0.25))
    assert len(ep) == len(t) == 9
    assert sum(x.action_len for x in ep.turns) == t.num_actions


def test_a_trailing_observation_was_never_sent_and_is_dropped():
    t = trajectory("t0", "g", 0, [1, 2], [([3], [4, 5])])
    assert episode_from_trajectory(t).turns == (Turn((1, 2), 1, 0.0),)


def test_groups_come_in_order_of_first_finish_members_by_sample():
    trajs = [
        trajectory("b1", "B", 1, [1], [([2], None)]),
        trajectory("a0", "A", 0, [1], [([2], None)]),
        trajectory("b0", "B", 0, [1], [([2], None)]),
    ]
    assert [e.episode_id for e in episodes_in_start_order(trajs)] == ["b0", "b1", "a0"]


def test_token_counts_and_the_shareable_prompt():
    eps = [
        Episode("a", "g", (Turn((1, 2, 3), 2), Turn((4,), 5))),
        Episode("b", "g", (Turn((1, 2, 3), 1),)),
        Episode("c", "h", (Turn((7, 8), 1),)),
    ]
    c = token_counts(eps)
    assert c == {"episodes": 3, "turns": 4, "context": 9, "action": 9, "processed": 18,
                 "shareable": 2}  # fmt: skip
    # the longest prefix shared with any earlier prompt, one token left to feed
    eps = [Episode(x, x, (Turn(p, 1),)) for x, p in (("a", (1, 2, 3, 4)), ("b", (1, 2, 5)),
                                                      ("c", (1, 2, 3, 4, 6)), ("d", (9,)))]  # fmt: skip
    assert token_counts(eps)["shareable"] == 0 + 2 + 4 + 0


def test_a_workload_file_round_trips_and_stores_each_context_once(tmp_path):
    eps = [
        Episode("a", "g", (Turn((1, 2, 3), 2), Turn((4,), 5, 0.5))),
        Episode("b", "g", (Turn((1, 2, 3), 1),)),
    ]
    p = tmp_path / "w.json"
    write_workload(p, eps, concurrency=4, source={"what": "test"}, differs_from_real=["made up"])
    back, header = read_workload(p)
    assert back == eps
    assert header["concurrency"] == 4 and header["differs_from_real"] == ["made up"]
    assert len(json.loads(p.read_text())["contexts"]) == 2
    with pytest.raises(WorkloadError, match="differ"):
        write_workload(p, eps, concurrency=4, source={}, differs_from_real=[])


def test_a_trajectory_log_is_a_workload(tmp_path):
    from provrl.trajlog import TrajectoryWriter

    p = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(p) as w:
        w.write(trajectory("t0", "g", 0, [1, 2], [([3, 4], [5]), ([6], None)], [0.1]))
    eps, header = read_workload(p)
    assert token_counts(eps)["processed"] == 6 and header["concurrency"] == 0


def test_bad_workload_files_name_themselves(tmp_path):
    p = tmp_path / "w.json"
    with pytest.raises(WorkloadError, match="no such"):
        read_workload(p)
    p.write_text('{"format": "provrl-workload/1", "episodes": [{"id": 1}], "contexts": []}')
    with pytest.raises(WorkloadError, match=r"w\.json: not a provrl-workload/1 file"):
        read_workload(p)
    p.write_text('{"format": "other"}')
    with pytest.raises(WorkloadError, match="format 'other'"):
        read_workload(p)


def test_take_cycles_through_the_workload_as_new_groups():
    eps = [Episode("a", "g", (Turn((1,), 1),)), Episode("b", "h", (Turn((2,), 1),))]
    assert take(eps, 0) == eps and take(eps, 1) == eps[:1]
    more = take(eps, 5)
    assert [e.episode_id for e in more] == ["a", "b", "a#p1", "b#p1", "a#p2"]
    assert more[2].group == "g#p1" and more[2].turns == eps[0].turns


def test_the_shipped_fixture_is_the_trainer_batch_cut_as_documented(tmp_path):
    from provrl.bench.workload import FIXTURE, fixture_from_log

    counts = fixture_from_log(out=tmp_path / "w.json")
    assert (tmp_path / "w.json").read_text() == FIXTURE.read_text()
    eps, header = read_workload(FIXTURE)
    assert counts == token_counts(eps) == header["tokens"]
    assert header["concurrency"] == 32 and len(header["differs_from_real"]) >= 3
    assert counts["episodes"] == 32 and len({e.group for e in eps}) == 4


def test_an_rl_log_replays_at_its_runs_concurrency(tmp_path):
    from provrl.trajlog import TrajectoryWriter

    run = tmp_path / "run"
    (run / "rl").mkdir(parents=True)
    (run / "config.yaml").write_text("pipeline:\n  loop:\n    concurrency: 12\n")
    with TrajectoryWriter(run / "rl" / "trajectories.jsonl") as w:
        w.write(trajectory("t0", "g", 0, [1, 2], [([3], None)]))
    assert read_workload(run / "rl" / "trajectories.jsonl")[1]["concurrency"] == 12
