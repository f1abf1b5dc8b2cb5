"""`provrl theory …` end to end on small settings."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from provrl.cli import app

runner = CliRunner()


def _run(args):
    res = runner.invoke(app, ["theory", *args])
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.parametrize("cmd", ["bound", "mm", "mixed", "filtering", "all"])
def test_help(cmd):
    res = _run([cmd, "--help"])
    assert "--out" in res.output
    if cmd != "all":
        assert "--json" in res.output


def test_bound_json(tmp_path):
    res = _run(
        [
            "bound",
            "--mdps",
            "10",
            "--search-steps",
            "3",
            "--json",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["violations"] == 0 and out["pairs"] == 110
    assert set(out["tightness"]) == {"tv_tight", "tv_loose", "kl"}
    assert (tmp_path / "theory_bound.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "bound.json").read_text())["violations"] == 0


def test_mm_json(tmp_path):
    res = _run(
        [
            "mm",
            "--states",
            "9",
            "--iters",
            "3",
            "--deltas",
            "0.01,1",
            "--c-scales",
            "1",
            "--json",
            "--out",
            str(tmp_path),
        ]
    )
    out = json.loads(res.stdout)
    assert [r["method"] for r in out["runs"]] == [
        "MM (C×1)",
        "TRPO δ=0.01",
        "TRPO δ=1",
        "policy iteration",
    ]
    assert all(r["monotone"] for r in out["runs"])
    assert (tmp_path / "theory_mm.png").exists()
    assert (tmp_path / "mm" / "metrics.jsonl").read_text().count("\n") == 4


def test_mixed_and_filtering_json(tmp_path):
    out = json.loads(_run(["mixed", "--length", "3", "--json", "--out", str(tmp_path)]).stdout)
    assert abs(out["averaged_over_switch"]["exact"]["bias"]) < 1e-12
    assert (tmp_path / "theory_mixed.png").exists()
    out = json.loads(
        _run(["filtering", "--mc-samples", "2000", "--json", "--out", str(tmp_path)]).stdout
    )
    assert set(out["k"]) == {"4", "8", "16"}
    assert (tmp_path / "theory_filtering.png").exists()


def test_bad_options_are_named(tmp_path):
    res = runner.invoke(app, ["theory", "mm", "--deltas", "abc", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--deltas" in res.output
    res = runner.invoke(app, ["theory", "mm", "--gamma", "1.5", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "gamma" in res.output
    res = runner.invoke(app, ["theory", "mixed", "--top-p", "0", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "top_p" in res.output
