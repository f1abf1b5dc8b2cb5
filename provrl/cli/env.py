"""`provrl world`, `provrl serve-search`, `provrl eval`, `provrl failures`, `provrl index`.

Each takes ``--config FILE`` / ``--set key=value`` over the run config's ``env`` section
(and ``model.dtype``); its flags are generated from those fields (:mod:`provrl.cli.options`).
Heavy imports happen inside the commands, so ``provrl --help`` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from provrl.cli.options import config_options
from provrl.env.config import WorldConfig
from provrl.extras import require
from provrl.run_config.run import RunConfig

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
WorldOpt = Annotated[
    Path | None, typer.Option("--world", help="World directory (default: the config's world).")
]


def world_config(w: WorldConfig) -> WorldConfig:
    """``w``, with ``entities`` following ``docs`` (0.4 per document, at least 50) when only
    ``docs`` was changed — so ``provrl world --docs 100000`` is a world of the same density."""
    if "entities" in w.model_fields_set or w.docs == WorldConfig().docs:
        return w
    return w.model_copy(update={"entities": max(50, int(w.docs * 0.4))})


@config_options({n: f"env.world.{n}" for n in ("seed", "entities", "docs", "tasks")})
def world(
    cfg: RunConfig,
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (default: the cached world of the config)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate the synthetic search world: corpus, BM25 index, tasks verified by the oracle.
    Without --entities, a changed --docs brings 0.4 entities per document."""
    from provrl.env.build import build_world, default_world_dir

    wcfg = world_config(cfg.env.world)
    target = out or default_world_dir(wcfg)
    summary = build_world(wcfg, target, progress=not as_json, overwrite=overwrite)
    summary["dir"] = str(target)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    c, t = summary["world"]["counts"], summary["tasks"]
    typer.echo(f"world: {target}")
    typer.echo(
        f"  {c['docs']} documents / {c['passages']} passages; {c['people']} people, "
        f"{c['orgs']} organisations, {c['places']} places, {c['works']} works, {c['events']} events"
    )
    typer.echo(
        f"  tasks: {t['kept']} kept of {t['generated']} (oracle check at k={t['oracle_k']}); "
        f"per split {t['per_split']}; per tier {t['per_tier']}"
    )
    typer.echo(f"  seconds: {summary['seconds']}")


L = "env.serve.limits."


@config_options(
    {
        "host": "env.serve.host",
        "port": "env.serve.port",
        "k": "env.search.k",
        "max_topk": L + "max_topk",
        "max_queries": L + "max_queries",
        "max_query_chars": L + "max_query_chars",
        "max_body_bytes": L + "max_body_bytes",
        "time_budget": L + "time_budget_s",
        "body_timeout": L + "body_timeout_s",
        "title_weight": "env.search.title_weight",
        "latency_sigma": "env.search.latency.sigma",
        "index": "env.search.index",
    }
)
def serve_search(
    cfg: RunConfig,
    world_dir: WorldOpt = None,
    latency_median: Annotated[
        float,
        typer.Option(
            help="Add log-normal latency with this median (s) to every call (= --set "
            "env.search.latency.kind=lognormal --set env.search.latency.median_s=S); 0 = the "
            "config's latency (none by default)."
        ),
    ] = 0.0,
) -> None:
    """Serve the search index over HTTP with the Search-R1 / FlashRAG /retrieve protocol
    (the world's index, or --index of `provrl index docs.jsonl`)."""
    for module in ("fastapi", "uvicorn"):
        require(module, "serve", "provrl serve-search")
    from provrl.env.build import ensure_world
    from provrl.env.http_search import serve
    from provrl.env.latency import LatencyModel, WithLatency
    from provrl.env.sqlite_index import SqliteSearch, cached_index

    s, sv = cfg.env.search, cfg.env.serve
    if s.index:
        served = Path(s.index)
    else:
        served = cached_index(ensure_world(cfg.env.world, world_dir), progress=True)
    backend: Any = SqliteSearch(
        served, title_weight=s.title_weight, snippet_words=s.snippet_words, open_words=s.open_words
    )
    latency = s.latency
    if latency_median > 0:
        latency = latency.model_copy(update={"kind": "lognormal", "median_s": latency_median})
    if latency.kind != "none":
        backend = WithLatency(backend, LatencyModel(latency))
    typer.echo(
        f"serving {served} on http://{sv.host}:{sv.port}/retrieve (Ctrl-C to stop)", err=True
    )
    serve(backend, host=sv.host, port=sv.port, topk=s.k, limits=sv.limits)


A = "env.agent."


