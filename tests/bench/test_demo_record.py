"""provrl.bench.demo: a timed `make demo` becomes a results file whose figures are the run's
own (stage markers, step records, /usr/bin/time -v)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provrl.bench.demo import main, parse_time_log
from provrl.bench.results import check_record

TIME_LOG = """\tCommand being timed: "make demo"
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03
\tMaximum resident set size (kbytes): 6291456
"""


def test_time_log_parses_hours_and_kbytes() -> None:
    t = parse_time_log(TIME_LOG)
    assert t == {"wall_s": 3723.0, "peak_rss_mib": 6144.0}
    assert parse_time_log(TIME_LOG.replace("1:02:03", "3:04.50"))["wall_s"] == 184.5
    with pytest.raises(ValueError, match="wall clock"):
        parse_time_log("nothing here")


def _run(root: Path) -> Path:
    run = root / "run"
    for stage, d in {
        "warmstart": {"stage_wall_s": 100.0},
        "probe": {"stage_wall_s": 50.0, "K_histogram": [1, 2, 3]},
        "filter": {"stage_wall_s": 1.0, "sizes": {"kept": 2}},
        "rl": {"stage_wall_s": 300.0},
        "eval": {
            "stage_wall_s": 40.0,
            "warmstart": {
                "accuracy": 0.5,
                "mean_tool_calls": 2.0,
                "task_accuracy": {"a": 0.5, "b": 0.5, "c": 0.0},
            },
            "rl": {
                "accuracy": 0.75,
                "mean_tool_calls": 1.5,
                "task_accuracy": {"a": 1.0, "b": 0.5, "c": 0.5},
            },
        },
    }.items():
        (run / stage).mkdir(parents=True)
        (run / stage / "done.json").write_text(json.dumps(d))
    steps = [{"step": i + 1, "step_s": s, "rss_mb": 5000.0, "mixed_version_trajectories": i} for i, s in enumerate([10.0, 30.0, 20.0])]  # fmt: skip
    (run / "rl" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (run / "config.yaml").write_text("seed: 7\nrl:\n  lr: 1.0e-5\n")
    return run


def test_results_file_holds_the_runs_figures(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (tmp_path / "time.log").write_text(TIME_LOG)
    out = tmp_path / "demo.json"
    main(["--time-log", str(tmp_path / "time.log"), "--run", str(run), "--out", str(out)])
    r = json.loads(out.read_text())
    assert check_record("demo.json", r) == []
    assert r["config"]["rl"]["lr"] == 1e-5 and r["seeds"]["seed"] == 7
    assert r["rl"]["step_s"] == [10.0, 30.0, 20.0] and r["rl"]["step_s_median"] == 20.0
    assert r["rl"]["mixed_version_trajectories"] == 3
    assert r["stages"]["setup_s"] == pytest.approx(3723.0 - 491.0)
    assert r["delta"]["accuracy"] == pytest.approx(1 / 3) and r["delta"]["tasks"] == 3
    assert r["delta"]["tool_calls_ratio"] == pytest.approx(0.75)


def test_unfinished_run_is_one_line(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "eval" / "done.json").unlink()
    (tmp_path / "time.log").write_text(TIME_LOG)
    with pytest.raises(SystemExit, match="did not finish"):
        main(["--time-log", str(tmp_path / "time.log"), "--run", str(run), "--out", str(tmp_path / "o.json")])  # fmt: skip
