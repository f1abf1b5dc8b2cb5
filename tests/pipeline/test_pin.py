"""The run directory is the run's (provrl.pipeline.pin): an edited config.yaml is refused
naming the changed keys, a first attempt that failed before any stage started pins nothing,
and ``--resume`` refuses --preset / --tasks / --set of a key that changes what the run
computes — each with one line, before any work."""

from __future__ import annotations

import pytest

from provrl.cli.entry import main
from provrl.config import ConfigError, load_config
from provrl.pipeline.pin import COPY, pin_config
from provrl.pipeline.rundir import RunDir
from provrl.run_config import RunConfig


def _cfg(tmp_path, *sets: str) -> RunConfig:
    return load_config(RunConfig, "quick", [f"logging.run_dir={tmp_path}", *sets])


def _started(tmp_path, *sets: str) -> RunDir:
    """A run directory pinned to the quick config, its first stage begun."""
    run = RunDir(tmp_path)
    pin_config(run, _cfg(tmp_path, *sets))
    run.stage("warmstart")
    return run


def _error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("provrl: error: "), err
    return err[0]


def test_config_yaml_carries_its_hash_and_the_run_keeps_a_copy(tmp_path):
    _started(tmp_path)
    text = (tmp_path / "config.yaml").read_text()
    assert text.startswith("# provrl run config, sha256 ")
    assert (tmp_path / COPY).read_text() == text
    pin_config(RunDir(tmp_path), _cfg(tmp_path))  # the same config again: accepted


def test_an_edited_config_yaml_is_refused_naming_the_keys(tmp_path, capsys):
    """Issue 28: rl.lr edited 1e-4 → 0.5 mid-run was accepted, nothing in resume.log."""
    _started(tmp_path)
    p = tmp_path / "config.yaml"
    p.write_text(p.read_text().replace("lr: 0.0001", "lr: 0.5", 1).replace("k: 4", "k: 6", 1))
    line = _error(capsys, "run", "--resume", str(tmp_path), "--no-progress")
    assert f"{p}: edited since the run started (" in line
    assert "rl.lr: 0.0001 → 0.5" in line and "pipeline.loop.k: 4 → 6" in line
    assert not (tmp_path / "resume.log").exists()
    with pytest.raises(ConfigError, match="edited since the run started"):  # the same command
        pin_config(RunDir(tmp_path), _cfg(tmp_path))


def test_comments_and_layout_are_not_an_edit(tmp_path):
    _started(tmp_path)
    p = tmp_path / "config.yaml"
    p.write_text(p.read_text().replace("\nrl:\n", "\n# tuned\nrl:\n", 1))
    pin_config(RunDir(tmp_path), _cfg(tmp_path))


def test_a_changed_key_is_refused_and_an_execution_knob_is_logged(tmp_path):
    run = _started(tmp_path)
    with pytest.raises(ConfigError, match=r"different config \(pipeline\.loop\.steps: 3 → 5"):
        pin_config(run, _cfg(tmp_path, "pipeline.loop.steps=5"))
    pin_config(run, _cfg(tmp_path, "rl.micro_batch_size=4"))
    log = (tmp_path / "resume.log").read_text()
    assert "rl.micro_batch_size: 8 → 4" in log and log.endswith("\n")
    # which policies the eval stage evaluates (bench learning: the shared stages, then their eval)
    pin_config(run, _cfg(tmp_path, "rl.micro_batch_size=4", "pipeline.eval.policies=[]"))
    assert "pipeline.eval.policies" in (tmp_path / "resume.log").read_text()


def test_a_first_attempt_that_failed_before_any_stage_does_not_pin(tmp_path, capsys):
    """Issue 28: `--tasks bad.jsonl` failed correctly, then `--tasks good.jsonl` was refused
    as a different config because the failed attempt had left config.yaml behind."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Who?", "answer": "x"}\n{"question": \n')
    d = tmp_path / "run"
    line = _error(capsys, "run", "--preset", "quick", "--set", f"logging.run_dir={d}",
                  "--tasks", str(bad), "--no-progress")  # fmt: skip
    assert f"{bad}:2: invalid JSON (unexpected end of data at column 14 (end of line))" in line
    assert (d / "config.yaml").is_file() and not RunDir(d).started()
    good = _cfg(d, f"pipeline.tasks.file={tmp_path / 'good.jsonl'}")
    pin_config(RunDir(d), good)  # the corrected command is not refused
    assert "good.jsonl" in (d / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--preset", "quick"], "drop --preset quick"),
        (["--tasks", "other.jsonl"], "drop --tasks other.jsonl"),
        (["--set", "rl.lr=0.5"], "--set may change only logging, "),
        (["--set", "pipeline.rl.steps=9"], "not pipeline.loop.steps: 3 → 9"),
    ],
)
def test_resume_refuses_what_would_change_the_run(tmp_path, capsys, extra, says):
    _started(tmp_path)
    line = _error(capsys, "run", "--resume", str(tmp_path), "--no-progress", *extra)
    assert f"--resume {tmp_path} keeps the run's config" in line and says in line, line


def test_resume_takes_an_execution_knob(tmp_path, monkeypatch):
    import provrl.pipeline.run as run_mod

    _started(tmp_path)
    seen = {}

    def fake(cfg, run_dir, **kw):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(run_mod, "run_pipeline", fake)
    with pytest.raises(SystemExit):
        main(["run", "--resume", str(tmp_path), "--set", "rl.micro_batch_size=2"])
    assert seen["cfg"].rl.micro_batch_size == 2
