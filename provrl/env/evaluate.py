"""``provrl eval``: accuracy, pass@k, tool calls and tokens per task, per tier, histogram of K.

For each of N tasks, k episodes are sampled; K = number of exact-match successes. Then

    accuracy   = (1/N) Σ_i K_i / k                            (mean exact match)
    pass@j     = (1/N) Σ_i [1 − C(k − K_i, j) / C(k, j)]      (unbiased; Chen et al. 2021)
    hist[K]    = #{i : K_i = K},  K = 0..k

pass@j is reported for j = 1, 2, 4, …, k (and k itself). With the oracle (deterministic)
every sample of a task is the same, so it runs once per task and counts k times.

Episodes run concurrently — ``concurrency`` agent loops share one engine, so continuous
batching has work — and every trajectory is appended to ``run_dir/trajectories.jsonl`` as
it finishes (crash-safe); the summary goes to ``run_dir/eval.json`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from provrl.env.config import EnvConfig
from provrl.env.prompts import Message, question_message
from provrl.env.tasks import Task
from provrl.provenance import Identity, Trajectory

SHOT_TIERS = (1, 2, 3, 4)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 − C(n−c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def select_tasks(tasks: Sequence[Task], n: int, seed: int) -> list[Task]:
    """``n`` tasks drawn without replacement (seeded), in file order; all if n = 0."""
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    idx = np.sort(np.random.default_rng(seed).choice(len(tasks), n, replace=False))
    return [tasks[int(i)] for i in idx]


def worked_examples(
    train: Sequence[Task], shots: int, backend: Any, cfg: EnvConfig, exclude: set[str]
) -> list[list[Message]]:
    """``shots`` oracle dialogues on train tasks (tiers 1, 2, 3, 4, 1, …), never one whose
    answer entity is in ``exclude`` (splits are disjoint anyway)."""
    from provrl.env.oracle import run_oracle

    rng = np.random.default_rng([cfg.eval.seed, 17])
    out: list[list[Message]] = []
    for j in range(shots):
        tier = SHOT_TIERS[j % len(SHOT_TIERS)]
        pool = [t for t in train if t.tier == tier and t.answer_entity not in exclude]
        if not pool:
            raise ValueError(f"no train task of tier {tier} for a worked example")
        t = pool[int(rng.integers(len(pool)))]
        r = run_oracle(t, backend, cfg.search.k, cfg.agent.protocol)
        if not r.solved:
            raise ValueError(
                f"worked example {t.task_id} is not solved by the oracle: {r.problems}"
            )
        out.append(r.messages(question_message(t.question)))
    return out


def summarize(tasks: Sequence[Task], trajs: Sequence[Trajectory], k: int) -> dict[str, Any]:
    """The evaluation summary from the trajectories (k per task)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    tier_of = {t.task_id: t.tier for t in tasks}
    ks = [j for j in (1, 2, 4, 8, 16, 32, 64, 128) if j < k] + [k]

    def block(ids: Sequence[str]) -> dict[str, Any]:
        if not ids:
            return {"tasks": 0}
        succ = [int(sum(x.metrics["exact_match"] for x in by_task[i])) for i in ids]
        samples = [x for i in ids for x in by_task[i]]
        m = lambda key: float(np.mean([x.metrics[key] for x in samples]))  # noqa: E731
        solved = [x.metrics["num_tool_calls"] for x in samples if x.metrics["exact_match"] > 0]
        hist = np.bincount(np.asarray(succ), minlength=k + 1)[: k + 1]
        return {
            "tasks": len(ids),
            "samples": len(samples),
            "accuracy": float(np.mean([c / k for c in succ])),
            **{f"pass@{j}": float(np.mean([pass_at_k(k, c, j) for c in succ])) for j in ks},
            "mean_f1": m("f1"),
            "mean_tool_calls": m("num_tool_calls"),
            "mean_tool_calls_solved": float(np.mean(solved)) if solved else float("nan"),
            "mean_min_searches": m("min_searches"),
            "mean_tokens": m("num_tokens"),
            "mean_action_tokens": m("num_action_tokens"),
            "mean_malformed_calls": m("malformed_calls"),
            "answered_rate": m("answered"),
            "searched_rate": float(np.mean([x.metrics["num_searches"] > 0 for x in samples])),
            "K_histogram": {str(j): int(v) for j, v in enumerate(hist)},
        }

    ids = [t.task_id for t in tasks]
    out = block(ids)
    out["per_tier"] = {
        str(tier): block([i for i in ids if tier_of[i] == tier]) for tier in (1, 2, 3, 4)
    }
    return out