@config_options(
    {
        "split": "env.eval.split",
        "n": "env.eval.n",
        "k": "env.eval.k",
        "tiers": "env.eval.tiers",
        "shots": A + "shots",
        "protocol": A + "protocol",
        "temperature": A + "temperature",
        "top_p": A + "top_p",
        "max_turns": A + "max_turns",
        "max_tool_calls": A + "max_tool_calls",
        "max_total_tokens": A + "max_total_tokens",
        "max_new_tokens": A + "max_new_tokens",
        "search_k": "env.search.k",
        "backend": "env.search.backend",
        "url": "env.search.url",
        "index": "env.search.index",
        "concurrency": "env.eval.concurrency",
        "seed": "env.eval.seed",
        "dtype": "model.dtype",
    }
)
def eval_cmd(
    cfg: RunConfig,
    policy: Annotated[
        str, typer.Option(help="'oracle', a model name (smollm2-135m, tiny) or a checkpoint dir.")
    ] = "oracle",
    world_dir: WorldOpt = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help="Your own task file (JSONL): plain {question, answer | [answers], id?} "
            "records or provrl task records; replaces --split of the world."
        ),
    ] = None,
    search_url: Annotated[
        str | None,
        typer.Option(help="A Search-R1 / FlashRAG /retrieve URL (= --backend http --url URL)."),
    ] = None,
    tokenizer: Annotated[
        str,
        typer.Option(help="--policy oracle: tokenize its traces for this model (name or dir)."),
    ] = "smollm2-135m",
    run_dir: Annotated[
        Path | None, typer.Option(help="Where trajectories and eval.json go.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON only.")
    ] = False,
) -> None:
    """Evaluate a policy on a task split: accuracy, pass@k, tool calls, tokens, per tier, K histogram."""
    from provrl.env.build import ensure_world, preflight_search
    from provrl.pipeline.engines import engine_factory, stage_engine_config
    from provrl.rollout.evaluate import evaluate

    env = cfg.env
    if search_url is not None:
        env.search.backend, env.search.url = "http", search_url
    ev, a = env.eval, env.agent
    needs_world = (
        tasks is None or a.shots > 0 or (env.search.backend == "sqlite" and not env.search.index)
    )
    preflight_search(None, env)  # a dead retriever: one line before any work
    wd = ensure_world(env.world, world_dir) if needs_world else None
    name = Path(policy).name if Path(policy).exists() else policy
    tag = f"-tiers{''.join(map(str, ev.tiers))}" if ev.tiers else ""
    where = ev.split if tasks is None else tasks.stem
    rd = run_dir or Path("runs") / "eval" / f"{name}-{where}{tag}-n{ev.n}-k{ev.k}-shots{a.shots}"
    summary = evaluate(
        policy,
        wd,
        env,
        rd,
        tasks_file=tasks,
        tokenizer=tokenizer,
        engine_cfg=stage_engine_config(cfg, ev.concurrency),  # as provrl run's eval stage
        progress=not as_json,
        dtype=cfg.model.dtype,
        make_engine=engine_factory(cfg),  # engine.backend: local | vllm | ray
    )
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(json.dumps(summary, indent=2))


@config_options({"passage_words": "env.search.passage_words"})
def index_cmd(
    cfg: RunConfig,
    docs: Annotated[
        Path,
        typer.Argument(
            help="Documents, one JSON object per line: {id?, title?, text} or FlashRAG's "
            "{id, contents}."
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="Index file to write (default: DOCS with .sqlite).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Index your own document collection for search (SQLite FTS5 BM25, like the world's)."""
    from provrl.env.collection import index_collection

    summary = index_collection(
        docs, out, passage_words=cfg.env.search.passage_words, progress=not as_json
    )
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"index: {summary['index']} ({summary['docs']} documents, {summary['passages']} "
        f"passages)\n  use it: provrl eval --tasks TASKS.jsonl --index {summary['index']}\n"
        f"  or serve it: provrl serve-search --index {summary['index']}"
    )


def failures_cmd(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Evaluation directories (eval.json + trajectories.jsonl): one column each."
        ),
    ],
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Decode logs that predate the hop metrics with this model's tokenizer "
            "(default: each evaluated policy's)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Also write the table here, as a results file.")
    ] = None,
    names: Annotated[
        str | None,
        typer.Option(help="Comma-separated names of the columns (default: the directories)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the episodes of evaluations fail, per tier, read against each task's oracle plan:
    unanswered, no search, answer shown but not given, first hop missed, stopped after a
    partial plan, later hop missed (provrl.rollout.failures)."""
    from provrl.bench.results import run_record, write_result
    from provrl.rollout.evaluate import summarize_run
    from provrl.rollout.failures import MODES

    labels = names.split(",") if names else [str(d) for d in runs]
    if len(labels) != len(runs):
        raise typer.BadParameter(
            f"{len(labels)} names for {len(runs)} directories", param_hint="--names"
        )
    table: dict[str, Any] = {}
    for d, label in zip(runs, labels, strict=True):
        s = summarize_run(d, tokenizer)
        blocks = {"all": s, **s.get("per_tier", {})}
        table[label] = {
            tier: {"accuracy": b["accuracy"], **b["failure_modes"]}
            for tier, b in blocks.items()
            if b.get("failure_modes")
        }
    if out is not None:  # a results file: with commit, machine, date and command
        record = run_record(
            "failures",
            {"runs": table, "modes": list(MODES)},
            config={"runs": [str(d) for d in runs], "tokenizer": tokenizer},
            seeds={"samples": "each evaluation's own (its eval.json)"},
        )
        write_result(out, record)
    if as_json:
        typer.echo(json.dumps(table))
        return
    for name, tiers in table.items():
        typer.echo(name)
        if not tiers:
            typer.echo("  no task with an oracle plan: nothing to read the failures against")
            continue
        cols = list(tiers)
        typer.echo(
            "  "
            + f"{'share of samples':<24}"
            + "".join(f"{'tier ' + t if t != 'all' else 'all':>10}" for t in cols)
        )
        for key in ("samples", "accuracy", *MODES):
            cells = []
            for t in cols:
                v = tiers[t][key]
                cells.append(f"{v:>10d}" if key == "samples" else f"{v:>10.3f}")
            typer.echo("  " + f"{key:<24}" + "".join(cells))
