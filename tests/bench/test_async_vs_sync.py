"""benchmarks/async_vs_sync.py (provrl/bench/async_vs_sync.py) end to end on the tiny model,
one step and one seed: the JSON has what issue 35 asks for, strict on-policy drained and
reset its caches at every step (engine counters), hot-load did neither, both modes trained
the same samples, and the latency preset and the calibrated time scale reached the runs. With ``--keep`` a rerun on a
machine that lost ``runs/`` reads every finished run back and measures nothing again."""

from __future__ import annotations

import json
import shutil

import pytest

from provrl.bench import async_vs_sync as avs
from provrl.bench.time_scale import DEPLOYMENT_TPOT_S
from provrl.env.config import LATENCY_PRESETS


def test_helpers():
    assert avs.time_to_threshold([(0.0, 0.1), (5.0, 0.4), (9.0, 0.6)], 0.4) == 5.0
    assert avs.time_to_threshold([(0.0, 0.1)], 0.4) is None
    steps = [{"lag_histogram": {"0": 3, "1": 2}}, {"lag_histogram": {"1": 1, "2": 4}}]
    assert avs.lag_histogram(steps) == {"0": 3, "1": 3, "2": 4}
    assert avs.add_histograms([{"0": 1}, {"0": 2, "3": 1}]) == {"0": 3, "3": 1}
    assert avs.latency_sets("web-ai", None, None, 2) == [
        "env.search.latency.preset=web-ai", "env.search.latency.seed=2"]  # fmt: skip
    assert avs.latency_sets("", "pareto", 0.3, 0)[:2] == [
        "env.search.latency.kind=pareto", "env.search.latency.median_s=0.3"]  # fmt: skip
    assert (
        avs.latency_sets("web-ai", None, None, 0, 30.0)[1] == "env.search.latency.time_scale=30.0"
    )


def test_tiny_run_reports_everything(tmp_path):
    out = tmp_path / "avs"
    argv = ["--steps", "1", "--seeds", "1", "--dev-tasks", "3", "--dev-k", "1",
            "--curve-dev-tasks", "2", "--curve-k", "1", "--out", str(out),
            "--results", str(tmp_path / "r.json"), "--plot", str(tmp_path / "c.png"),
            "--set", "pipeline.tasks.warmstart=4", "--time-scale", "auto", "--json",
            "--keep", str(tmp_path / "keep")]  # fmt: skip
    r = avs.main(argv)
    assert json.loads((tmp_path / "r.json").read_text())["steps"] == 1
    assert (tmp_path / "c.png").stat().st_size > 0
    assert r["samples_equal"] and isinstance(r["equivalent"], bool)
    assert r["wall_ratio_async_over_sync"] > 0 and "power_at_n" in r["accuracy_equivalence"]
    assert r["latency"]["preset"] == "web-ai"
    assert r["latency"]["median_s"] == LATENCY_PRESETS["web-ai"]["median_s"]
    # --time-scale auto: N from one calibration step's engine counters, used by every run
    ts = r["time_scale"]
    cal = ts["calibration"]
    assert ts["given"] == "auto" and cal["run"] == {**cal["run"], "mode": "sync", "steps": 1}
    assert cal["engine_steps"] > 0 and cal["engine_step_s"] > 0
    assert ts["value"] == cal["value"] == round(cal["engine_step_s"] / DEPLOYMENT_TPOT_S, 1)
    assert r["latency"]["time_scale"] == ts["value"] > 0
    assert ts["realised_slowdown"]["sync"] == round(
        r["measured"]["sync"]["engine_step_s"] / DEPLOYMENT_TPOT_S, 2
    )
    sync, asy = r["modes"]["sync"], r["modes"]["async"]
    assert sync["engine"]["drains"] == sync["engine"]["cache_resets"] == 1  # 1 step, 1 seed
    assert asy["engine"]["drains"] == asy["engine"]["cache_resets"] == 0
    for mode in (sync, asy):
        run = mode["runs"][0]
        assert [p[1] for p in run["curve"]] == [0.0, 1.0]  # warm start, then step 1
        assert len(run["save_s"]) == len(run["load_s"]) == 1
        assert sum(run["lag_histogram"].values()) > 0
    assert set(sync["lag_histogram"]) == {"0"}
    m = r["measured"]["sync"]
    assert m["episodes"] == len(m["turn_tokens"]) >= m["batch"]
    assert m["engine_step_s"] > 0 and len(m["trainer_step_s"]) == 1
    assert len(m["waits"]) == len(m["turn_tokens"])
    from provrl.bench.sim_check import check_against_simulator

    check = check_against_simulator(r, seeds=1)  # the JSON is the simulator's input as it is
    assert r["simulator_check"]["measured_ratio"] == r["wall_ratio_async_over_sync"]
    assert check["predicted_ratio"] > 0 and isinstance(check["within"], bool)

    # a machine that lost runs/: every finished run is read back from the kept folder, the
    # probe is put back, and the record is the same
    shutil.rmtree(out)
    again = avs.main(argv)
    assert again["kept"]["read"] == [
        "shared-probe",
        "time-scale",
        "curve-v0",
        "sync-s0",
        "async-s0",
    ]
    assert again["time_scale"] == r["time_scale"] and not (out / "time-scale").exists()
    assert (
        not (out / "sync-s0").exists() and not (out / "shared" / "probe" / "done.json").is_symlink()
    )
    assert again["modes"] == r["modes"] and again["measured"] == r["measured"]
    # another setting of the benchmark is refused in one line, never mixed in
    shutil.rmtree(out)
    with pytest.raises(
        ValueError, match=r"time-scale\.json: measured from another build.*settings"
    ):
        avs.main([*argv, "--dev-k", "2"])
