"""Evaluation: pass@k estimator, oracle at its minimum, a model run end to end, the CLI."""

from __future__ import annotations

import json
from math import comb

import pytest
from typer.testing import CliRunner

from provrl.cli import app
from provrl.env.config import AgentConfig, EnvConfig, EvalConfig
from provrl.rollout.evaluate import evaluate, pass_at_k, select_tasks
from provrl.trajlog import read_all


def test_pass_at_k_hand_values():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(2 / 8)
    # 1 − C(6, 2)/C(8, 2) = 1 − 15/28
    assert pass_at_k(8, 2, 2) == pytest.approx(1 - 15 / 28)
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - comb(3, 3) / comb(5, 3))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_oracle_eval_accuracy_one_at_minimum_tool_calls(small_world, tmp_path):
    cfg = EnvConfig(eval=EvalConfig(split="test", k=4))
    s = evaluate("oracle", small_world, cfg, tmp_path, progress=False)
    assert s["accuracy"] == 1.0 and s["pass@4"] == 1.0
    assert s["mean_tool_calls"] == pytest.approx(s["mean_min_searches"])
    assert s["K_histogram"] == {"0": 0, "1": 0, "2": 0, "3": 0, "4": s["tasks"]}
    for tier, blk in s["per_tier"].items():
        if blk["tasks"]:
            assert blk["mean_tool_calls"] == blk["mean_min_searches"]
            assert (blk["mean_tool_calls"] == 1.0) == (tier == "1")
    trajs = read_all(tmp_path / "trajectories.jsonl")
    assert len(trajs) == s["tasks"]
    assert json.loads((tmp_path / "eval.json").read_text())["accuracy"] == 1.0


def test_model_eval_end_to_end(small_world, tmp_path):
    cfg = EnvConfig(
        agent=AgentConfig(max_new_tokens=12, max_turns=2, shots=1),
        eval=EvalConfig(split="dev", n=3, k=2, concurrency=4),
    )
    s = evaluate("tiny", small_world, cfg, tmp_path, progress=False)
    assert s["tasks"] == 3 and s["samples"] == 6
    assert sum(s["K_histogram"].values()) == 3
    assert 0.0 <= s["accuracy"] <= s["pass@2"] <= 1.0
    trajs = read_all(tmp_path / "trajectories.jsonl")
    assert len(trajs) == 6 and {t.policy.name for t in trajs} == {"tiny"}
    # the worked example is a train task's oracle dialogue, in the prompt
    prompt = trajs[0].token_id[: trajs[0].segments[0].end]
    from provrl.models import load_tokenizer

    text = load_tokenizer().decode(prompt)
    assert text.count("Question:") == 2 and "<search>" in text and "<answer>" in text
    assert s["mean_tokens"] == pytest.approx(sum(len(t) for t in trajs) / 6)
    # strict JSON (RFC 8259): a statistic that does not exist is null, never NaN
    text = (tmp_path / "eval.json").read_text()
    strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"eval.json holds {c}"))
    if s["accuracy"] == 0:  # the random tiny model solves nothing
        assert strict["mean_tool_calls_solved"] is None


def test_select_tasks_is_seeded_subset():
    xs = list(range(100))
    a, b = select_tasks(xs, 10, 0), select_tasks(xs, 10, 0)  # type: ignore[arg-type]
    assert a == b == sorted(a) and len(set(a)) == 10
    assert select_tasks(xs, 0, 0) == xs  # type: ignore[arg-type]


def test_cli_world_and_oracle_eval(tmp_path):
    runner = CliRunner()
    w = tmp_path / "w"
    r = runner.invoke(
        app,
        ["world", "--out", str(w), "--docs", "300", "--entities", "150", "--tasks", "60", "--json"],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tasks"]["kept"] == 60
    r = runner.invoke(
        app,
        [
            "eval",
            "--policy",
            "oracle",
            "--world",
            str(w),
            "--split",
            "train",
            "--json",
            "--run-dir",
            str(tmp_path / "run"),
        ],
    )
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["accuracy"] == 1.0 and s["mean_tool_calls"] == s["mean_min_searches"]
    r = runner.invoke(
        app,
        [
            "eval",
            "--world",
            str(w),
            "--split",
            "train",
            "--tiers",
            "3",
            "--n",
            "5",
            "--json",
            "--run-dir",
            str(tmp_path / "r3"),
        ],
    )
    s = json.loads(r.output)
    assert s["tasks"] == 5 and s["per_tier"]["3"]["tasks"] == 5 and s["mean_min_searches"] >= 3
    r = runner.invoke(
        app, ["world", "--out", str(w), "--docs", "300", "--entities", "150", "--json"]
    )
    assert r.exit_code != 0 and "exists" in str(r.exception)


def test_rerun_into_the_same_run_dir_resumes_and_never_duplicates(small_world, tmp_path):
    """Issue 13 item 4: re-running `provrl eval` into a run directory appended every task
    again (210 duplicate traj_ids after one rerun). It now resumes from its log."""
    cfg = EnvConfig(
        agent=AgentConfig(max_new_tokens=8, max_turns=2),
        eval=EvalConfig(split="dev", n=3, k=2, concurrency=4),
    )
    first = evaluate("tiny", small_world, cfg, tmp_path, progress=False)
    again = evaluate("tiny", small_world, cfg, tmp_path, progress=False)
    log = tmp_path / "trajectories.jsonl"
    ids = [t.traj_id for t in read_all(log)]
    assert len(ids) == len(set(ids)) == 6
    assert again["samples"] == first["samples"] == 6 and again["accuracy"] == first["accuracy"]
    assert json.loads((tmp_path / "eval.json").read_text())["samples"] == 6
    cfg.eval.n = 5  # another selection: samples already in the log are reused, not rerun
    more = evaluate("tiny", small_world, cfg, tmp_path, progress=False)
    ids = [t.traj_id for t in read_all(log)]
    assert len(ids) == len(set(ids)) and more["samples"] == 10
    oracle_dir = tmp_path / "oracle"
    for _ in range(2):
        s = evaluate("oracle", small_world, EnvConfig(), oracle_dir, progress=False)
    ids = [t.traj_id for t in read_all(oracle_dir / "trajectories.jsonl")]
    assert len(ids) == len(set(ids)) == s["tasks"]
