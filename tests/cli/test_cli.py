"""The one entry point and the foundation's subcommands."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from provrl.cli import app
from provrl.provenance import TrajectoryBuilder
from provrl.trajlog import TrajectoryWriter

runner = CliRunner()


def plain(s: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", s)


def test_help_lists_subcommands():
    out = plain(runner.invoke(app, ["--help"]).output)
    for cmd in (
        "models",
        "trajectories",
        "bench",
        "theory",
        "trpo",
        "eval",
        "sft",
        "world",
        "demo",
    ):
        assert cmd in out


def test_every_subcommand_has_help():
    import typer.main

    group = typer.main.get_command(app)

    def walk(cmd, path):
        res = runner.invoke(app, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(group, [])


def test_models_list_and_check_tiny():
    out = plain(runner.invoke(app, ["models", "list"]).output)
    assert "smollm2-135m" in out and "tiny" in out
    res = runner.invoke(app, ["models", "check", "tiny", "--max-new-tokens", "4"])
    assert res.exit_code == 0, res.output
    assert "tokens/s" in res.output


def test_trajectories_show(tmp_path):
    b = TrajectoryBuilder("traj-42", "task-7")
    b.add_prompt([1, 4093, 198])
    b.add_actions(
        [44, 7916, 46],
        logprob=[-0.1, -0.2, -0.3],
        kept_mass=[1, 0.9, 1],
        version=[3, 3, 4],
        kv_min=[2, 2, 2],
        kv_max=[3, 3, 4],
        replica=1,
    )
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(b.build(reward=1.0))
    res = runner.invoke(app, ["trajectories", "show", str(path)])
    assert res.exit_code == 0, res.output
    assert "traj-42" in res.output and "versions [3, 4]" in res.output
    res = runner.invoke(app, ["trajectories", "show", str(path), "--table"])
    assert res.exit_code == 0 and "-0.3000" in res.output and "2..4" in res.output


# ----------------------------------------------------------------------------- errors
def _cases(tmp_path):
    """(argv, text the one line must contain) for expected errors of many kinds."""
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("model:\n  nmae: tiny\n")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
        + "".join(
            f"{y}: &{y} [{','.join([f'*{x}'] * 10)}]\n"
            for x, y in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "seed: *i\n"
    )
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(b'{"crc":1,"rec":{}}\n')
    world = tmp_path / "w"
    (world / "tasks").mkdir(parents=True)
    (world / "world.json").write_text("{}")
    (world / "tasks" / "test.jsonl").write_text('{"task_id": 1}\n')
    return {
        "config unknown key": (["run", "--preset", str(bad_key)], "bad.yaml: unknown key"),
        "config alias bomb": (["run", "--preset", str(bomb)], "bomb.yaml: line"),
        "override value": (["run", "--set", "seed=abc"], "key 'seed'"),
        "no such preset": (["run", "--preset", str(tmp_path / "x.yaml")], "no such config file"),
        "corrupt log": (["trajectories", "show", str(corrupt)], "corrupt.jsonl: no readable"),
        "missing file": (["trajectories", "show", str(tmp_path / "no.jsonl")], "does not exist"),
        "not a world": (["eval", "--world", str(tmp_path / "nope")], "not a world directory"),
        "bad task file": (
            ["eval", "--world", str(world), "--split", "test"],
            "test.jsonl:1: field 'task_id'",
        ),
        "bad field value": (["eval", "--split", "bogus", "--world", str(world)], "field 'split'"),
        "usage": (["eval", "--n", "many"], "Invalid value for '--n'"),
        "device": (["run", "--set", "model.device=cuda:99"], "key 'model.device'"),
        "port out of range": (["serve-search", "--port", "99999999"], "'--port'"),  # was a
        # 95-line OverflowError traceback from bind()
    }


def test_every_expected_error_is_one_line_and_exit_code_2(tmp_path, capsys):
    from provrl.cli import main

    for name, (argv, needle) in _cases(tmp_path).items():
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2, (name, err)
        assert len(err.splitlines()) == 1 and err.startswith("provrl: error: "), (name, err)
        assert needle in err, (name, err)


def test_debug_shows_the_traceback_then_the_line(tmp_path, capsys, monkeypatch):
    from provrl.cli import main

    argv, needle = _cases(tmp_path)["bad task file"]
    assert main([*argv, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "TaskFileError" in err
    assert err.strip().splitlines()[-1].startswith("provrl: error: ") and needle in err
    monkeypatch.setenv("PROVRL_DEBUG", "1")
    assert main(argv) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("PROVRL_DEBUG", "0")
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_console_script_is_main_and_success_exits_0(capsys):
    import tomllib
    from pathlib import Path

    from provrl.cli import main

    scripts = tomllib.loads(Path(__file__).parents[2].joinpath("pyproject.toml").read_text())
    assert scripts["project"]["scripts"]["provrl"] == "provrl.cli:main"
    assert main(["models", "list"]) == 0
    assert main(["--help"]) == 0
