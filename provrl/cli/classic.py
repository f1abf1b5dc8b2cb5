"""`provrl trpo` — TRPO on gymnasium control (issue 5).

    provrl trpo --env CartPole-v1
    provrl trpo --env Pendulum-v1 --steps 50000 --seed 1 --set trpo.delta=0.02 --json
    provrl trpo --env Pendulum-v1 --config my-run.yaml     # the file's classic: section

Writes into ``--out``: config.yaml, metrics.jsonl (+ tb/ TensorBoard events),
learning_curve.png, agent.pt and summary.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from provrl.classic.config import config_for
from provrl.config import ConfigError, deep_merge, dump_config, load_config, parse_overrides
from provrl.extras import require
from provrl.run_config.run import RunConfig


def trpo(
    env: Annotated[str, typer.Option(help="gymnasium environment id.")] = "CartPole-v1",
    steps: Annotated[
        int | None, typer.Option(help="Environment steps (default: the preset's, 100k).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed (torch, sampler, environments).")] = 0,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default runs/trpo/<env>-s<seed>).")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A run config (YAML preset or path): its classic section is applied over the "
            "environment's preset, under --set.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Config override key=value, e.g. trpo.delta=0.02 (repeat)."),
    ] = None,
    eval_episodes: Annotated[
        int, typer.Option(help="Deterministic evaluation episodes at the end.")
    ] = 10,
    tensorboard: Annotated[bool, typer.Option(help="Also write TensorBoard events.")] = True,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON only.")
    ] = False,
) -> None:
    """Train TRPO on a gymnasium environment; write metrics, a learning curve and the agent."""
    require("gymnasium", "classic", "provrl trpo")
    from provrl.classic.plot import plot_learning_curve
    from provrl.classic.train import evaluate, save_agent, train
    from provrl.report.metrics import MetricsWriter

    try:
        overrides: dict[str, Any] = {}
        if config is not None:  # RunConfig.classic: only the keys the file sets
            overrides = load_config(RunConfig, config).classic.model_dump(exclude_unset=True)
            overrides.pop("env_id", None)  # the environment (and its preset) is --env
        overrides = deep_merge(overrides, parse_overrides(set_ or []))
        if steps is not None:
            overrides["total_steps"] = steps
        overrides["seed"] = seed
        cfg = config_for(env, overrides)
    except ConfigError as e:
        typer.echo(f"provrl trpo: {e}", err=True)
        raise typer.Exit(2) from None
    run_dir = out or Path("runs") / "trpo" / f"{env}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))

    with MetricsWriter(run_dir, tensorboard=tensorboard) as writer:
        try:
            result = train(cfg, log=writer, progress=progress and not as_json)
        except ConfigError as e:
            typer.echo(f"provrl trpo: {e}", err=True)
            raise typer.Exit(2) from None
        returns = evaluate(result, eval_episodes)
        writer.log(
            result.steps, {"eval/return_mean": returns.mean(), "eval/return_std": returns.std()}
        )

    png = plot_learning_curve(
        result.curve_steps,
        result.curve_returns,
        run_dir / "learning_curve.png",
        title=f"provrl TRPO on {env} (seed {seed})",
        eval_return=float(returns.mean()),
    )
    save_agent(result, run_dir / "agent.pt")
    summary = {
        "env": env,
        "seed": seed,
        "steps": result.steps,
        "wall_s": round(result.wall_s, 3),
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_episodes": eval_episodes,
        "run_dir": str(run_dir),
        "learning_curve": str(png),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        typer.echo(
            f"{env}: {result.steps} steps in {result.wall_s:.1f}s, deterministic eval return "
            f"{returns.mean():.1f} ± {returns.std():.1f} over {eval_episodes} episodes\n"
            f"wrote {run_dir}/ (metrics.jsonl, learning_curve.png, agent.pt, summary.json)"
        )
