"""`provrl trajectories export --format parquet`: every field round-trips through pyarrow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner


def test_parquet_export_round_trips_the_provenance(small_world, tmp_path):
    pa_parquet = pytest.importorskip("pyarrow.parquet")
    from provrl.cli import app
    from provrl.env.config import EnvConfig, EvalConfig
    from provrl.rollout.evaluate import evaluate
    from provrl.trajlog import read_all

    evaluate(
        "oracle", small_world, EnvConfig(eval=EvalConfig(n=5)), tmp_path / "ev", progress=False
    )
    log = tmp_path / "ev" / "trajectories.jsonl"
    r = CliRunner().invoke(
        app, ["trajectories", "export", str(log), "--out", str(tmp_path / "t.parquet")]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trajectories"] == 5
    table = pa_parquet.read_table(tmp_path / "t.parquet")
    trajs = read_all(log)
    assert table.num_rows == len(trajs)
    for row, t in zip(table.to_pylist(), trajs, strict=True):
        assert row["traj_id"] == t.traj_id and row["reward"] == t.reward
        for name in ("token_id", "is_action", "version", "kv_min", "replica"):
            assert row[name] == getattr(t, name).tolist(), name
        np.testing.assert_array_equal(np.asarray(row["logprob"], np.float32), t.logprob)
        assert json.loads(row["policy"])["config"]["tokenizer"]["sha256"].startswith("sha256:")
        assert [s["kind"] for s in row["segments"]] == [s.kind for s in t.segments]
    assert table.schema.field("logprob").type.value_type == "float"  # float32, not widened
