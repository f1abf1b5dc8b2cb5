"""`provrl world`, `provrl serve-search`, `provrl eval`, `provrl bench search` (issue 4).

Heavy imports happen inside the commands, so ``provrl --help`` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from provrl.env.config import AgentConfig, EnvConfig, EvalConfig, SearchConfig, WorldConfig
from provrl.env.search import RetrieveLimits

_W = WorldConfig()
_A = AgentConfig()
_S = SearchConfig()
_E = EvalConfig()
_L = RetrieveLimits()


def _world_cfg(seed: int, entities: int | None, docs: int, tasks: int) -> WorldConfig:
    ents = (
        entities
        if entities is not None
        else (_W.entities if docs == _W.docs else max(50, int(docs * 0.4)))
    )
    return WorldConfig(seed=seed, entities=ents, docs=docs, tasks=tasks)


def _resolve_world(
    world: Path | None, seed: int, entities: int | None, docs: int, tasks: int
) -> Path:
    from provrl.env.build import ensure_world

    return ensure_world(_world_cfg(seed, entities, docs, tasks), world)


def world(
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: the cached default world).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Generator seed.")] = _W.seed,
    entities: Annotated[
        int | None, typer.Option(help="Entities (default 2000, or 0.4 × --docs).")
    ] = None,
    docs: Annotated[int, typer.Option(help="Target number of documents.")] = _W.docs,
    tasks: Annotated[int, typer.Option(help="Tasks to generate (all splits).")] = _W.tasks,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing directory.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Generate the synthetic search world: corpus, BM25 index, tasks verified by the oracle."""
    from provrl.env.build import build_world, default_world_dir

    cfg = _world_cfg(seed, entities, docs, tasks)
    target = out or default_world_dir(cfg)
    summary = build_world(cfg, target, progress=not as_json, overwrite=overwrite)
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


def serve_search(
    world_dir: Annotated[
        Path | None, typer.Option("--world", help="World directory (default: the default world).")
    ] = None,
    host: Annotated[
        str, typer.Option(help="Interface to bind (127.0.0.1 = local only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=0, max=65535)] = 8765,
    k: Annotated[int, typer.Option(help="Default topk when a request has none.")] = _S.k,
    max_topk: Annotated[
        int, typer.Option(help="Largest topk a request may ask for.")
    ] = _L.max_topk,
    max_queries: Annotated[int, typer.Option(help="Most queries in one request.")] = _L.max_queries,
    max_query_chars: Annotated[
        int, typer.Option(help="Longest query (characters); longer ones get 422.")
    ] = _L.max_query_chars,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body (bytes); larger ones get 413.")
    ] = _L.max_body_bytes,
    time_budget: Annotated[
        float, typer.Option(help="Seconds one request may run before it stops (503).")
    ] = _L.time_budget_s,
    title_weight: Annotated[
        float, typer.Option(help="BM25 weight of the title column.")
    ] = _S.title_weight,
    latency_median: Annotated[
        float, typer.Option(help="Add log-normal latency with this median (s); 0 = none.")
    ] = 0.0,
    latency_sigma: Annotated[float, typer.Option(help="Log-normal σ of the latency.")] = 0.6,
    index: Annotated[
        Path | None,
        typer.Option(help="Serve this index (from `provrl index docs.jsonl`) instead of a world."),
    ] = None,
) -> None:
    """Serve the search index over HTTP with the Search-R1 / FlashRAG /retrieve protocol."""
    from provrl.extras import require

    for module in ("fastapi", "uvicorn"):
        require(module, "serve", "provrl serve-search")
    from provrl.env.config import LatencyConfig
    from provrl.env.http_search import serve
    from provrl.env.latency import LatencyModel, WithLatency
    from provrl.env.sqlite_index import SqliteSearch, cached_index

    if index is not None:
        served: Path = index
    else:
        served = cached_index(
            _resolve_world(world_dir, _W.seed, None, _W.docs, _W.tasks), progress=True
        )
    backend: Any = SqliteSearch(served, title_weight=title_weight)
    if latency_median > 0:
        backend = WithLatency(
            backend,
            LatencyModel(
                LatencyConfig(kind="lognormal", median_s=latency_median, sigma=latency_sigma)
            ),
        )
    typer.echo(f"serving {served} on http://{host}:{port}/retrieve (Ctrl-C to stop)", err=True)
    limits = RetrieveLimits(
        max_topk=max_topk,
        max_queries=max_queries,
        max_query_chars=max_query_chars,
        max_body_bytes=max_body_bytes,
        time_budget_s=time_budget,
    )
    serve(backend, host=host, port=port, topk=k, limits=limits)


def eval_cmd(
    policy: Annotated[
        str, typer.Option(help="'oracle', a model name (smollm2-135m, tiny) or a checkpoint dir.")
    ] = "oracle",
    split: Annotated[str, typer.Option(help="train / dev / test.")] = _E.split,
    n: Annotated[int, typer.Option(help="Number of tasks (0 = the whole split).")] = _E.n,
    k: Annotated[int, typer.Option(help="Samples per task.")] = _E.k,
    tiers: Annotated[
        str, typer.Option(help="Comma-separated tiers to keep, e.g. '1' or '1,2' (default all).")
    ] = "",
    shots: Annotated[int, typer.Option(help="Worked examples in the prompt.")] = _A.shots,
    world_dir: Annotated[
        Path | None, typer.Option("--world", help="World directory (default: the default world).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="tag or hermes.")] = _A.protocol,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = _A.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus mass.")] = _A.top_p,
    max_turns: Annotated[int, typer.Option(help="Assistant turns per episode.")] = _A.max_turns,
    max_tool_calls: Annotated[
        int, typer.Option(help="Tool calls per episode.")
    ] = _A.max_tool_calls,
    max_total_tokens: Annotated[
        int, typer.Option(help="Token budget per episode.")
    ] = _A.max_total_tokens,
    max_new_tokens: Annotated[
        int, typer.Option(help="Sampled tokens per turn.")
    ] = _A.max_new_tokens,
    search_k: Annotated[int, typer.Option(help="Search results per query.")] = _S.k,
    backend: Annotated[str, typer.Option(help="sqlite or http.")] = _S.backend,
    url: Annotated[str, typer.Option(help="/retrieve service URL (backend http).")] = _S.url,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help="Your own task file (JSONL): plain {question, answer | [answers], id?} "
            "records or provrl task records; replaces --split of the world."
        ),
    ] = None,
    search_url: Annotated[
        str | None,
        typer.Option(help="A Search-R1 / FlashRAG /retrieve URL (sets --backend http)."),
    ] = None,
    index: Annotated[
        Path | None,
        typer.Option(help="A search index built by `provrl index docs.jsonl` (backend sqlite)."),
    ] = None,
    tokenizer: Annotated[
        str,
        typer.Option(help="--policy oracle: tokenize its traces for this model (name or dir)."),
    ] = "smollm2-135m",
    concurrency: Annotated[int, typer.Option(help="Agent loops at once.")] = _E.concurrency,
    seed: Annotated[int, typer.Option(help="Seed for task choice and sampling.")] = _E.seed,
    dtype: Annotated[str, typer.Option(help="Model dtype.")] = "float32",
    run_dir: Annotated[
        Path | None, typer.Option(help="Where trajectories and eval.json go.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON only.")
    ] = False,
) -> None:
    """Evaluate a policy on a task split: accuracy, pass@k, tool calls, tokens, per tier, K histogram."""
    from provrl.env.evaluate import evaluate

    if search_url is not None:
        backend, url = "http", search_url
    cfg = EnvConfig(
        search=SearchConfig(
            backend=backend,  # type: ignore[arg-type]
            url=url,
            k=search_k,
            index=str(index) if index is not None else "",
        ),
        agent=AgentConfig(
            protocol=protocol,  # type: ignore[arg-type]
            shots=shots,
            temperature=temperature,
            top_p=top_p,
            max_turns=max_turns,
            max_tool_calls=max_tool_calls,
            max_total_tokens=max_total_tokens,
            max_new_tokens=max_new_tokens,
        ),
        eval=EvalConfig(
            split=split,  # type: ignore[arg-type]
            n=n,
            k=k,
            tiers=tuple(int(x) for x in tiers.split(",") if x.strip()),
            concurrency=concurrency,
            seed=seed,
        ),
    )
    needs_world = tasks is None or shots > 0 or (cfg.search.backend == "sqlite" and index is None)
    wd = _resolve_world(world_dir, _W.seed, None, _W.docs, _W.tasks) if needs_world else None
    name = Path(policy).name if Path(policy).exists() else policy
    tag = f"-tiers{tiers.replace(',', '')}" if tiers else ""
    where = split if tasks is None else tasks.stem
    rd = run_dir or Path("runs") / "eval" / f"{name}-{where}{tag}-n{n}-k{k}-shots{shots}"
    summary = evaluate(
        policy,
        wd,
        cfg,
        rd,
        tasks_file=tasks,
        tokenizer=tokenizer,
        progress=not as_json,
        dtype=dtype,
    )
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(json.dumps(summary, indent=2))


