"""`provrl run --preset quick --set backend=ray` end to end on the tiny model: the RL stage's
rollouts on two Ray replica actors (rolling hot-load), and a replica process killed with
SIGKILL in the middle of the RL stage — the run finishes, no trajectory is lost, written
twice or trained twice."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from typer.testing import CliRunner

from provrl.cli import app
from provrl.trajlog import read_all

# the quick preset on Ray, made smaller as in tests/pipeline (no held-out eval: it runs on
# the same replicas as the probe, which is checked below)
RAY = [
    "backend=ray",
    "ray.replicas=2",
    "ray.num_cpus=2",
    "ray.object_store_mb=256",
    "pipeline.rl.steps=3",
    "pipeline.eval.policies=[]",
    "pipeline.tasks.eval=4",
]


def _invoke(args: list[str]) -> str:
    res = CliRunner().invoke(app, ["run", "--no-progress", *args])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    return res.output


def _sets(extra: list[str]) -> list[str]:
    return [x for kv in extra for x in ("--set", kv)]


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("ray") / "run"
    _invoke(["--preset", "quick", *_sets([f"logging.run_dir={run}", *RAY])])
    return run


def _check(run: Path) -> tuple[dict, list]:
    """The RL stage's invariants on Ray; returns its summary and its trajectory log."""
    rl = json.loads((run / "rl" / "done.json").read_text())
    assert rl["steps"] == 3 and rl["final_version"] == 3
    log = read_all(run / "rl" / "trajectories.jsonl")
    ids = [t.traj_id for t in log]
    assert len(ids) == len(set(ids)), "a trajectory was written twice"
    state = json.loads((Path(rl["checkpoint"]) / "state.json").read_text())
    trained = state["trained"]
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    assert set(trained) <= set(ids), "a trained trajectory is missing from the log"
    steps = [json.loads(x) for x in (run / "rl" / "steps.jsonl").read_text().splitlines()]
    fed = [i for s in steps for i in s["trained"]]
    assert sorted(fed) == sorted(trained)
    # both replicas sampled trained tokens; each replica's versions only go up
    by_id = {t.traj_id: t for t in log}
    replicas: Counter[int] = Counter()
    for t in log:
        r, v = t.replica[t.is_action], t.version[t.is_action]
        for i in np.unique(r):
            assert (np.diff(v[r == i]) >= 0).all(), f"{t.traj_id}: replica {i} went back"
        assert not str(t.meta.get("finish", "")).startswith("engine_rejected"), t.meta
    for i in trained:
        replicas.update(by_id[i].replica[by_id[i].is_action].tolist())
    assert set(replicas) == {0, 1}
    # the trainer ran as an actor: its own process, its weights published from there
    assert rl["trainer"]["where"] == "ray-actor" and rl["trainer"]["pid"] != os.getpid()
    fleet = rl["ray"]
    assert fleet["replicas"] == 2 and fleet["schedule"] == "rolling"
    assert fleet["published_versions"] == 3
    for i in (0, 1):
        vs = [v for _, r, v in fleet["timeline"] if r == i]
        assert vs == sorted(vs) and vs[0] == 0 and vs[-1] == 3, fleet["timeline"]
    times = [t for t, _, _ in fleet["timeline"]]
    assert times == sorted(times)
    # the report's per-replica count of trained action tokens is the log's
    report = (run / "report" / "report.md").read_text()
    assert "## Ray replicas (RL stage)" in report
    assert (run / "report" / "ray_versions.png").is_file()
    for i in (0, 1):
        row = next(x for x in report.splitlines() if x.startswith(f"| {i} | v0 @"))
        assert row.rstrip(" |").endswith(f"| {replicas[i]}"), row
    assert sum(replicas.values()) == sum(by_id[i].num_actions for i in trained)
    return rl, log


def test_quick_run_on_ray_end_to_end(ray_run):
    for stage in ("world", "warmstart", "probe", "filter", "rl", "report"):
        assert (ray_run / stage / "done.json").is_file(), stage
    probe = json.loads((ray_run / "probe" / "done.json").read_text())
    assert probe["throughput"]["replicas"] == 2  # the probe's episodes ran on the Ray replicas
    rl, _ = _check(ray_run)
    assert rl["ray"]["faults"] == dict.fromkeys(
        ("deaths", "restarts", "turns_resubmitted", "turns_failed", "requests_reprefilled"), 0
    ) | {"recover_s_max": 0.0}
    assert 0 < rl["engine_busy_frac"] <= 1
    assert rl["engine"]["tokens_generated"] == sum(
        r["tokens_generated"] for r in rl["ray"]["per_replica"]
    )


def _replica_pids() -> list[int]:
    """Processes of this test's Ray whose title is an EngineReplica actor's."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith("ray::EngineReplica"):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_a_replica_killed_during_rl_is_restarted_and_nothing_is_lost(ray_run, tmp_path):
    """The same run's RL stage again (the stages before it copied from the run above),
    with one replica process SIGKILLed as soon as the first RL trajectory is written."""
    run = tmp_path / "run"
    shutil.copytree(ray_run, run, ignore=shutil.ignore_patterns("rl", "eval", "report"))
    log = run / "rl" / "trajectories.jsonl"
    killed: list[int] = []
    result: dict[str, object] = {}

    def go() -> None:
        try:
            result["out"] = _invoke(["--resume", str(run)])
        except BaseException as e:  # re-raised in the test thread
            result["error"] = e

    th = threading.Thread(target=go)
    th.start()
    t_end = time.perf_counter() + 300
    while th.is_alive() and time.perf_counter() < t_end and not killed:
        if log.is_file() and log.stat().st_size > 0:
            pids = _replica_pids()
            assert len(pids) == 2, pids
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
        time.sleep(0.05)
    th.join(600)
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    assert killed, "the RL stage ended before a replica could be killed"
    rl, log_trajs = _check(run)
    f = rl["ray"]["faults"]
    assert f["deaths"] == 1 and f["restarts"] == 1 and f["turns_failed"] == 0, f
    # 8 agent loops over 2 replicas: the dead process held some of them (generating: the
    # turn is resubmitted; between turns: the next turn re-prefills its context)
    assert f["turns_resubmitted"] + f["requests_reprefilled"] >= 1, f
    per = rl["ray"]["per_replica"]
    assert sorted(r["incarnation"] for r in per) == [0, 1]
    assert f["recover_s_max"] > 0
    # the log holds exactly the episodes the collector finished: none lost, none doubled
    assert len(log_trajs) == rl["collector"]["episodes"]
