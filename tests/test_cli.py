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
