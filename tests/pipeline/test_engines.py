"""One engine config per run config: `provrl eval`, `provrl probe` and the stages of
`provrl run` derive it with the same function and build the engine through the run's
factory, so `engine.backend: ray` reaches every command and a policy gets one context
length everywhere."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import provrl.pipeline.engines as engines_mod
from provrl.cli import app
from provrl.config import load_config
from provrl.engine.config import EngineConfig
from provrl.engine.factory import make_engine
from provrl.env.build import ensure_world, load_split
from provrl.pipeline import stages
from provrl.pipeline.rundir import RunDir
from provrl.run_config import RunConfig

SMALL = ["--max-turns", "1", "--max-new-tokens", "4"]


class Recorder:
    """An engine factory that records the settings it is asked for and builds local engines."""

    def __init__(self, *_: Any) -> None:
        self.made: list[EngineConfig] = []

    def __call__(self, lm: Any, cfg: EngineConfig, *, version: int = 0) -> Any:
        self.made.append(cfg)
        return make_engine(lm, cfg.model_copy(update={"backend": "local"}), version=version)


def _invoke(args: list[str]) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"


@pytest.mark.parametrize(
    "sets", [["pipeline.eval.concurrency=4", "env.eval.concurrency=4"], []], ids=["set", "preset"]
)
def test_eval_and_run_derive_the_same_engine_config(tmp_path, monkeypatch, sets):
    """The same run config gives `provrl eval` and `provrl run`'s eval stage the same
    EngineConfig: with the eval concurrency set in both sections, and with the preset alone
    (its engine.max_seqs covers both sections' concurrency)."""
    cfg = load_config(RunConfig, "quick", sets)
    cli = Recorder()
    monkeypatch.setattr(engines_mod, "engine_factory", lambda _cfg: cli)
    _invoke(["eval", "--policy", "tiny", "--config", "quick", "--n", "2", "--k", "1", *SMALL,
             "--run-dir", str(tmp_path / "ev"), "--json",
             *(x for kv in sets for x in ("--set", kv))])  # fmt: skip
    world = ensure_world(cfg.env.world)
    tasks = load_split(world, cfg.pipeline.eval.split)[:2]
    run = Recorder()
    stages.evaluate_policy(cfg, RunDir(tmp_path / "run"), world, "rl", "tiny", tasks, False, run)
    assert cli.made == run.made
    assert run.made[0].max_context == cfg.engine.max_context  # the run's, not a second rule
    assert run.made[0] == engines_mod.stage_engine_config(cfg, cfg.pipeline.eval.concurrency)


@pytest.mark.parametrize("command", ["eval", "probe"])
def test_eval_and_probe_honour_engine_backend_ray(tmp_path, monkeypatch, command):
    """Both commands build their engine through the run's factory: with engine.backend ray,
    the Ray one (here a stand-in that records its calls, so no cluster starts)."""
    made: list[Recorder] = []

    def ray_engines(ray: Any) -> Recorder:
        made.append(Recorder())
        return made[-1]

    monkeypatch.setattr(engines_mod, "RayEngines", ray_engines)
    ray = ["--set", "engine.backend=ray"]
    if command == "eval":
        args = ["eval", "--policy", "tiny", "--config", "quick", "--n", "2", "--k", "1", *SMALL,
                "--run-dir", str(tmp_path / "ev"), "--json"]  # fmt: skip
    else:
        args = ["probe", "--out", str(tmp_path / "probe"), "--preset", "quick", "--policy",
                "tiny", "--no-progress", "--n", "2", "--k", "2"]  # fmt: skip
    _invoke([*args, *ray])
    assert len(made) == 1 and len(made[0].made) == 1
    assert made[0].made[0].backend == "ray"  # the replicas' settings, as the run's RL stage