def index_cmd(
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
    passage_words: Annotated[
        int, typer.Option(help="Passages are cut to at most this many words.")
    ] = 128,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Index your own document collection for search (SQLite FTS5 BM25, like the world's)."""
    from provrl.env.collection import index_collection

    summary = index_collection(docs, out, passage_words=passage_words, progress=not as_json)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(
        f"index: {summary['index']} ({summary['docs']} documents, {summary['passages']} "
        f"passages)\n  use it: provrl eval --tasks TASKS.jsonl --index {summary['index']}\n"
        f"  or serve it: provrl serve-search --index {summary['index']}"
    )


def bench_search(
    docs: Annotated[int, typer.Option(help="Documents in the benchmark world.")] = 100_000,
    seed: Annotated[int, typer.Option(help="World seed.")] = 0,
    k: Annotated[int, typer.Option(help="Results per query (recall@k).")] = 10,
    repeats: Annotated[int, typer.Option(help="Timed passes (medians are reported).")] = 3,
    tasks: Annotated[int, typer.Option(help="Tasks whose queries are timed.")] = 2000,
    peers: Annotated[
        str, typer.Option(help="Comma-separated: bm25s, rank_bm25.")
    ] = "bm25s,rank_bm25",
    rank_bm25_queries: Annotated[
        int, typer.Option(help="Queries per set for rank_bm25 (slow: pure Python).")
    ] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """SQLite FTS5 BM25 vs bm25s / rank_bm25: build time, latency p50/p99, QPS, recall@10."""
    from provrl.env.bench import run_search_benchmark

    result = run_search_benchmark(
        docs,
        seed=seed,
        k=k,
        repeats=repeats,
        tasks=tasks,
        peers=tuple(p.strip() for p in peers.split(",") if p.strip()),
        rank_bm25_queries=rank_bm25_queries,
        progress=not as_json,
    )
    typer.echo(json.dumps(result, indent=None if as_json else 2))
