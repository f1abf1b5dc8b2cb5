"""``provrl bench engine | search | log | logprobs | trainer | learning | dev | simulate``: each prints
one JSON object.

Every command takes ``--config FILE`` / ``--set bench.NAME.key=value``; its flags are
generated from :mod:`provrl.run_config.bench` (:mod:`provrl.cli.options`). ``--out FILE``
also writes the result with its commit, config, machine, date and seeds
(:func:`provrl.bench.results.run_record`) — how a figure quoted in the docs gets its file in
``results/``. The scripts in ``benchmarks/`` run these same commands.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from provrl.cli.options import config_options
from provrl.run_config.bench import (
    DevBenchConfig,
    EngineBenchConfig,
    LearningBenchConfig,
    LogBenchConfig,
    LogprobBenchConfig,
    SearchBenchConfig,
    SimulateBenchConfig,
    TrainerBenchConfig,
)
from provrl.run_config.run import RunConfig

app = typer.Typer(help="Benchmarks (each prints JSON with --json).", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON only (one line).")]
OutOpt = Annotated[
    Path | None,
    typer.Option(help="Also write the JSON, with commit, config, machine and date, here "
                 "(results/NAME.json for a figure the docs quote)."),
]  # fmt: skip


def _flags(section: str, cls: Any, **renamed: str) -> dict[str, str]:
    """One flag per field of ``cls`` (``bench.SECTION.field``); ``renamed`` maps a flag name
    to the field it sets where the two differ."""
    fields = {n: n for n in cls.model_fields}
    for flag, name in renamed.items():
        fields.pop(name)
        fields[flag] = name
    return {flag: f"bench.{section}.{name}" for flag, name in fields.items()}


def _progress(name: str, quiet: bool = False) -> Any:
    """A benchmark's progress line printer (stderr, ``[bench NAME] …``; silent when ``quiet``)."""

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(f"[bench {name}] {msg}", err=True)

    return say


def _emit(
    result: dict[str, Any],
    as_json: bool,
    out: Path | None = None,
    *,
    name: str = "",
    config: Any = None,
    seeds: list[int] | dict[str, Any] | None = None,
) -> None:
    """Print ``result``; with ``out`` also write it as a results file (``config``: the
    command's settings, ``seeds``: the seeds it used)."""
    if out is not None:
        from provrl.bench.results import run_record, write_result

        cfg = config.model_dump(mode="json") if hasattr(config, "model_dump") else config
        write_result(out, run_record(name, result, config=cfg or {}, seeds=seeds or []))
    typer.echo(json.dumps(result, indent=None if as_json else 2))


WORKLOAD_KEYS = {"workload", "workload_episodes", "workload_concurrency", "dtype", "tool_latency", "hf"}  # fmt: skip
"""``bench.engine`` fields only the workload replay reads."""


