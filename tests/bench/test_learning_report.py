"""``provrl bench learning``'s targets and plot, read from a record alone."""

from __future__ import annotations

import copy

import pytest

from provrl.bench.learning_report import plot_learning, targets


def _tier(warm: float, rl: float, cw: float, cr: float) -> dict[str, float]:
    return {"warmstart_accuracy": warm, "rl_accuracy": rl, "gain_points": 100 * (rl - warm),
            "warmstart_tool_calls_solved": cw, "rl_tool_calls_solved": cr}  # fmt: skip


def _record() -> dict:
    rows = []
    for s in range(3):
        tiers = {"1": _tier(0.6, 0.7, 2.3, 1.6), "2": _tier(0.2, 0.6, 3.4, 2.2)}
        rows.append({
            "seed": s, "accuracy_gain_points": 20.0 + s, "accuracy_gain_se": 4.0,
            "tool_calls_solved_cut_frac": 0.3, "mixed_version_frac": 0.22,
            "second_world_gain_points": 12.0, "per_tier": tiers,
            "second_world_per_tier": copy.deepcopy(tiers),
        })  # fmt: skip
    return {"preset": "default", "eval_k": 4, "seeds": rows,
            "mean": {"accuracy_gain_points": 21.0, "tool_calls_solved_cut_frac": 0.3}}  # fmt: skip


def test_every_target_holds_on_a_record_that_meets_them():
    t = targets(_record())
    assert t["all_hold"], t
    assert t["checks"]["mean_gain"]["value"] == pytest.approx(21.0)


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("tool_calls_solved_cut_frac", 0.24, "calls_cut_every_seed"),
        ("mixed_version_frac", 0.19, "mixed_every_seed"),
        ("accuracy_gain_se", 11.0, "every_seed_interval_above_0"),
    ],
)
def test_one_seed_missing_a_target_fails_it(field, value, check):
    rec = _record()
    rec["seeds"][1][field] = value
    t = targets(rec)
    assert not t["checks"][check]["holds"] and not t["all_hold"]


def test_a_tier_that_falls_fails_no_tier_falls():
    rec = _record()
    rec["seeds"][2]["per_tier"]["1"]["gain_points"] = -1.6
    assert not targets(rec)["checks"]["no_tier_falls"]["holds"]


def test_plot_is_written(tmp_path):
    png = plot_learning(_record(), tmp_path / "learning.png")
    assert png.stat().st_size > 10_000


def _traj(tid: str, task: str, **metrics: float):
    from provrl.provenance import TrajectoryBuilder

    b = TrajectoryBuilder(tid, task)
    b.add_prompt([1, 2, 3])
    b.add_actions([4, 5], logprob=[-0.1, -0.2], kept_mass=[1.0, 1.0], version=[0, 0],
                  kv_min=[0, 0], kv_max=[0, 0], replica=0)  # fmt: skip
    t = b.build()
    t.metrics.update(metrics)
    return t


def _eval_dir(d, rows, world="/w/seed1234-d5000-abc"):
    import json

    from provrl.trajlog import TrajectoryWriter

    d.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(d / "trajectories.jsonl") as w:
        for i, (task, tier, em, calls) in enumerate(rows):
            w.write(_traj(f"{task}-{i}", task, tier=tier, exact_match=em, num_tool_calls=calls))
    (d / "eval.json").write_text(json.dumps({"world": world}))


