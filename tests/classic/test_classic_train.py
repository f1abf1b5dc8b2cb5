"""End to end: TRPO learns CartPole, runs are reproducible, the CLI writes its outputs."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from provrl.classic.config import ClassicTRPOConfig, config_for
from provrl.classic.evaluate import run_episodes
from provrl.classic.train import evaluate, train
from provrl.config import ConfigError
from provrl.report.metrics import MetricsWriter, read_metrics


def test_trpo_improves_cartpole_within_a_small_budget(tmp_path):
    cfg = config_for("CartPole-v1", {"total_steps": 12_000, "seed": 0})
    with MetricsWriter(tmp_path, tensorboard=False) as log:
        result = train(cfg, log=log)
    curve = result.curve_returns
    assert result.steps >= 12_000
    assert np.mean(curve[:2]) < 40  # a near-uniform policy balances ~20 steps
    assert np.mean(curve[-3:]) > 3 * np.mean(curve[:2])
    assert evaluate(result, episodes=5).mean() > 150
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == len(curve)
    # every accepted step stayed inside the trust region
    for row in rows:
        assert row["trpo/kl"] <= cfg.trpo.delta
    assert sum(row["trpo/accepted"] for row in rows) >= len(rows) - 2


def test_same_seed_same_run_and_continuous_actions_with_fvp_subsample():
    over = {"total_steps": 1024, "seed": 3, "num_envs": 4, "num_steps": 128}
    over["trpo"] = {"fvp_subsample": 0.5}
    a = train(config_for("Pendulum-v1", over))
    b = train(config_for("Pendulum-v1", over))
    assert a.curve_returns == b.curve_returns
    for pa, pb in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(pa, pb)
    c = train(config_for("Pendulum-v1", {**over, "seed": 4}))
    assert not torch.equal(a.policy.log_std, c.policy.log_std) or a.curve_returns != c.curve_returns


def test_run_episodes_matches_a_hand_rolled_episode():
    always_left = lambda obs: np.zeros(len(obs), dtype=np.int64)  # noqa: E731
    returns = run_episodes(always_left, "CartPole-v1", episodes=3, seed=7)
    for i in range(3):
        env = gym.make("CartPole-v1")
        env.reset(seed=7 + i)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(0)
            total += r
            done = term or trunc
        assert returns[i] == total


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_envs"):
        config_for("CartPole-v1", {"num_envs": 0})
    with pytest.raises(ConfigError, match="nonsense"):
        config_for("CartPole-v1", {"nonsense": 1})
    with pytest.raises(ConfigError, match="NoSuchEnv"):
        train(ClassicTRPOConfig(env_id="NoSuchEnv-v0", total_steps=10))
    for name, f in ClassicTRPOConfig.model_fields.items():
        assert f.description, name


def test_cli_writes_metrics_curve_agent_and_summary(tmp_path):
    from provrl.cli import app

    out = tmp_path / "run"
    args = ["trpo", "--env", "Acrobot-v1", "--steps", "2048", "--seed", "1", "--out", str(out)]
    args += ["--set", "num_envs=4", "--set", "trpo.delta=0.02", "--eval-episodes", "2"]
    res = CliRunner().invoke(app, [*args, "--no-tensorboard", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["steps"] == 2048 and summary["env"] == "Acrobot-v1"
    assert -500 <= summary["eval_return_mean"] <= 0
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[-1]["eval/return_mean"] == pytest.approx(summary["eval_return_mean"])
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "agent.pt").stat().st_size > 0
    assert "delta: 0.02" in (out / "config.yaml").read_text()
    agent = torch.load(out / "agent.pt")
    assert agent["config"]["num_envs"] == 4 and agent["obs_rms"]["count"] > 0


def test_cli_reports_bad_overrides(tmp_path):
    from provrl.cli import app

    res = CliRunner().invoke(app, ["trpo", "--out", str(tmp_path), "--set", "trpo.nope=1"])
    assert res.exit_code == 2
    assert "nope" in res.output
