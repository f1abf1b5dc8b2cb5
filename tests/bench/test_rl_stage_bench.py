"""benchmarks/rl_stage.py (provrl/bench/rl_stage.py) end to end on the tiny model: every arm
runs the RL stage once per repeat from the same shared warm start, with the repeat's seeds,
and the JSON carries each run's figures, the per-arm medians and the wall ratios; with
``--keep`` a machine that lost ``runs/`` reads finished runs back."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from provrl.bench import rl_stage


def test_parse_arm():
    assert rl_stage.parse_arm("base=") == ("base", [])
    assert rl_stage.parse_arm("lend=a.b=1,c=x") == ("lend", ["a.b=1", "c=x"])
    for bad in ("base", "=a=1", "x=a.b"):
        with pytest.raises(argparse.ArgumentTypeError):
            rl_stage.parse_arm(bad)


def test_summarise_ratios_against_the_first_arm():
    def row(r, wall):
        return {"repeat": r, "wall_s": wall, "trajectories_per_s": 1.0,
                "generated_tokens_per_s": 2.0, "trainer_idle_frac": 0.5,
                "engine_busy_frac": 0.9, "mixed_version_frac": 0.2,
                "batch_accuracy_mean": None}  # fmt: skip

    s = rl_stage.summarise({"a": [row(0, 10.0), row(1, 20.0)], "b": [row(0, 5.0), row(1, 12.0)]})
    assert s["baseline"] == "a" and s["wall_ratio"] == {"a": 1.0, "b": round(8.5 / 15, 3)}
    assert s["wall_ratio_per_repeat"]["b"] == [0.5, 0.6]
    assert s["arms"]["b"]["batch_accuracy_mean"] is None  # no value: no median


def test_tiny_arms_side_by_side(tmp_path):
    # one arm, and the preset's shared stages built by this first call
    solo = ["--steps", "1", "--repeats", "1", "--arm", "solo=", "--set", "pipeline.tasks.warmstart=4",
            "--out", str(tmp_path / "runs"), "--json", "--keep", str(tmp_path / "keep")]  # fmt: skip
    first = rl_stage.main(solo)
    assert set(first["arms"]) == {"solo"} and (tmp_path / "runs" / "shared" / "warmstart").is_dir()  # fmt: skip
    # then from them (--shared), the default arms: base, and lend (split_cores + lend_cores)
    argv = ["--shared", str(tmp_path / "runs" / "shared"), "--steps", "1", "--repeats", "2",
            "--set", "pipeline.tasks.warmstart=4", "--out", str(tmp_path / "runs"),
            "--results", str(tmp_path / "r.json"), "--json"]  # fmt: skip
    r = rl_stage.main(argv)
    assert json.loads((tmp_path / "r.json").read_text())["benchmark"] == "rl_stage"
    assert r["arm_overrides"]["lend"] == ["pipeline.loop.split_cores=true", "pipeline.loop.lend_cores=true"]  # fmt: skip
    assert r["wall_ratio"]["base"] == 1.0 and len(r["wall_ratio_per_repeat"]["lend"]) == 2
    for arm in ("base", "lend"):
        runs = r["arms"][arm]["runs"]
        assert [x["repeat"] for x in runs] == [0, 1]
        assert all(x["trajectories_trained"] == 8 for x in runs)  # 1 step x 2 groups x 4
        assert all(x["wall_s"] > 0 and x["trajectories_per_s"] > 0 for x in runs)
    # each run says how its cores were shared (neither arm borrows the engine's core)
    assert r["arms"]["lend"]["runs"][0]["threads"]["borrowed"] == 0
    assert (tmp_path / "runs" / "lend-r1" / "rl" / "steps.jsonl").exists()
    # a machine that lost runs/: the kept run is read back, not run again
    shutil.rmtree(tmp_path / "runs")
    again = rl_stage.main(solo)
    assert again["kept"]["read"] == ["shared-probe", "solo-r0"]
    assert again["arms"]["solo"]["runs"] == first["arms"]["solo"]["runs"]
    assert not (tmp_path / "runs" / "solo-r0").exists()
    # an arm of the same name with other overrides is refused, never mixed in
    with pytest.raises(ValueError, match=r"solo-r0\.json: arm solo was \[\]"):
        rl_stage.main([a if a != "solo=" else "solo=pipeline.loop.split_cores=true" for a in solo])
