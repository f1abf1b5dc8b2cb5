"""`provrl bench …` and the thin scripts in benchmarks/ run the same code, same JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from provrl.cli import app

ROOT = Path(__file__).resolve().parents[2]
LOG_FIELDS = {"trajectories", "tokens_per_trajectory", "repeats", "format", "formats",
              "write_tokens_per_s", "read_tokens_per_s", "bytes_per_token"}  # fmt: skip


def test_bench_log_command_and_script_agree_on_the_fields():
    args = ["--trajectories", "20", "--tokens", "100", "--repeats", "1", "--json"]
    res = CliRunner().invoke(app, ["bench", "log", *args])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)
    assert set(cli) == LOG_FIELDS and cli["trajectories"] == 20
    script = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "provenance_log.py"), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    assert set(json.loads(script.stdout)) == LOG_FIELDS
    assert set(cli["formats"]) == set(json.loads(script.stdout)["formats"])


def test_bench_settings_come_from_the_config(tmp_path):
    f = tmp_path / "b.yaml"
    f.write_text("bench:\n  log:\n    trajectories: 7\n    tokens: 64\n    repeats: 1\n")
    res = CliRunner().invoke(app, ["bench", "log", "--config", str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trajectories"] == 7
