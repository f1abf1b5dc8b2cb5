"""Flags generated from config fields (provrl.cli.options): one source, one precedence."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from provrl.cli.options import config_options, field_at
from provrl.run_config import RunConfig

seen: list[RunConfig] = []


@config_options(
    {
        "k": "env.eval.k",
        "tiers": "env.eval.tiers",
        "split": "env.eval.split",
        "prefix_cache": "engine.prefix_cache",
        "temperature": "env.agent.temperature",
    }
)
def probe_cmd(
    cfg: RunConfig, tag: str = typer.Option("x", help="An ordinary option of the command.")
) -> None:
    seen.append(cfg)
    typer.echo(tag)


app = typer.Typer()
app.command()(probe_cmd)


def run(*args: str) -> RunConfig:
    seen.clear()
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return seen[-1]


def test_defaults_file_set_flag_in_that_order(tmp_path):
    assert run().env.eval.k == RunConfig().env.eval.k
    f = tmp_path / "c.yaml"
    f.write_text("env:\n  eval:\n    k: 3\n    n: 7\n")
    assert run("--config", str(f)).env.eval.k == 3
    cfg = run("--config", str(f), "--set", "env.eval.k=5")
    assert (cfg.env.eval.k, cfg.env.eval.n) == (5, 7)
    assert run("--config", str(f), "--set", "env.eval.k=5", "--k", "6").env.eval.k == 6


def test_flag_types_lists_bools_literals():
    cfg = run("--tiers", "1,2", "--no-prefix-cache", "--split", "test", "--temperature", "0.5")
    assert cfg.env.eval.tiers == (1, 2) and cfg.engine.prefix_cache is False
    assert cfg.env.eval.split == "test" and cfg.env.agent.temperature == 0.5
    assert run("--tiers", "").env.eval.tiers == ()
    # a repeated list flag accumulates (it once kept only the last occurrence, silently)
    assert run("--tiers", "1", "--tiers", "2,3").env.eval.tiers == (1, 2, 3)
    assert run("--prefix-cache").engine.prefix_cache is True


def test_help_comes_from_the_field():
    res = CliRunner().invoke(app, ["--help"])
    out = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", res.output))
    desc = field_at(RunConfig, "env.eval.k").description
    assert desc is not None and desc.split("(")[0].strip() in out
    assert "--set env.eval.k; default 1" in out and "--config" in out and "--tag" in out


def test_bad_flag_value_names_flag_and_field():
    res = CliRunner().invoke(app, ["--split", "bogus"])
    assert res.exit_code == 2
    assert "'--split'" in res.output and "field 'split'" in res.output
    res = CliRunner().invoke(app, ["--tiers", "1,x"])
    assert res.exit_code == 2 and "'--tiers'" in res.output


def test_bad_set_is_a_config_error():
    from provrl.config import ConfigError

    res = CliRunner().invoke(app, ["--set", "env.eval.spilt=dev"])
    assert isinstance(res.exception, ConfigError) and "env.eval.split" in str(res.exception)


def test_a_flag_for_a_missing_key_fails_when_defined():
    with pytest.raises(KeyError, match="nope"):
        config_options({"x": "env.eval.nope"})(probe_cmd)


def test_trpo_reads_the_classic_section_of_a_run_config(tmp_path):
    pytest.importorskip("gymnasium")
    import yaml

    from provrl.cli import app as provrl_app

    f = tmp_path / "run.yaml"
    f.write_text("classic:\n  num_envs: 2\n  num_steps: 32\n  trpo:\n    delta: 0.03\n")
    out = tmp_path / "trpo"
    args = ["trpo", "--steps", "64", "--config", str(f), "--set", "num_steps=16", "--out",
            str(out), "--eval-episodes", "1", "--no-tensorboard", "--no-progress", "--json"]  # fmt: skip
    res = CliRunner().invoke(provrl_app, args)
    assert res.exit_code == 0, res.output
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (cfg["num_envs"], cfg["num_steps"], cfg["trpo"]["delta"]) == (2, 16, 0.03)