@app.command("engine")
@config_options(_flags("engine", EngineBenchConfig, hf_cb="hf_continuous_batching"))
def bench_engine(
    cfg: RunConfig,
    run_dir: Annotated[
        Path | None, typer.Option(help="Also log the figures with MetricsWriter here.")
    ] = None,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Throughput vs HF generate (ratio, roofline), exactness, hot-load pause, KV staleness;
    with --backend vllm also the vLLM backend in the same run (docs/engine.md §10). With
    --workload: recorded agent episodes replayed turn by turn on the engine, the HF floor
    and (--backend vllm) vLLM (docs/perf.md)."""
    c = cfg.bench.engine
    if c.workload:
        from provrl.bench.replay import run_workload_benchmark

        result = run_workload_benchmark(
            c.workload, c.model, concurrency=c.workload_concurrency,
            episodes=c.workload_episodes, repeats=c.repeats, threads=c.threads, dtype=c.dtype,
            tool_latency=c.tool_latency, hf=c.hf, backend=c.backend,
            vllm_compile=c.vllm_compile, device=c.device,
            progress=_progress("engine", as_json),
        )  # fmt: skip
        _emit(result, as_json, out, name="engine_workload", config=c,
              seeds={"requests": "1000 * repeat + 64 * episode + turn", "tool latency": 0})  # fmt: skip
        return
    from provrl.bench.engine import run_engine_benchmark

    result = run_engine_benchmark(
        **c.model_dump(exclude=WORKLOAD_KEYS), progress=_progress("engine", as_json)
    )
    if run_dir is not None:
        from provrl.report.metrics import MetricsWriter

        w = MetricsWriter(run_dir, tensorboard=False)
        w.log(0, {k: v for k, v in result.items() if isinstance(v, int | float)}, "bench/engine")
        w.close()
    _emit(
        result,
        as_json,
        out,
        name="engine",
        config=cfg.bench.engine,
        seeds={"requests": "1000 * repeat + i", "hot-load perturbation": 1},
    )


@app.command("search")
@config_options(_flags("search", SearchBenchConfig))
def bench_search(cfg: RunConfig, out: OutOpt = None, as_json: JsonOpt = False) -> None:
    """SQLite FTS5 BM25 vs bm25s / rank_bm25: build time, latency p50/p99, QPS, recall@10."""
    from provrl.bench.search import run_search_benchmark

    c = cfg.bench.search
    result = run_search_benchmark(
        c.docs,
        seed=c.seed,
        k=c.k,
        repeats=c.repeats,
        tasks=c.tasks,
        peers=c.peers,
        rank_bm25_queries=c.rank_bm25_queries,
        progress=not as_json,
    )
    _emit(result, as_json, out, name="search", config=c, seeds=[c.seed])


@app.command("log")
@config_options(_flags("log", LogBenchConfig))
def bench_log(cfg: RunConfig, out: OutOpt = None, as_json: JsonOpt = False) -> None:
    """Trajectory-log write/read throughput and bytes per token, vs JSONL lists and Arrow."""
    from provrl.bench.log import run_log_benchmark

    c = cfg.bench.log
    result = run_log_benchmark(c.trajectories, c.tokens, repeats=c.repeats)
    _emit(result, as_json, out, name="log", config=c, seeds={"trajectories": 0})


@app.command("logprobs")
@config_options(_flags("logprobs", LogprobBenchConfig))
def bench_logprobs(cfg: RunConfig, out: OutOpt = None, as_json: JsonOpt = False) -> None:
    """Chunked vs full teacher-forced logprobs: time and peak memory of forward + backward."""
    from provrl.bench.logprobs import run_logprob_benchmark

    c = cfg.bench.logprobs
    result = run_logprob_benchmark(
        c.model, c.batch, c.seq_len, c.action_frac, c.chunk_tokens, c.repeats
    )
    _emit(result, as_json, out, name="logprobs", config=c, seeds={"inputs": 0})


@app.command("trainer")
@config_options(
    {k: v for k, v in _flags("trainer", TrainerBenchConfig).items() if k != "rl"}
)  # rl: --set bench.trainer.rl='{...}'
def bench_trainer(
    cfg: RunConfig,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One RL step standalone vs two TRL-style steps: tokens/s with and without prefix
    sharing, the sharing factor, peak RSS and its breakdown, FLOP/s against the bf16 matmul
    rate, lag-0 trainer-engine mismatch."""
    from provrl.bench.trainer import run_trainer_benchmark

    c = cfg.bench.trainer
    result = run_trainer_benchmark(
        c.model,
        c.fixture,
        c.repeats,
        c.threads,
        rl_overrides=c.rl,
        reference_micro_batch=c.reference_micro_batch,
        lag0=c.lag0,
        baseline=c.baseline,
        sharing_run=c.sharing_run,
        progress=_progress("trainer", as_json),
    )
    seed = int(result.get("rl_config", {}).get("seed", 0))
    _emit(result, as_json, out, name="trainer", config=c, seeds=[seed])


@app.command("learning")
@config_options(_flags("learning", LearningBenchConfig))
def bench_learning(
    cfg: RunConfig,
    out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The preset with several RL seeds from one warm start: paired accuracy gain, tool-call
    cut, mixed-version share, second-world gain, per seed and as a mean with a 95 % interval."""
    from provrl.bench.learning import run_learning_benchmark
    from provrl.bench.learning_report import plot_learning, targets

    c = cfg.bench.learning
    if c.from_record:
        src = Path(c.from_record)
        if src.is_dir():  # a benchmark directory stopped early: its finished seeds
            from provrl.bench.learning import summarize_finished

            res = summarize_finished(src, c.preset, c.overrides, c.eval_k)
            res["targets"] = targets(res)
            if c.plot:
                plot_learning(res, c.plot)
            _emit(
                res, as_json, out, name="learning", config=c, seeds=res["partial"]["finished_seeds"]
            )
            return
        rec = json.loads(src.read_text())
        res = rec.get("result", rec)
        if c.plot:
            plot_learning(res, c.plot)
        if c.markdown:  # the figures link from docs/ to the record
            from provrl.bench.learning_report import learning_markdown

            link = os.path.relpath(src.resolve(), Path("docs").resolve())
            typer.echo(learning_markdown(res, link=link), nl=False)
            return
        typer.echo(json.dumps(targets(res), indent=None if as_json else 2))
        return
    res = run_learning_benchmark(
        c.preset,
        c.seeds,
        c.runs,
        overrides=c.overrides,
        eval_k=c.eval_k,
        world2_seed=c.world2_seed or None,
        shared_from=c.shared or None,
        keep=c.keep or None,
        progress=_progress("learning"),
    )
    res["targets"] = targets(res)
    if c.plot:
        plot_learning(res, c.plot)
    _emit(res, as_json, out, name="learning", config=c, seeds=list(range(c.seeds)))


@app.command("dev")
@config_options(_flags("dev", DevBenchConfig))
def bench_dev(cfg: RunConfig, out: OutOpt = None, as_json: JsonOpt = False) -> None:
    """One dev-split run of a preset with overrides (or --from-run DIR): teacher calls per
    tier, RL vs warm start per tier, mixed-version / zero-signal / distinct shares per step."""
    from provrl.bench.dev import run_dev, summarize_run

    c = cfg.bench.dev
    if c.from_run:
        res = {"benchmark": "dev", "name": c.name, **summarize_run(c.from_run)}
        pinned = Path(c.from_run) / "config.yaml"
        if pinned.is_file():
            res["run_config"] = pinned.read_text()
    else:
        res = run_dev(
            c.name,
            c.preset,
            c.overrides,
            runs=c.runs,
            shared=c.shared or None,
            eval_n=c.eval_n,
            eval_k=c.eval_k,
            eval_versions=c.eval_versions,
        )
    _emit(res, as_json, out, name="dev", config=c, seeds=[])


@app.command("simulate")
@config_options(
    {k: v for k, v in _flags("simulate", SimulateBenchConfig).items() if k != "latency"}
)  # latency: --set bench.simulate.latency.preset=web-serp (or its other fields)
def bench_simulate(cfg: RunConfig, out: OutOpt = None, as_json: JsonOpt = False) -> None:
    """Predicted async / sync wall-time ratio at each concurrency and replica count: a
    discrete-event simulation from tool latency, episode lengths, engine and trainer step
    times (docs/simulate.md); --plot PATH draws the curve."""
    from provrl.bench.simulate import plot, run_grid

    c = cfg.bench.simulate
    knobs = c.model_dump(exclude={"concurrency", "replicas", "batch", "seeds", "latency", "plot"})
    result = run_grid(
        concurrency=c.concurrency,
        replicas=c.replicas,
        batch=c.batch,
        seeds=c.seeds,
        latency=c.latency,
        progress=_progress("simulate", as_json),
        **knobs,
    )
    if c.plot:
        plot(result, c.plot)
    _emit(result, as_json, out, name="simulate", config=c, seeds=list(range(c.seeds)))
