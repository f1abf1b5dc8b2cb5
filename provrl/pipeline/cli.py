"""``provrl run`` (the main job; ``make demo``) and ``provrl report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def run(
    preset: Annotated[
        str, typer.Option("--preset", "--config", help="Preset in configs/ or a YAML path.")
    ] = "default",
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a config key, e.g. --set pipeline.rl.steps=4 (repeat)."
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the run in this directory with its saved config.yaml."),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars and stage lines.")] = True,
) -> None:
    """The main job: world → warm start → probe → filter → RL (sync or async with hot-load)
    → held-out eval → report. Each stage is skipped when its output exists in the run
    directory (logging.run_dir), so the same command resumes a killed run."""
    from provrl.config import ConfigError, load_config
    from provrl.pipeline.run import run_pipeline
    from provrl.run_config import RunConfig

    if resume is not None:
        if not (resume / "config.yaml").is_file():
            raise ConfigError(f"{resume}: no config.yaml — not a provrl run directory")
        cfg = load_config(RunConfig, resume / "config.yaml", overrides or [])
        run_dir = resume
    else:
        cfg = load_config(RunConfig, preset, overrides or [])
        run_dir = Path(cfg.logging.run_dir)
    summary = run_pipeline(cfg, run_dir, progress=progress and cfg.logging.progress)
    typer.echo(Path(summary["report"]).read_text())


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (logging.run_dir).")],
) -> None:
    """(Re)write RUN/report/report.md and its PNGs from a run directory, and print it."""
    from provrl.pipeline.report import write_report

    if not run_dir.is_dir():
        raise typer.BadParameter(f"{run_dir}: no such run directory")
    typer.echo(write_report(run_dir).read_text())
