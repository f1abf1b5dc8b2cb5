"""`provrl run --preset quick` end to end on the tiny model, both RL modes, the staleness
bound, and resume after a kill at every stage (the crash-consistency contract of the run
directory: no trajectory lost, none trained twice, no version number reused)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from provrl.cli import app
from provrl.trajlog import read_all

# the quick preset, made smaller still: what every test here starts from
FAST = [
    "pipeline.rl.steps=3",
    "pipeline.eval.policies=[warmstart, rl]",
    "pipeline.tasks.eval=4",
    "pipeline.eval.k=1",
]


def _run(run_dir: Path, *extra: str) -> None:
    sets = [x for kv in [*FAST, *extra] for x in ("--set", kv)]
    res = CliRunner().invoke(
        app,
        ["run", "--preset", "quick", "--no-progress", "--set", f"logging.run_dir={run_dir}", *sets],
    )
    assert res.exit_code == 0, res.output


def _subprocess(run_dir: Path, failpoint: str | None, *extra: str, resume: bool = False):
    env = dict(os.environ)
    env.pop("PROVRL_FAILPOINT", None)
    if failpoint:
        env["PROVRL_FAILPOINT"] = failpoint
    sets = [x for kv in [*FAST, *extra] for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "provrl.cli", "run", "--no-progress"]
    cmd += (
        ["--resume", str(run_dir)]
        if resume
        else ["--preset", "quick", "--set", f"logging.run_dir={run_dir}", *sets]
    )
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "rl" / "steps.jsonl").read_text().splitlines()]


def _check_consistent(run_dir: Path, max_lag: int = 1) -> None:
    """The run directory's invariants after any history of kills and resumes."""
    rl = json.loads((run_dir / "rl" / "done.json").read_text())
    log = read_all(run_dir / "rl" / "trajectories.jsonl")
    ids = [t.traj_id for t in log]
    assert len(ids) == len(set(ids)), "a trajectory was written twice"
    ckpt = Path(rl["checkpoint"])
    state = json.loads((ckpt / "state.json").read_text())
    trained = state["trained"]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    assert set(trained) <= set(ids), "a trained trajectory is missing from the log"
    assert not set(trained) & set(state["dropped"])
    steps = _steps(run_dir)
    assert [int(s["version"]) for s in steps] == list(range(1, rl["steps"] + 1)), (
        "a version number was reused or skipped"
    )
    assert all(s["max_lag"] <= max_lag for s in steps)
    final = rl["final_version"]
    for t in log:
        v = t.version[t.is_action]
        assert (v <= final).all()
        assert (np.diff(v) >= 0).all()  # versions never go back within a trajectory


def test_quick_run_end_to_end_async(tmp_path):
    _run(tmp_path)
    for stage in ("world", "warmstart", "probe", "filter", "rl", "eval", "report"):
        assert (tmp_path / stage / "done.json").is_file(), stage
    ev = json.loads((tmp_path / "eval" / "done.json").read_text())
    assert {"warmstart", "rl"} <= set(ev)
    pools = json.loads((tmp_path / "filter" / "done.json").read_text())
    probe = json.loads((tmp_path / "probe" / "done.json").read_text())
    assert sum(pools["sizes"].values()) == len(probe["K"])  # every task in exactly one pool
    rl = json.loads((tmp_path / "rl" / "done.json").read_text())
    assert rl["mode"] == "async" and rl["steps"] == 3 and rl["final_version"] == 3
    _check_consistent(tmp_path)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Test split" in report and (tmp_path / "report" / "rl_curves.png").is_file()
    assert "Probe and filter" in report and "paired over 4 tasks" in report
    assert (tmp_path / "filter" / "retention.png").is_file() and "retention" in pools
    assert set(ev["rl"]["task_accuracy"]) == set(ev["warmstart"]["task_accuracy"])
    # a rerun of the finished run does nothing new and duplicates nothing
    n = len(read_all(tmp_path / "rl" / "trajectories.jsonl"))
    _run(tmp_path)
    assert len(read_all(tmp_path / "rl" / "trajectories.jsonl")) == n


def test_async_respects_max_lag_zero_and_two(tmp_path):
    for lag in (0, 2):
        d = tmp_path / f"lag{lag}"
        _run(d, f"pipeline.rl.max_lag={lag}", "pipeline.eval.policies=[]")
        _check_consistent(d, max_lag=lag)
        # recompute every trained token's lag from the log: version of the step it fed − v_t
        fed = {}
        for s in _steps(d):
            for i in s["trained"]:
                fed[i] = int(s["version"]) - 1
        for t in read_all(d / "rl" / "trajectories.jsonl"):
            if t.traj_id in fed:
                assert (fed[t.traj_id] - t.version[t.is_action] <= lag).all()
        assert fed


