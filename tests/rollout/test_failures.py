"""provrl.rollout.failures: the hops an episode's results showed, each failed episode's one
mode, the per-tier table, its backfill from logged observations and ``provrl failures``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from provrl.cli import app
from provrl.env.config import AgentConfig, EnvConfig, EvalConfig
from provrl.rollout.evaluate import evaluate, summarize_run
from provrl.rollout.failures import MODES, failure_mode, failure_table, hop_metrics, hops_found
from provrl.trajlog import read_all

REVEALS = ["Pantourk Observatory", "Worwadale"]  # a two-hop plan; the last reveal is the answer
ANSWERS = ["Worwadale", "Worwadale City"]


def test_hops_found_counts_the_plan_in_order_and_the_calls_after():
    r1 = "1. The Winter Quarry was released by the Pantourk Observatory."
    r2 = "2. The Pantourk Observatory is headquartered in Worwadale."
    assert hops_found([], REVEALS, ANSWERS) == (0, 0)
    assert hops_found(["nothing here", None], REVEALS, ANSWERS) == (0, 0)
    assert hops_found([r1], REVEALS, ANSWERS) == (1, 0)  # stopped after the first hop
    assert hops_found([r1, "no match", "still none"], REVEALS, ANSWERS) == (1, 2)
    assert hops_found(["x", r1, r2, "y"], REVEALS, ANSWERS) == (2, 1)
    # hop 2 is found only after hop 1: a result naming the answer alone does not count
    assert hops_found(["Worwadale is a city"], REVEALS, ANSWERS) == (0, 0)
    # whole words, normalised: 'Pantourk Observatory's' and a case change still match
    assert hops_found(["THE PANTOURK OBSERVATORY, founded"], REVEALS, ANSWERS) == (1, 0)
    assert hops_found(["Pantourk Observatoryx"], REVEALS, ANSWERS) == (0, 0)
    # the last hop matches any gold answer (an alias)
    assert hops_found([r1, "in Worwadale City"], REVEALS, ANSWERS) == (2, 0)
    assert hop_metrics([r1], [], ANSWERS) == {}  # no oracle plan: no hop metrics
    assert hop_metrics([r1], REVEALS, ANSWERS) == {
        "hops": 2.0,
        "hops_found": 1.0,
        "calls_after_hop": 0.0,
    }


def _m(em=0.0, answered=1.0, calls=2.0, hops=2.0, found=0.0, after=0.0):
    return {"exact_match": em, "answered": answered, "num_tool_calls": calls, "hops": hops,
            "hops_found": found, "calls_after_hop": after}  # fmt: skip


def test_each_failure_has_exactly_one_mode_checked_in_order():
    assert failure_mode(_m(em=1.0, found=2)) is None  # solved
    assert failure_mode({"exact_match": 0.0, "answered": 0.0}) is None  # no oracle plan
    assert failure_mode(_m(answered=0.0, found=2)) == "unanswered"
    assert failure_mode(_m(calls=0.0)) == "no_search"
    assert failure_mode(_m(found=2)) == "answer_shown"
    assert failure_mode(_m(found=0, after=0)) == "first_hop_missed"
    assert failure_mode(_m(found=1, after=0)) == "stopped_after_partial"
    assert failure_mode(_m(found=1, after=2)) == "later_hop_missed"


def test_the_table_shares_and_the_accuracy_add_up_to_one():
    samples = [
        _m(em=1.0, found=2),
        _m(found=1),
        _m(found=1, after=1),
        _m(found=2),
        {"exact_match": 0.0},
    ]  # fmt: skip  (the last: a task without a plan)
    t = failure_table(samples)
    assert t["samples"] == 4
    assert t["stopped_after_partial"] == t["later_hop_missed"] == t["answer_shown"] == 0.25
    assert 0.25 + sum(t[k] for k in MODES) == pytest.approx(1.0)  # 1 solved of 4
    assert failure_table([{"exact_match": 1.0}]) == {}


def test_a_model_episode_records_its_hops_and_the_eval_tabulates_them(small_world, tmp_path):
    cfg = EnvConfig(
        agent=AgentConfig(max_new_tokens=12, max_turns=2),
        eval=EvalConfig(split="dev", n=4, k=2, concurrency=4),
    )
    s = evaluate("tiny", small_world, cfg, tmp_path, progress=False)
    trajs = read_all(tmp_path / "trajectories.jsonl")
    assert all(t.metrics["hops"] >= 1 and "calls_after_hop" in t.metrics for t in trajs)
    assert all(0 <= t.metrics["hops_found"] <= t.metrics["hops"] for t in trajs)
    fm = s["failure_modes"]
    assert fm["samples"] == s["samples"] == 8
    assert s["accuracy"] + sum(fm[k] for k in MODES) == pytest.approx(1.0)


def test_logs_without_hop_metrics_get_them_from_their_observations(small_world, tmp_path):
    """The oracle's traces carry no hop metrics; decoded, each one's results show its whole
    plan, with no call after the last hop (the oracle answers at once)."""
    cfg = EnvConfig(eval=EvalConfig(split="test", n=12, k=1))
    evaluate("oracle", small_world, cfg, tmp_path, progress=False)
    assert all("hops" not in t.metrics for t in read_all(tmp_path / "trajectories.jsonl"))
    s = summarize_run(tmp_path)
    assert s["failure_modes"]["samples"] == 12 and s["accuracy"] == 1.0
    assert all(s["failure_modes"][k] == 0 for k in MODES)
    out = tmp_path / "failures.json"
    r = CliRunner().invoke(app, ["failures", str(tmp_path), "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    table = json.loads(r.output)[str(tmp_path)]
    assert table["all"]["samples"] == 12 and table["all"]["accuracy"] == 1.0
    r = CliRunner().invoke(app, ["failures", str(tmp_path), "--names", "oracle", "--json"])
    assert list(json.loads(r.output)) == ["oracle"]
    rec = json.loads(out.read_text())
    assert rec["modes"] == list(MODES) and rec["benchmark"] == "failures" and "commit" in rec


def test_a_directory_without_an_evaluation_is_one_line(tmp_path, capsys):
    from provrl.cli.entry import main

    assert main(["failures", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "eval.json: not an evaluation's summary" in err
