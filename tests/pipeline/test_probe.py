"""`provrl probe` / `provrl filter` on the tiny model and the small world: pools, manifest,
staleness, resume after kill -9, and one-line errors for broken probe directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provrl.cli import app
from provrl.filtering import FilterError
from provrl.trajlog import read_all

QUICK = ["--preset", "quick", "--policy", "tiny", "--no-progress"]


def _probe(out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(
        app, ["probe", "--out", str(out), *QUICK, "--n", "5", "--k", "3", *extra]
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    return json.loads((out / "probe.json").read_text())


def _filter(probe_dir: Path, *extra: str):
    return CliRunner().invoke(app, ["filter", str(probe_dir), *extra])


def test_probe_filter_sft_end_to_end(tmp_path):
    d = tmp_path / "probe"
    probe = _probe(d)
    assert probe["tasks"] == 5 and probe["k"] == 3
    log = read_all(d / "trajectories.jsonl")
    assert len(log) == 15 and len({t.traj_id for t in log}) == 15
    man = json.loads((d / "manifest.json").read_text())
    assert man["policy"]["fingerprint"] == "tiny-seed0"
    assert man["tools"]["fingerprint"].startswith("sha256:")
    assert man["k"] == 3 and man["tasks"]["n"] == 5 and man["sampling"]["temperature"] == 1.0
    rec = probe["records"][0]
    assert {"K", "successes", "mean_tool_calls", "mean_tokens"} <= set(rec)

    res = _filter(d, "--report")
    assert res.exit_code == 0, res.output
    f = json.loads((d / "filter" / "filter.json").read_text())
    probed = [json.loads(x)["task_id"] for x in (d / "tasks.jsonl").read_text().splitlines()]
    pooled = [
        json.loads(x)["task_id"]
        for p in ("kept", "unsolved", "solved")
        for x in (d / "filter" / f"{p}.jsonl").read_text().splitlines()
    ]
    assert sorted(pooled) == sorted(probed)  # every task in exactly one pool
    assert sum(f["sizes"].values()) == 5
    assert (d / "filter" / "retention.png").is_file()
    ret = json.loads((d / "filter" / "retention.json").read_text())
    assert sum(ret["K_histogram"]) == 5 and 0 <= ret["predicted_kept_frac"] <= 1

    # SFT on the policy's own probe traces (the tiny model solves nothing: take them all)
    res = CliRunner().invoke(
        app,
        [
            "sft",
            "--traces",
            str(d),
            "--model",
            "tiny",
            "--out",
            str(tmp_path / "ck"),
            "--selection",
            "all",
            "--batch-size",
            "8",
            "--warmup-steps",
            "0",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    last = res.output.strip().splitlines()[-1]
    sft = json.loads(last[last.index("{") :])
    assert sft["traces_selected"] == 15 - sft["duplicates_removed"]
    assert sft["origins_selected"] == {"policy": sft["traces_selected"]}  # labelled, not teacher


def test_manifest_tracks_policy_tools_and_sampling_and_stale_pools_are_refused(
    tmp_path, small_world
):
    from provrl.config import load_config
    from provrl.models import load_model, save_checkpoint
    from provrl.pipeline.probe import check_fresh, current_manifest
    from provrl.run_config import RunConfig

    cfg = load_config(RunConfig, "quick", [])
    now = lambda policy, c=cfg: current_manifest(  # noqa: E731
        policy, small_world, c.env, k=3, seed=0, dtype="float32"
    )
    base = now("tiny")
    ck = tmp_path / "ck"
    lm = load_model("tiny", seed=1)
    save_checkpoint(lm.model, lm.tokenizer, ck, kind="test")
    assert now(str(ck))["policy"]["fingerprint"] != base["policy"]["fingerprint"]
    for key, value, what in [
        ("env.search.k", "5", "tools"),
        ("env.search.snippet_words", "7", "tools"),
        ("env.agent.temperature", "0.7", "sampling"),
        ("env.agent.top_p", "0.9", "sampling"),
    ]:
        other = now("tiny", load_config(RunConfig, "quick", [f"{key}={value}"]))
        assert other[what] != base[what], key
        with pytest.raises(FilterError, match=f"stale filter pools: {what} changed"):
            check_fresh({"manifest": base}, other, allow=False)
        assert check_fresh({"manifest": base}, other, allow=True)  # told otherwise: reported
    assert check_fresh({"manifest": base}, now("tiny"), allow=False) == []


def test_probe_dir_refuses_another_configuration(tmp_path):
    d = tmp_path / "probe"
    _probe(d)
    res = CliRunner().invoke(
        app,
        [
            "probe",
            "--out",
            str(d),
            *QUICK,
            "--n",
            "5",
            "--k",
            "3",
            "--set",
            "env.agent.temperature=0.5",
        ],
    )
    assert res.exit_code != 0
    assert "sampling changed" in str(res.exception) + res.output


def _subprocess(out: Path, failpoint: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("PROVRL_FAILPOINT", None)
    if failpoint:
        env["PROVRL_FAILPOINT"] = failpoint
    cmd = [
        sys.executable,
        "-m",
        "provrl.cli",
        "probe",
        "--out",
        str(out),
        *QUICK,
        "--n",
        "5",
        "--k",
        "3",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_kill_during_probe_then_resume_gives_the_same_result(tmp_path):
    d = tmp_path / "killed"
    p = _subprocess(d, "collector.written:4")
    out = p.communicate(timeout=600)[0].decode()
    assert p.returncode == -9, f"the failpoint did not fire:\n{out[-2000:]}"
    written = read_all(d / "trajectories.jsonl")
    assert len(written) == 4 and not (d / "probe.json").exists()
    res = _filter(d)
    assert res.exit_code != 0 and "did not finish" in str(res.exception) + res.output
    p = _subprocess(d, None)
    out = p.communicate(timeout=600)[0].decode()
    assert p.returncode == 0, out[-3000:]
    probe = json.loads((d / "probe.json").read_text())
    assert probe["throughput"]["episodes_reused"] == 4  # none of the complete ones redone
    log = read_all(d / "trajectories.jsonl")
    assert len(log) == 15 and len({t.traj_id for t in log}) == 15
    assert {t.traj_id for t in written} <= {t.traj_id for t in log}  # nothing written was lost
    ref = _probe(tmp_path / "ref")
    assert probe["K"] == ref["K"]
    assert _filter(d).exit_code == 0 and _filter(tmp_path / "ref").exit_code == 0
    for pool in ("kept", "unsolved", "solved"):
        a = (d / "filter" / f"{pool}.jsonl").read_text()
        assert a == (tmp_path / "ref" / "filter" / f"{pool}.jsonl").read_text(), pool


def test_broken_probe_directories_fail_naming_the_file(tmp_path):
    d = tmp_path / "probe"
    _probe(d)
    (d / "probe.json").write_text('{"k": 3,\n "K": {"a": ')
    res = _filter(d)
    assert res.exit_code != 0
    msg = str(res.exception)
    assert "probe.json:2" in msg and "\n" not in msg
    (d / "probe.json").write_text(json.dumps({"k": 3, "K": {}, "manifest": {}}))
    res = _filter(d)
    assert "no K for task" in str(res.exception)
    res = _filter(tmp_path / "nowhere")
    assert "not a probe directory" in str(res.exception)
    # a corrupt line in the middle of the trajectory log: named on resume
    lines = (d / "trajectories.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:40] + "\n"
    (d / "trajectories.jsonl").write_text("".join(lines))
    (d / "probe.json").unlink()
    res = CliRunner().invoke(app, ["probe", "--out", str(d), *QUICK, "--n", "5", "--k", "3"])
    assert res.exit_code != 0
    assert "trajectories.jsonl:3" in str(res.exception)


def test_reprobe_of_a_pool_reports_transitions(tmp_path):
    d = tmp_path / "probe"
    _probe(d)
    assert _filter(d).exit_code == 0
    res = CliRunner().invoke(
        app,
        [
            "probe",
            "--out",
            str(tmp_path / "re"),
            "--pool",
            str(d / "filter" / "unsolved.jsonl"),
            *QUICK,
            "--k",
            "3",
            "--set",
            "env.agent.temperature=0.5",
        ],
    )
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    assert "tasks moved" in res.output
    f = json.loads((tmp_path / "re" / "filter" / "filter.json").read_text())
    n_unsolved = len((d / "filter" / "unsolved.jsonl").read_text().splitlines())
    assert sum(f["transitions"]["unsolved"].values()) == n_unsolved


def test_probe_takes_a_plain_qa_task_file(tmp_path, small_world):
    """Bring your own tasks: plain {question, answer} records are probed like world tasks."""
    from provrl.env.build import load_split

    rows = [
        {"id": f"q{i}", "question": t.question, "answer": t.answers}
        for i, t in enumerate(load_split(small_world, "train")[:3])
    ]
    f = tmp_path / "plain.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = tmp_path / "probe"
    res = CliRunner().invoke(app, ["probe", "--out", str(d), "--tasks", str(f), *QUICK, "--k", "2"])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    probe = json.loads((d / "probe.json").read_text())
    assert sorted(probe["K"]) == ["q0", "q1", "q2"]


def test_run_refuses_a_task_file_that_overlaps_the_test_split(tmp_path, small_world):
    from provrl.config import ConfigError, load_config
    from provrl.env.build import load_split
    from provrl.pipeline.run import slices
    from provrl.run_config import RunConfig

    train, test = load_split(small_world, "train"), load_split(small_world, "test")
    f = tmp_path / "mine.jsonl"
    rows = [{"question": t.question, "answer": t.answers} for t in (train[0], test[0])]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(RunConfig, "quick", [f"pipeline.tasks.file={f}"])
    with pytest.raises(ConfigError, match="also in the test split"):
        slices(train, test, cfg)
    f.write_text(json.dumps(rows[0]) + "\n")
    assert [t.question for t in slices(train, test, cfg)["probe"]] == [train[0].question]


def test_a_torn_log_of_the_finished_probe_stage_is_redone_on_resume(tmp_path):
    """Issue 38: a torn ``probe/trajectories.jsonl`` of a finished probe stage was never
    reopened, so a task's group stayed short for the filter and the curriculum. The resume
    says so in one line and redoes the stage, which reruns only the lost episode, with its
    own seed: the same trajectories and K as before."""
    from provrl.pipeline.run import _stage
    from provrl.pipeline.rundir import ResumeWarning, RunDir

    run = RunDir(tmp_path / "run")
    out = run.root / "probe"
    first = _stage(run, "probe", lambda: _probe(out))
    log = out / "trajectories.jsonl"
    before = {t.traj_id: t.reward for t in read_all(log)}
    log.write_bytes(log.read_bytes()[:-40])  # the last record torn
    with pytest.warns(ResumeWarning) as seen:
        again = _stage(run, "probe", lambda: _probe(out))
    lines = [str(w.message) for w in seen if w.category is ResumeWarning]
    assert len(lines) == 1 and "trajectories.jsonl" in lines[0] and "redone" in lines[0]
    assert {t.traj_id: t.reward for t in read_all(log)} == before
    assert [r["K"] for r in again["records"]] == [r["K"] for r in first["records"]]
    assert list(out.glob("trajectories.jsonl.torn-*"))  # nothing deleted