def test_sync_trains_only_tokens_of_the_current_version(tmp_path):
    _run(tmp_path, "pipeline.rl.mode=sync", "pipeline.eval.policies=[]")
    _check_consistent(tmp_path, max_lag=0)
    steps = _steps(tmp_path)
    assert all(set(s["lag_histogram"]) == {"0"} for s in steps)
    assert all(s["mixed_version_trajectories"] == 0 for s in steps)
    log = read_all(tmp_path / "rl" / "trajectories.jsonl")
    by_version = Counter(int(t.version[t.is_action].max()) for t in log if t.num_actions)
    assert set(by_version) <= {0, 1, 2}  # each batch sampled by one version, before its step


@pytest.mark.parametrize(
    "failpoint",
    ["collector.written:3", "rl.saved:1", "engine.hotload:2", "collector.written:40"],
    ids=["probe", "rl-after-save", "rl-during-hotload", "rl-rollout"],
)
def test_kill_and_resume_is_consistent(tmp_path, failpoint):
    p = _subprocess(tmp_path, failpoint)
    out = p.communicate(timeout=600)[0].decode()
    assert p.returncode == -9, f"the failpoint did not fire:\n{out[-2000:]}"
    p = _subprocess(tmp_path, None, resume=True)
    out = p.communicate(timeout=600)[0].decode()
    assert p.returncode == 0, out[-3000:]
    _check_consistent(tmp_path)
    if failpoint.startswith("collector.written:3"):  # killed during the probe
        ref = tmp_path.parent / "uninterrupted"
        _run(ref, "pipeline.eval.policies=[]", "pipeline.rl.steps=0")
        for pool in ("kept", "unsolved", "solved"):
            a = (tmp_path / "filter" / f"{pool}.jsonl").read_text()
            assert a == (ref / "filter" / f"{pool}.jsonl").read_text(), pool


def test_kill_during_sft_and_resume(tmp_path):
    """Killed (SIGKILL, a failpoint: no race with the clock) after SFT's second step is
    trained and logged, with steps still to go, the resumed run finishes every stage."""
    p = _subprocess(tmp_path, "sft.step:2", "sft.epochs=2", "pipeline.eval.policies=[]")
    out = p.communicate(timeout=900)[0].decode()
    assert p.returncode == -signal.SIGKILL, out[-3000:]
    rows = (tmp_path / "warmstart" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) >= 2 and not (tmp_path / "warmstart" / "done.json").exists()
    p = _subprocess(tmp_path, None, resume=True)
    out = p.communicate(timeout=900)[0].decode()
    assert p.returncode == 0, out[-3000:]
    teacher = read_all(tmp_path / "warmstart" / "teacher.jsonl")
    assert len({t.traj_id for t in teacher}) == len(teacher)
    _check_consistent(tmp_path)


def test_malformed_config_fails_before_any_work(tmp_path):
    d = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--preset",
            "quick",
            "--set",
            f"logging.run_dir={d}",
            "--set",
            "pipeline.rl.stepz=3",
        ],
    )
    assert res.exit_code != 0
    assert "pipeline.rl.stepz" in str(res.exception) + res.output
    assert not d.exists()


def test_resume_refuses_a_changed_config(tmp_path):
    _run(tmp_path, "pipeline.rl.steps=0", "pipeline.eval.policies=[]")
    res = CliRunner().invoke(
        app, ["run", "--resume", str(tmp_path), "--set", "pipeline.rl.steps=5", "--no-progress"]
    )
    assert res.exit_code != 0
    assert "pipeline.rl.steps" in str(res.exception) + res.output


def test_resume_accepts_a_config_written_before_fields_were_added(tmp_path):
    """A field added to RunConfig since the run started is absent from its config.yaml; it
    reads as its default, so the resume goes on (a changed value would still be refused)."""
    import yaml

    _run(tmp_path, "pipeline.rl.steps=0", "pipeline.eval.policies=[]")
    p = tmp_path / "config.yaml"
    old = yaml.safe_load(p.read_text())
    del old["ray"], old["env"]["search"]["passage_words"]
    p.write_text(yaml.safe_dump(old))
    _run(tmp_path, "pipeline.rl.steps=0", "pipeline.eval.policies=[]")
    assert yaml.safe_load(p.read_text())["ray"]  # written back in full