def test_summarize_finished_reads_the_seeds_that_finished(tmp_path):
    import json

    from provrl.bench.learning import summarize_finished

    warm = [("a", 1, 1, 2), ("a", 1, 1, 4), ("b", 2, 1, 4), ("b", 2, 0, 4)]
    rl = [("a", 1, 1, 2), ("a", 1, 1, 2), ("b", 2, 1, 2), ("b", 2, 1, 2)]
    _eval_dir(tmp_path / "shared" / "eval" / "warmstart", warm)
    _eval_dir(tmp_path / "world2-warmstart", warm)
    s0 = tmp_path / "seed-0"
    _eval_dir(s0 / "eval" / "rl", rl)
    _eval_dir(s0 / "world2-rl", rl)
    (s0 / "rl").mkdir(parents=True)
    (s0 / "rl" / "done.json").write_text("{}")
    steps = [{"step": 1, "trained": ["x", "y", "z", "w"], "mixed_version_trajectories": 1}]
    (s0 / "rl" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (tmp_path / "seed-1" / "rl").mkdir(parents=True)  # RL still running: no eval yet
    rec = summarize_finished(tmp_path, "default", [], 4)
    assert rec["partial"] == {"finished_seeds": [0], "missing": [1]}
    assert rec["world2_seed"] == 1234
    (row,) = rec["seeds"]
    assert row["accuracy_gain_points"] == pytest.approx(100 * (1.0 - 0.75))
    assert row["tool_calls_solved_cut_frac"] == pytest.approx(1 - 2 / (10 / 3))
    assert row["mixed_version_frac"] == pytest.approx(0.25)
    assert row["per_tier"]["2"]["gain_points"] == pytest.approx(50.0)
    assert rec["mean"]["wall_s"] is None
    json.dumps(rec, allow_nan=False)


def test_a_repeat_is_a_search_or_open_the_episode_already_ran():
    """``repeated_call`` (dev/learning ``repeat_share``) counts by the env's rule
    (``repeat_count``, the episode's ``num_repeat_calls``): the same call up to case and
    spacing after a successful run of it; a failed or limit-refused call is no repeat."""
    from types import SimpleNamespace

    from provrl.bench.learning import repeated_call
    from provrl.provenance import ToolCall
    from provrl.rollout.agent import CALL_LIMIT

    def episode(*calls: ToolCall) -> SimpleNamespace:
        return SimpleNamespace(tool_calls=list(calls))

    ran, again = ToolCall(0, "search", "Harbor  Town"), ToolCall(1, "search", "harbor town")
    failed = ToolCall(0, "search", "harbor town", ok=False, error="search failed")
    refused = ToolCall(1, "search", "harbor town", ok=False, error=CALL_LIMIT)
    assert repeated_call(episode(ran, again))
    assert not repeated_call(episode(failed, again))  # the first never ran
    assert not repeated_call(episode(ran, refused))  # refused for the call limit
    assert not repeated_call(episode(ran, ToolCall(1, "open", "harbor town")))


def test_an_eval_summary_gives_the_calls_made_after_the_answer_per_tier(tmp_path):
    """Per tier, the mean ``calls_after_answer`` of solved episodes; None where no episode
    carries the metric (logs written before it), so the record stays JSON."""
    import json

    from provrl.bench.learning import _eval_summary
    from provrl.trajlog import TrajectoryWriter

    with TrajectoryWriter(tmp_path / "trajectories.jsonl") as w:
        for i, (tier, em, after) in enumerate([(1, 1, 1), (1, 1, 0), (1, 0, 3), (2, 1, None)]):
            extra = {} if after is None else {"calls_after_answer": after}
            w.write(_traj(f"t{i}", f"task{i}", tier=tier, exact_match=em, num_tool_calls=2, **extra))  # fmt: skip
    tiers = _eval_summary(tmp_path)["per_tier"]
    assert tiers["1"]["calls_after_answer_solved"] == pytest.approx(0.5)  # the failure is out
    assert tiers["2"]["calls_after_answer_solved"] is None
    json.dumps(tiers, allow_nan=False)
    # logs from before the hop metrics have no failure table
    assert tiers["1"]["failure_modes"] == tiers["2"]["failure_modes"] == {}


def test_an_eval_summary_says_where_each_tier_failed(tmp_path):
    from provrl.bench.learning import _eval_summary
    from provrl.trajlog import TrajectoryWriter

    hop = {"answered": 1, "num_tool_calls": 2, "hops": 2}
    rows = [(1, 1, 0), (2, 0, 1), (2, 0, 2), (2, 1, 2)]  # (tier, exact_match, hops found)
    with TrajectoryWriter(tmp_path / "trajectories.jsonl") as w:
        for i, (tier, em, found) in enumerate(rows):
            m = {**hop, "hops_found": found, "calls_after_hop": 0}
            w.write(_traj(f"t{i}", f"task{i}", tier=tier, exact_match=em, **m))
    tiers = _eval_summary(tmp_path)["per_tier"]
    assert tiers["1"]["failure_modes"]["samples"] == 1
    t2 = tiers["2"]["failure_modes"]
    assert t2["samples"] == 3 and t2["stopped_after_partial"] == t2["answer_shown"] == 1 / 3


def test_a_resumed_benchmark_keeps_its_second_world(tmp_path):
    """The second world's seed is drawn once and kept in the benchmark directory: a resume
    (drawn or given the same seed) evaluates on the same world; another seed is refused."""
    from provrl.bench.learning import second_world_seed

    first = second_world_seed(tmp_path, None)
    assert 1_000 <= first < 1_000_000
    assert second_world_seed(tmp_path, None) == first == second_world_seed(tmp_path, first)
    with pytest.raises(ValueError, match=r"world2_seed\.json"):
        second_world_seed(tmp_path, first + 1)
    other = tmp_path / "other"
    other.mkdir()
    assert second_world_seed(other, 77) == 77 == second_world_seed(other, None)


def test_the_watches_count_what_a_run_has_done(tmp_path):
    """The benchmark's progress bars: RL steps until all are done, then eval episodes; a
    partial last line (a record being written) is not counted."""
    from provrl.bench.learning import _run, watch_eval, watch_run

    d = tmp_path / "seed-0"
    w = watch_run(d, steps=3, eval_episodes=8)
    assert w() == ("rl steps", 0, 3)
    (d / "rl").mkdir(parents=True)
    (d / "rl" / "steps.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3')
    assert w() == ("rl steps", 2, 3)
    (d / "rl" / "steps.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    (d / "eval" / "rl").mkdir(parents=True)
    (d / "eval" / "rl" / "trajectories.jsonl").write_text("{}\n" * 5)
    assert w() == ("eval episodes", 5, 8)
    assert watch_eval(d / "eval" / "rl", None)() == ("eval episodes", 5, None)
    # a watched subprocess still returns its wall time and peak RSS
    out = _run(["--help"], tmp_path / "help.log", w, "help")
    assert out["wall_s"] > 0 and out["peak_rss_gb"] > 0


def test_the_shared_watch_counts_sft_steps_then_probe_then_eval_episodes(tmp_path):
    """The shared run's bar: the warm start's SFT steps out of the total its metrics lines
    carry, then the probe's episodes, then the evaluation's."""
    from provrl.bench.learning import watch_shared

    w = watch_shared(tmp_path, probe_episodes=512, eval_episodes=496)
    assert w() == ("sft steps", 0, None)
    (tmp_path / "warmstart").mkdir()
    lines = '{"step": 1, "sft/total_steps": 48}\n{"step": 2, "sft/total_steps": 48}\n{"st'
    (tmp_path / "warmstart" / "metrics.jsonl").write_text(lines)
    assert w() == ("sft steps", 2, 48)
    (tmp_path / "warmstart" / "done.json").write_text("{}")
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "trajectories.jsonl").write_text("{}\n" * 7)
    assert w() == ("probe episodes", 7, 512)
    (tmp_path / "probe" / "done.json").write_text("{}")
    (tmp_path / "eval" / "warmstart").mkdir(parents=True)
    (tmp_path / "eval" / "warmstart" / "trajectories.jsonl").write_text("{}\n" * 3)
    assert w() == ("eval episodes", 3, 496)


def test_a_record_read_back_from_json_with_nulls_is_checked_and_drawn(tmp_path):
    """Strict JSON writes NaN as null (a kept seed row, a results file): a seed that solved
    nothing has no calls per solved task. Its targets fail, nothing raises."""
    import json

    rec = json.loads(json.dumps(_record()))
    rec["seeds"][0]["tool_calls_solved_cut_frac"] = None
    rec["seeds"][0]["per_tier"]["2"]["rl_tool_calls_solved"] = None
    rec["mean"]["accuracy_gain_points"] = None
    t = targets(rec)
    assert not t["checks"]["calls_cut_every_seed"]["holds"]
    assert t["checks"]["mean_gain"]["holds"]  # from the rows, not the stored mean
    assert plot_learning(rec, tmp_path / "l.png").stat().st_size > 10_000


def test_the_docs_tables_link_every_figure_to_the_record(tmp_path):
    """learning_markdown: the per-seed and targets tables of a record, each figure a link
    that tests/test_results.py's checks accept against the record (and none unlinked)."""
    import json

    from provrl.bench.learning_report import learning_markdown
    from provrl.bench.results import check_figure_links, run_record, unlinked_figures

    rec = _record()
    rec["seeds"][1]["per_tier"]["2"]["gain_points"] = -4.0  # a tier that fell
    rec["seeds"][2]["tool_calls_solved_cut_frac"] = None  # NaN in the record: no link
    rec["targets"] = targets(rec)
    (tmp_path / "results").mkdir()
    rec = run_record("learning", rec, config={"seeds": 3}, seeds=[0, 1, 2])
    (tmp_path / "results" / "learning.json").write_text(json.dumps(rec))
    doc = tmp_path / "docs" / "pipeline.md"
    text = learning_markdown(rec)
    assert check_figure_links(doc, text, tmp_path) == []
    assert unlinked_figures(doc, "## Measured results\n\n" + text) == []
    assert "[+20.0](../results/learning.json#seeds.0.accuracy_gain_points)" in text
    assert "[30](../results/learning.json#seeds.0.tool_calls_solved_cut_frac*100) %" in text
    assert "falls: seed 1 tier 2 | no |" in text
    assert "accuracy) | – | [22](" in text  # seed 2's cut is NaN: shown as –, no link
