"""``provrl run`` (the main job; ``make demo``) and ``provrl report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provrl.config import ConfigError, load_config
from provrl.env.tasks import read_task_file
from provrl.run_config.run import RunConfig


def run(
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset", "--config", help="Preset in configs/ or a YAML path (default: default)."
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="Override a config key, e.g. --set pipeline.loop.steps=4 (repeat)."
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="Continue the run in this directory with its saved config.yaml (--set may "
            "change only execution-only keys: logging.*, micro-batch sizes, eval concurrency)."
        ),
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help="Probe and train on this task file (provrl or plain QA JSONL) instead of the "
            "world's train split (= --set pipeline.tasks.file=PATH)."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars and stage lines.")] = True,
) -> None:
    """The main job: world → warm start → probe → filter → RL (sync or async with hot-load)
    → held-out eval → report. Each stage is skipped when its output exists in the run
    directory (logging.run_dir), so the same command resumes a killed run."""
    from provrl.pipeline.run import run_pipeline

    if resume is not None:
        cfg = resume_config(resume, overrides or [], preset=preset, tasks=tasks)
        run_dir = resume
    else:
        extra = [f"pipeline.tasks.file={tasks}"] if tasks is not None else []
        cfg = load_config(RunConfig, preset or "default", [*(overrides or []), *extra])
        run_dir = Path(cfg.logging.run_dir)
    summary = run_pipeline(cfg, run_dir, progress=progress and cfg.logging.progress)
    typer.echo(Path(summary["report"]).read_text())


def resume_config(
    run_dir: Path, overrides: list[str], *, preset: str | None, tasks: Path | None
) -> RunConfig:
    """The config ``provrl run --resume RUN_DIR`` continues with: the run's own
    ``config.yaml``, with ``overrides`` only where they change execution-only keys
    (:data:`~provrl.pipeline.pin.RESUMABLE`); ``--preset``, ``--tasks`` or a ``--set`` that
    changes what the run computes are refused with one line."""
    from provrl.pipeline.pin import RESUMABLE, diffs, named_changes, resumable

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no config.yaml — not a provrl run directory")
    keeps = f"--resume {run_dir} keeps the run's config ({path})"
    if preset is not None:
        raise ConfigError(f"{keeps}; drop --preset {preset}, or start a new run directory")
    if tasks is not None:
        raise ConfigError(f"{keeps}; drop --tasks {tasks}, or start a new run directory")
    cfg = load_config(RunConfig, path, overrides)
    if overrides:
        was = load_config(RunConfig, path).model_dump(mode="json")
        changed = diffs(was, cfg.model_dump(mode="json"))
        changed = [d for d in changed if not resumable(d.split(":", 1)[0])]
        if changed:
            raise ConfigError(
                f"{keeps}; --set may change only {', '.join(RESUMABLE)} — not "
                + named_changes(RunConfig, changed)
            )
    return cfg


def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (logging.run_dir).")],
) -> None:
    """(Re)write RUN/report/report.md and its PNGs from a run directory, and print it."""
    from provrl.pipeline.run_report import write_report

    if not run_dir.is_dir():
        raise typer.BadParameter(f"{run_dir}: no such run directory")
    typer.echo(write_report(run_dir).read_text())


def probe(
    out: Annotated[Path, typer.Option(help="Probe directory to write (resumable).")],
    policy: Annotated[
        str | None,
        typer.Option(help="Model name or checkpoint directory (default: the preset's model)."),
    ] = None,
    tasks: Annotated[
        Path | None, typer.Option(help="Task file (JSONL) to probe, e.g. a filter pool.")
    ] = None,
    pool: Annotated[
        Path | None,
        typer.Option(
            help="Re-probe a pool file of a filter directory (FILTER/unsolved.jsonl); prints how "
            "many tasks moved between pools under the old band."
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="Without --tasks/--pool: the world split.")] = "train",
    n: Annotated[
        int, typer.Option(help="Without --tasks/--pool: tasks drawn (seeded; 0 = all).")
    ] = 0,
    k: Annotated[
        int | None, typer.Option(help="Samples per task (default pipeline.loop.k = 8).")
    ] = None,
    preset: Annotated[
        str, typer.Option("--preset", "--config", help="Preset in configs/ or a YAML path.")
    ] = "default",
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key (repeat).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bar with ETA.")] = True,
) -> None:
    """Probe every task k times with the policy and its tools: per-task K, every trajectory in
    the provenance log, and a manifest of policy, tools, sampling and prompt."""
    import json

    from provrl.env.build import ensure_world, load_split, preflight_search
    from provrl.filtering import K_TABLE_HEADER, format_k_table
    from provrl.pipeline.engines import engine_factory, stage_engine_config
    from provrl.pipeline.probe import format_transitions, run_filter, run_probe
    from provrl.rollout.evaluate import select_tasks

    cfg = load_config(RunConfig, preset, overrides or [])
    preflight_search(None, cfg.env)  # a dead retriever: one line before any work
    world_dir = ensure_world(cfg.env.world)
    if tasks is not None and pool is not None:
        raise typer.BadParameter("give --tasks or --pool, not both")
    if pool is not None or tasks is not None:
        todo = read_task_file(pool or tasks, split="train")  # type: ignore[arg-type]
    else:
        tiers = cfg.pipeline.tasks.tiers
        todo = select_tasks(
            [t for t in load_split(world_dir, split) if t.tier in tiers], n, cfg.pipeline.tasks.seed
        )
    kk = k or cfg.pipeline.loop.k
    c = cfg.pipeline.loop.concurrency
    summary = run_probe(
        policy or cfg.model.name,
        todo,
        world_dir,
        cfg.env,
        out,
        k=kk,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        engine_cfg=stage_engine_config(cfg, c),  # as provrl run's probe stage
        concurrency=c,
        progress=progress and not as_json,
        make_engine=engine_factory(cfg),  # engine.backend: local | vllm | ray
    )
    moved = None
    if pool is not None and (pool.parent / "filter.json").is_file():
        old = json.loads((pool.parent / "filter.json").read_text())
        lo, hi = old["band"]
        moved = run_filter(out, out / "filter", lo=lo, hi=hi, previous=pool.parent)["transitions"]
        summary["transitions"] = moved
    if as_json:
        summary.pop("records")
        typer.echo(json.dumps(summary, default=str))
        return
    typer.echo(K_TABLE_HEADER)
    for tier, hist in summary["K_histogram_per_tier"].items():
        typer.echo(format_k_table(f"tier {tier}", hist))
    typer.echo(format_k_table("all", summary["K_histogram"]))
    tp = summary["throughput"]
    typer.echo(
        f"{tp['episodes']} episodes ({tp['episodes_reused']} reused from the log), "
        f"{tp['episodes_per_s']:.2f} episodes/s, {tp['tokens_per_s']:.0f} tokens/s, engine busy "
        f"{tp['engine_busy_frac']:.0%}, mean batch occupancy {tp['mean_batch_occupancy']:.1f}; "
        f"tool errors {tp['tool_errors']} of {tp['tool_calls_run']} calls "
        f"({tp['tool_error_rate']:.0%})"
    )
    if moved is not None:
        typer.echo(f"re-probe of {pool} — tasks moved (rows: old pool, columns: new pool):")
        typer.echo(format_transitions(moved))
    typer.echo(f"probe directory: {out}  (next: provrl filter {out})")


def filter_cmd(
    probe_dir: Annotated[Path, typer.Argument(help="A finished probe directory.")],
    out: Annotated[
        Path | None, typer.Option(help="Filter directory (default: PROBE_DIR/filter).")
    ] = None,
    min_successes: Annotated[int, typer.Option(help="Lowest K kept.")] = 1,
    max_successes: Annotated[
        int | None, typer.Option(help="Highest K kept (default k − 1).")
    ] = None,
    previous: Annotated[
        Path | None,
        typer.Option(help="An earlier filter directory: print the pool transition table."),
    ] = None,
    with_report: Annotated[
        bool,
        typer.Option(
            "--report", help="Retention analytics: observed vs Beta-predicted kept fraction, PNG."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Split a probe into three pools: kept (min ≤ K ≤ max, default 0 < K < k), unsolved
    (below: re-probe later — not "unlearnable") and solved (above)."""
    import json

    from provrl.pipeline.probe import format_transitions, run_filter

    d = out or probe_dir / "filter"
    s = run_filter(
        probe_dir, d, lo=min_successes, hi=max_successes, previous=previous, report=with_report
    )
    if as_json:
        s.pop("pool_of")
        typer.echo(json.dumps(s, default=str))
        return
    lo, hi = s["band"]
    typer.echo(
        f"k = {s['k']}, kept band {lo} ≤ K ≤ {hi}; K histogram {s['K_histogram']}; pools: "
        + ", ".join(f"{p} {n}" for p, n in s["sizes"].items())
    )
    if "retention" in s:
        r = s["retention"]
        b = r["beta_prior"]
        typer.echo(
            f"kept fraction {r['observed_kept_frac']:.3f} ± {r['observed_kept_frac_se']:.3f} "
            f"observed, {r['predicted_kept_frac']:.3f} predicted by Beta({b['a']:.3g}, "
            f"{b['b']:.3g}); kept per probe rollout {r['kept_per_probe_rollout']:.4f}"
        )
        for kk, row in r["by_k"].items():
            typer.echo(
                f"  k = {kk}: predicted kept {row['predicted_kept_frac']:.3f}, "
                f"{row['kept_per_probe_rollout']:.4f} per rollout"
            )
        typer.echo(f"retention report: {d / 'retention.json'}, {d / 'retention.png'}")
    if "transitions" in s:
        typer.echo("tasks moved (rows: previous pool, columns: this filter):")
        typer.echo(format_transitions(s["transitions"]))
    typer.echo(f"pools: {d}/{{kept,unsolved,solved}}.jsonl")
