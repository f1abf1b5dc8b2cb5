"""`provrl conformance` end to end on the tiny model: exit codes 0 / 1 / 2, --json shape."""

from __future__ import annotations

import json

import yaml

from provrl.cli.entry import main


def test_conformance_json_passes_on_the_local_engine(tmp_path, capsys):
    cfg = tmp_path / "conf.yaml"
    cfg.write_text(yaml.safe_dump({"prompts": ["Who wrote Hamlet?"], "turn_tokens": 3}))
    out = tmp_path / "r.json"
    args = ["conformance", "--json", "--check", "weights", "--check", "stamps"]
    code = main([*args, "--config", str(cfg), "--out", str(out)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["pass"] is True and report["backend"] == "local"
    assert [c["name"] for c in report["checks"]] == ["weights", "stamps"]
    assert all({"name", "pass", "statistic"} <= set(c) for c in report["checks"])
    written = json.loads(out.read_text())
    assert written["checks"] == report["checks"] and written["benchmark"] == "conformance"
    assert {"commit", "date", "machine", "config", "seeds"} <= set(written)


def test_bad_input_exits_2(capsys):
    assert main(["conformance", "--check", "laws"]) == 2
    assert "--check 'laws'" in capsys.readouterr().err
    assert main(["conformance", "--backend", "tgi"]) == 2
