"""The main job end to end on the tiny model (configs/quick.yaml): world, oracle, async
rollouts on the engine, a GRPO step hot-loaded mid-flight, the provenance report."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from provrl.cli import app
from provrl.trajlog import read_all


def test_demo_quick_runs_end_to_end_and_mixes_versions(tmp_path):
    res = CliRunner().invoke(
        app, ["demo", "--config", "quick", "--set", f"logging.run_dir={tmp_path}"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["oracle"]["accuracy"] == 1.0
    assert summary["hotload"]["new_version"] == 1
    trajs = read_all(tmp_path / "trajectories.jsonl")
    assert len(trajs) == summary["episodes_started"]  # nothing dropped
    versions = np.concatenate([t.version[t.is_action] for t in trajs])
    assert set(versions.tolist()) == {0, 1}
    for t in trajs:  # versions never go back within a trajectory
        assert np.all(np.diff(t.version[t.is_action]) >= 0)
    # the swap happened mid-generation: tokens sampled under v1 attended to v0's KV
    stale = [t for t in trajs if np.any(t.kv_min[t.is_action] < t.version[t.is_action])]
    assert stale and summary["stale_kv_fraction"] > 0
    mixed = [t for t in trajs if len(set(t.version[t.is_action].tolist())) == 2]
    assert summary["mixed_version_trajectories"] == len(mixed)
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "metrics.jsonl").exists()
