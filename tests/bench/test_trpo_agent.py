"""benchmarks/trpo_agent.py (provrl/bench/trpo_agent.py): the per-step rows joined with the
fresh evaluations, the correlations, and a tiny end-to-end run (one step, one seed), read back
from its kept pieces on a machine that lost ``runs/``."""

from __future__ import annotations

import shutil

import pytest

from provrl.bench import trpo_agent as ta


def test_step_rows_join_the_fresh_evaluations_of_versions_u_and_u_plus_1():
    steps = [
        {"step": 1, "version": 1, "wall_s": 3.0, "trpo_expected_improvement": 0.2,
         "trpo_improvement": 0.1, "kl_q_pi_k3": 0.01, "trpo_kl": 0.005, "trpo_step_frac": 0.5,
         "trpo_accepted": 1.0, "lag_mean": 0.5, "max_lag": 1},
        {"step": 2, "version": 2, "wall_s": 6.0, "kl_q_pi_k3": float("nan")},  # GRPO-like
    ]  # fmt: skip
    fresh = {0: {"accuracy": 0.1, "mean_reward": -0.2}, 1: {"accuracy": 0.3, "mean_reward": 0.1},
             2: {"accuracy": 0.25, "mean_reward": 0.0}}  # fmt: skip
    r1, r2 = ta.step_rows(steps, fresh)
    assert r1["realised"] == pytest.approx(0.3) and r1["predicted"] == 0.2
    assert r1["dev_accuracy"] == 0.3 and r1["step_frac"] == 0.5 and r1["kl_step"] == 0.005
    assert r2["predicted"] is None and r2["kl_behaviour"] is None  # NaN and absent: None
    assert r2["realised"] == pytest.approx(-0.1)
    assert ta.step_rows([{"step": 1, "version": 3}], fresh)[0]["realised"] is None


def test_correlations():
    c = ta.correlations([1.0, 2.0, 3.0], [2.0, 4.0, 6.5])
    assert c["spearman"] == pytest.approx(1.0) and c["pearson"] > 0.99
    assert c["mean_ratio"] == pytest.approx((2 + 2 + 6.5 / 3) / 3)
    few = ta.correlations([1.0, 2.0], [1.0, 2.0])
    assert few["pearson"] is None and few["pairs"] == 2


def test_summarise_config():
    runs = [{"final_dev_accuracy": 0.5, "wall_s": 10.0,
             "steps": [{"predicted": 0.1, "realised": 0.2, "kl_behaviour": 0.02, "kl_step": None,
                        "step_frac": None, "lag_mean": 1.0}]}]  # fmt: skip
    s = ta.summarise_config(runs, acc0=0.3)
    assert s["accuracy_gain_per_wall_s"] == pytest.approx(0.02)
    assert s["kl_step_mean"] is None and s["kl_behaviour_mean"] == 0.02
    assert s["predicted_vs_realised"]["pairs"] == 1


def test_tiny_run(tmp_path):
    argv = ["--steps", "1", "--seeds", "1", "--max-lags", "2", "--fresh-tasks", "2",
            "--fresh-k", "1", "--out", str(tmp_path / "t"), "--plot", str(tmp_path / "p.png"),
            "--results", str(tmp_path / "r.json"),
            "--set", "pipeline.tasks.warmstart=4", "--json", "--time-scale", "2",
            "--keep", str(tmp_path / "keep")]  # fmt: skip
    r = ta.main(argv)
    assert set(r["configs"]) == {"trpo-L2", "grpo-L2"}
    assert (tmp_path / "p.png").stat().st_size > 0 and (tmp_path / "r.json").is_file()
    (trpo,) = r["configs"]["trpo-L2"]["runs"][0]["steps"]
    (grpo,) = r["configs"]["grpo-L2"]["runs"][0]["steps"]
    assert trpo["predicted"] is not None and trpo["step_frac"] is not None
    assert grpo["predicted"] is None and grpo["kl_behaviour"] is not None
    for row in (trpo, grpo):
        assert row["realised"] is not None and row["dev_accuracy"] is not None
    assert r["time_scale"]["given"] == r["time_scale"]["value"] == 2.0
    assert r["time_scale"]["calibration"] is None  # given, not calibrated
    shutil.rmtree(tmp_path / "t")  # a fresh machine: the kept runs are read back, none rerun
    again = ta.main(argv)
    assert again["kept"]["read"] == ["shared-probe", "fresh-v0", "trpo-L2-s0", "grpo-L2-s0"]
    assert again["configs"] == r["configs"] and not (tmp_path / "t" / "trpo-L2-s0").exists()