def summarize_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Recompute a finished run's summary from its ``trajectories.jsonl`` (e.g. after adding
    a statistic); the settings come from its ``eval.json``."""
    from provrl.env.build import load_split
    from provrl.env.tasks import read_task_file
    from provrl.trajlog import read_all

    run = Path(run_dir)
    old = json.loads((run / "eval.json").read_text())
    trajs = read_all(run / "trajectories.jsonl")
    ids = {t.task_id for t in trajs}
    if old.get("tasks_file"):
        pool = read_task_file(old["tasks_file"], old["split"])
    else:
        pool = load_split(old["world"], old["split"])
    tasks = [t for t in pool if t.task_id in ids]
    if old["policy"] == "oracle":
        trajs = [t for t in trajs for _ in range(old["k"])]
    keep = {k: v for k, v in old.items() if k not in ("per_tier",) and not k.startswith("pass@")}
    return {**keep, **summarize(tasks, trajs, old["k"]), "wall_s": old["wall_s"]}


def evaluate(
    policy: str,
    world_dir: str | os.PathLike[str] | None,
    cfg: EnvConfig,
    run_dir: str | os.PathLike[str],
    *,
    tasks_file: str | os.PathLike[str] | None = None,
    tokenizer: str = "smollm2-135m",
    engine_cfg: Any = None,
    progress: bool = True,
    dtype: str = "float32",
    plot: bool = True,
    make_engine: Any = None,
) -> dict[str, Any]:
    """Evaluate ``policy`` (``oracle``, a model name or a checkpoint dir) on a split of the
    world, or on the tasks of ``tasks_file`` (provrl task records or plain QA records,
    :func:`provrl.env.tasks.read_task_file`) with whatever search backend ``cfg.search``
    names. The oracle's traces are tokenized with ``tokenizer`` (a model name or dir: the
    policy they are meant to teach). ``plot`` draws ``run_dir/eval.png`` (pass@j, the K
    histogram). ``make_engine(lm, engine_cfg)`` builds the rollout engine (None: an
    in-process :class:`~provrl.engine.LocalEngine`; the pipeline passes the run config's
    backend, :func:`provrl.distributed.make_rollout_engine`)."""
    from provrl.env.agent import AgentEnv, oracle_trajectory, tools_identity
    from provrl.env.build import load_split
    from provrl.env.oracle import run_oracle
    from provrl.env.tasks import PLAIN_KIND, read_task_file
    from provrl.models import policy_identity
    from provrl.report.metrics import MetricsWriter
    from provrl.trajlog import TrajectoryWriter

    ev, a = cfg.eval, cfg.agent
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    if tasks_file is not None:
        source: Any = tasks_file
        pool = read_task_file(tasks_file, ev.split)
    elif world_dir is not None:
        source = world_dir
        pool = load_split(world_dir, ev.split)
    else:
        raise ValueError("evaluate: give a world directory or a task file")
    candidates = [t for t in pool if not ev.tiers or t.tier in ev.tiers]
    tasks = select_tasks(candidates, ev.n, ev.seed)
    if not tasks:
        raise ValueError(f"{source}: split {ev.split!r} has no tasks")
    if policy == "oracle" and any(t.kind == PLAIN_KIND for t in tasks):
        raise ValueError(
            f"{source}: --policy oracle needs provrl world tasks (with an oracle plan); "
            "plain question/answer records have none"
        )
    backend = search_backend(world_dir, cfg)
    tools = tools_identity(backend, cfg.search, a)
    shots: list[list[Message]] = []
    if a.shots:
        if world_dir is None or cfg.search.backend != "sqlite" or cfg.search.index:
            raise ValueError(
                f"shots={a.shots}: worked examples are oracle dialogues on the built-in world's "
                "train tasks and its index; use shots=0 with your own tasks or search backend"
            )
        shots = worked_examples(
            load_split(world_dir, "train"), a.shots, backend, cfg, {t.answer_entity for t in tasks}
        )
    t0 = time.perf_counter()
    trajs: list[Trajectory] = []
    log = run / "trajectories.jsonl"
    if policy == "oracle":
        from provrl.models import load_tokenizer, tokenizer_identity

        log.unlink(missing_ok=True)  # deterministic and instant: always redone whole
        bar = _progress(len(tasks), policy, progress)
        tok = load_tokenizer(tokenizer)
        with TrajectoryWriter(log) as writer:
            for t in tasks:
                r = run_oracle(t, backend, cfg.search.k, a.protocol)
                tr = oracle_trajectory(
                    t, r, tok, a, tools, traj_id=f"{t.task_id}-oracle", shots=shots
                )
                writer.write(tr)
                trajs.extend([tr] * ev.k)
                bar.update(1)
        bar.close()
        policy_id = Identity(
            "oracle", "oracle-v1", {"deterministic": True, "tokenizer": tokenizer_identity(tok)}
        )
    else:
        from provrl.engine import EngineConfig, LocalEngine
        from provrl.models import load_model
        from provrl.pipeline.collector import Collector
        from provrl.trajlog import read_trajectories

        # resume: samples already in the log (same ids, same seeds) are reused, never rerun
        done = list(read_trajectories(log)) if log.is_file() else []
        lm = load_model(policy, dtype=dtype)
        ecfg = engine_cfg or EngineConfig(
            max_seqs=ev.concurrency,
            max_context=max(a.max_total_tokens + 8, 512),
            seed=ev.seed,
            dtype=dtype,
        )
        policy_id = policy_identity(lm, dtype=dtype)
        foreign = [
            t
            for t in done
            if (t.policy.fingerprint, t.tools.fingerprint)
            != (policy_id.fingerprint, tools.fingerprint)
        ]
        if foreign:
            raise ValueError(
                f"{log}: holds trajectories of another policy or tool configuration "
                f"({foreign[0].traj_id}); evaluate into a new run directory"
            )
        engine = (make_engine or LocalEngine)(lm, ecfg)
        env = AgentEnv(engine, lm.tokenizer, backend, a, cfg.search, policy_id, tools, shots)
        try:
            with (
                TrajectoryWriter(log) as writer,
                Collector(
                    env,
                    concurrency=ev.concurrency,
                    seed=ev.seed,
                    writer=writer,
                    progress=f"eval {policy}" if progress else None,
                ) as col,
            ):
                for g in col.run(tasks, ev.k, done=done):
                    trajs.extend(g.trajectories)
        finally:
            engine.close()
    wall = time.perf_counter() - t0
    summary = summarize(tasks, trajs, ev.k)
    summary = {
        "policy": policy,
        "policy_fingerprint": policy_id.fingerprint,
        "tools_fingerprint": tools.fingerprint,
        "world": str(world_dir) if world_dir is not None else None,
        "tasks_file": str(tasks_file) if tasks_file is not None else None,
        "search": {
            "backend": backend.name,
            "url": cfg.search.url if cfg.search.backend == "http" else None,
            "index": cfg.search.index or None,
        },
        "split": ev.split,
        "tiers": list(ev.tiers),
        "n": len(tasks),
        "k": ev.k,
        "shots": a.shots,
        "protocol": a.protocol,
        "temperature": a.temperature if policy != "oracle" else 0.0,
        **summary,
        "wall_s": round(wall, 3),
        "trajectories": str(run / "trajectories.jsonl"),
    }
    if plot and summary["samples"]:
        from provrl.report.plots import plot_eval

        summary["plot"] = str(plot_eval(summary, run / "eval.png"))
    (run / "eval.json").write_text(json.dumps(summary, indent=2))
    with MetricsWriter(run, tensorboard=False) as mw:
        flat = {
            k: v
            for k, v in summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        for tier, blk in summary["per_tier"].items():
            flat.update(
                {f"tier{tier}/{k}": v for k, v in blk.items() if isinstance(v, int | float)}
            )
        mw.log(0, flat, prefix=f"eval/{ev.split}")
    return summary


def search_backend(world_dir: str | os.PathLike[str] | None, cfg: EnvConfig) -> Any:
    """The search tool ``cfg.search`` describes: the world's SQLite BM25 index, an index
    file of the user's own collection (``search.index``, built by ``provrl index``) or the
    HTTP client of a ``/retrieve`` service (``search.url``, with or without the trailing
    ``/retrieve``), wrapped in the simulated latency when ``cfg.search.latency`` asks."""
    backend: Any
    if cfg.search.backend == "http":
        from provrl.env.http_search import HttpSearch

        url = cfg.search.url.rstrip("/").removesuffix("/retrieve")
        backend = HttpSearch(url, cfg.agent.tool_timeout_s)
    else:
        from provrl.env.sqlite_index import SqliteSearch, cached_index

        if cfg.search.index:
            index: Path = Path(cfg.search.index)
        elif world_dir is not None:
            index = cached_index(world_dir)
        else:
            raise ValueError(
                "search: no index — give search.index (a `provrl index` file), a world "
                "directory, or backend=http with search.url"
            )
        backend = SqliteSearch(
            index,
            title_weight=cfg.search.title_weight,
            snippet_words=cfg.search.snippet_words,
            open_words=cfg.search.open_words,
        )
    if cfg.search.latency.kind != "none":
        from provrl.env.latency import LatencyModel, WithLatency

        backend = WithLatency(backend, LatencyModel(cfg.search.latency), cfg.agent.tool_timeout_s)
    return backend


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, policy: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"eval {policy}", unit="traj", dynamic_ncols=True)
