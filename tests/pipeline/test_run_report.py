"""The run report on a synthetic run directory (no model): every PNG it links is produced,
every panel of the RL curves has data, per-tier accuracy per policy version is what the
trajectory log says, no NaN reaches the report or a JSON file, and the header names the
commit, the hardware and the config's difference from its preset."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from provrl.config import load_config
from provrl.pipeline.pin import config_text
from provrl.pipeline.run_report import rl_panels, rollout_accuracy, write_report
from provrl.pipeline.rundir import RunDir
from provrl.provenance import TrajectoryBuilder
from provrl.run_config.run import RunConfig
from provrl.trajlog import TrajectoryWriter


def strict_loads(text: str):
    """``json.loads`` that refuses NaN and ±Infinity, as RFC 8259 and JSON.parse do."""

    def refuse(c: str):
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


def _traj(tid: str, version: int, tier: int, em: float):
    b = TrajectoryBuilder(tid, f"task-{tid}")
    b.add_prompt([1, 2, 3])
    b.add_actions([4, 5], logprob=[-0.1, -0.2], kept_mass=[1.0, 1.0], version=version,
                  kv_min=version, kv_max=version, replica=0)  # fmt: skip
    return b.build(metrics={"exact_match": em, "tier": tier, "num_tool_calls": 1.0}, reward=em)


# (traj id, version of its first token, tier, exact match)
ROLLOUTS = [
    ("a", 0, 1, 1.0), ("b", 0, 1, 0.0), ("c", 0, 2, 0.0), ("d", 0, 2, 0.0),
    ("e", 1, 1, 1.0), ("f", 1, 1, 1.0), ("g", 1, 2, 1.0), ("h", 1, 2, 0.0),
    ("i", 2, 1, 1.0), ("j", 2, 2, 1.0),
]  # fmt: skip


def step(n: int, trained: list[str]) -> dict:
    return {
        "step": n, "version": n, "accuracy": 0.5, "tool_calls": 1.0, "tool_calls_solved": 1.0,
        "action_tokens": 30.0 + n, "mixed_version_trajectories": 0, "kv_stale_share": 0.0,
        "lag_histogram": {"0": 4, "1": n}, "max_lag": 1, "distinct_share": 0.9,
        "trained": trained, "pools": {"kept": 3, "unsolved": 1, "solved": n},
        "zero_signal_share": 0.25, "reward_mean": 0.1 * n, "entropy": 0.3 - 0.05 * n,
        "grad_norm": 1.0 + n, "grad_norm_max": 1.5 + n, "clip_frac": 0.01 * n,
        "masked_frac": 0.0, "ess_frac": 0.9, "log_w_mean": -0.1, "kl_q_pi_k3": 0.001,
        "ratio_q99": 1.2, "lag_mean": 0.5, "step_s": 2.0, "wall_s": 3.0 * n,
        "rss_mb": 700.0 + n,
    }  # fmt: skip


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A finished run's files, as the stages write them (steps, trajectories, eval and RL
    summaries), with a NaN where a real run has one: nothing solved by the base model."""
    cfg = load_config(RunConfig, "quick", ["pipeline.tasks.eval=4", f"logging.run_dir={tmp_path}"])
    (tmp_path / "config.yaml").write_text(config_text(cfg))
    rd = RunDir(tmp_path)
    rd.record_session(["provrl", "run", "--preset", "quick", "--set", "pipeline.tasks.eval=4"])
    (tmp_path / "rl").mkdir()
    with TrajectoryWriter(tmp_path / "rl" / "trajectories.jsonl") as w:
        for tid, v, tier, em in ROLLOUTS:
            w.write(_traj(tid, v, tier, em))
    steps = [step(1, ["a", "b", "c", "d"]), step(2, ["e", "f", "g", "h"]), step(3, ["i", "j"])]
    (tmp_path / "rl" / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    rd.mark_done(
        "rl",
        {
            "mode": "async", "steps": 3, "trajectories_trained": 10, "wall_s": 9.0,
            "trainer_busy_s": 6.0, "trainer_idle_frac": 0.33, "engine_busy_frac": 0.5,
            "collector": {"episodes": 10},
            "curriculum": {"pools": {"kept": 3}, "transitions": {}, "groups_started": 3},
            "zero_signal": {"zero_signal_groups": 1, "groups": 4, "groups_frac": 0.25,
                            "tokens_frac": 0.2, "trajectories_skipped": 0},
        },
    )  # fmt: skip
    per_tier = {"tasks": 2, "accuracy": 0.0, "mean_tool_calls_solved": math.nan}
    evals = {
        name: {
            "split": "test", "accuracy": acc, "accuracy_se": 0.1, "mean_tool_calls": 1.5,
            "mean_tool_calls_solved": calls, "mean_min_searches": 1.25, "mean_tokens": 300.0,
            "answered_rate": 1.0, "n": 4, "k": 2,
            "per_tier": {"1": per_tier, "2": per_tier},
            "task_accuracy": {"t1": acc, "t2": acc},
        }
        for name, acc, calls in (("base", 0.0, math.nan), ("rl", 0.5, 1.5))
    }  # fmt: skip
    rd.mark_done("eval", evals)
    return tmp_path


def test_every_report_png_is_produced_and_nothing_is_nan(run: Path):
    md = write_report(run).read_text()
    out = run / "report"
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", md)
    assert {"eval.png", "rl_curves.png", "version_lag.png", "pools.png"} <= set(linked)
    for png in linked:
        if not png.startswith("../"):  # the filter's retention plot is the filter's
            p = out / png
            assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert not re.search(r"\bnan\b", md, re.I), "a NaN reached the report"
    assert "| base | 0.000 ± 0.100 ± – | – |" in md  # no task-level SE: no eval log
    # strict JSON everywhere the stages and the report wrote
    for p in run.rglob("*.json"):
        strict_loads(p.read_text())
    ev = strict_loads((run / "eval" / "done.json").read_text())
    assert ev["base"]["mean_tool_calls_solved"] is None


def test_header_names_commit_hardware_and_config_diff(run: Path):
    md = write_report(run).read_text()
    head = md.split("## Test split")[0]
    assert re.search(r"- commit `[0-9a-f]{12}`|- commit `unknown`", head)
    assert "- hardware: " in head and "CPUs" in head and "GiB RAM" in head
    assert "preset `quick` (named on its command line) with 1 setting(s) changed" in head
    assert "| `pipeline.tasks.eval` | `6` | `4` |" in head
    RunDir(run).record_session(["provrl", "run", "--resume", str(run)])
    assert "- resumed " in write_report(run).read_text()


def test_rollout_accuracy_per_tier_by_version(run: Path):
    acc = rollout_accuracy(run)
    assert acc["all"] == {0: 0.25, 1: 0.75, 2: 1.0}
    assert acc["tier 1"] == {0: 0.5, 1: 1.0, 2: 1.0}
    assert acc["tier 2"] == {0: 0.0, 1: 0.5, 2: 1.0}


def test_every_rl_panel_has_data_and_steps_start_at_one(run: Path):
    from provrl.pipeline.steplog import read_steps

    panels = rl_panels(read_steps(run), rollout_accuracy(run))
    titles = [t for t, _, _ in panels]
    for want in ("policy entropy", "response length", "grad norm", "clip and mask", "signal",
                 "rollout accuracy per tier", "step time", "memory"):  # fmt: skip
        assert want in titles
    for title, _, lines in panels:
        assert any(np.isfinite(np.asarray(y, float)).any() for _, _, y in lines), title
    batch = dict((t, lines) for t, _, lines in panels)["batch reward"][0]
    assert list(batch[1]) == [1.0, 2.0, 3.0]  # the record's 1-based step, not its index
