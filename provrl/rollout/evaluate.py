"""``provrl eval``: accuracy, pass@k, tool calls and tokens per task, per tier, histogram of K.

For each of N tasks, k episodes are sampled; K = number of exact-match successes. Then

    accuracy   = (1/N) Σ_i K_i / k                            (mean exact match)
    pass@j     = (1/N) Σ_i [1 − C(k − K_i, j) / C(k, j)]      (unbiased; Chen et al. 2021)
    hist[K]    = #{i : K_i = K},  K = 0..k

pass@j is reported for j = 1, 2, 4, …, k (and k itself). With the oracle (deterministic)
every sample of a task is the same, so it runs once per task and counts k times. Tool
failures (``tool_errors``, ``tool_error_rate``: searches and opens that ended in an error
observation) are counted too: an accuracy over "search failed" observations is not the
policy's.

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

from provrl._sys import write_json
from provrl.engine.api import EngineFactory
from provrl.engine.config import EngineConfig
from provrl.env.build import load_split
from provrl.env.config import EnvConfig
from provrl.env.oracle import run_oracle
from provrl.env.tasks import PLAIN_KIND, Task, read_task_file
from provrl.models.chat import tokenizer_identity
from provrl.provenance import Identity, Trajectory
from provrl.report.metrics import MetricsWriter
from provrl.report.plots import plot_eval
from provrl.rollout.agent import oracle_trajectory, tool_failures
from provrl.rollout.collector import Collector
from provrl.rollout.failures import backfill_hop_metrics, failure_table
from provrl.rollout.setup import agent_tools, build_env, env_policy_identity, open_engine
from provrl.trajlog import TrajectoryWriter, read_all, read_trajectories


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
        won = [x for x in samples if x.metrics["exact_match"] > 0]
        solved = [x.metrics["num_tool_calls"] for x in won]
        # logs written before a metric existed do not carry it: a missing value is not a zero
        after = [x.metrics["calls_after_answer"] for x in won if "calls_after_answer" in x.metrics]
        repeats = [
            x.metrics["num_repeat_calls"] > 0 for x in samples if "num_repeat_calls" in x.metrics
        ]
        hist = np.bincount(np.asarray(succ), minlength=k + 1)[: k + 1]
        return {
            "tasks": len(ids),
            "samples": len(samples),
            "accuracy": float(np.mean([c / k for c in succ])),
            **{f"pass@{j}": float(np.mean([pass_at_k(k, c, j) for c in succ])) for j in ks},
            "mean_f1": m("f1"),
            "mean_tool_calls": m("num_tool_calls"),
            "mean_tool_calls_solved": float(np.mean(solved)) if solved else float("nan"),
            "mean_calls_after_answer_solved": float(np.mean(after)) if after else float("nan"),
            "mean_min_searches": m("min_searches"),
            "mean_tokens": m("num_tokens"),
            "mean_action_tokens": m("num_action_tokens"),
            "mean_malformed_calls": m("malformed_calls"),
            "answered_rate": m("answered"),
            "searched_rate": float(np.mean([x.metrics["num_searches"] > 0 for x in samples])),
            "repeat_rate": float(np.mean(repeats)) if repeats else float("nan"),
            **tool_failures(samples),
            "failure_modes": failure_table(x.metrics for x in samples),
            "K_histogram": {str(j): int(v) for j, v in enumerate(hist)},
        }

    ids = [t.task_id for t in tasks]
    out = block(ids)
    present = set(tier_of.values())
    tiers = sorted(present | ({1, 2, 3, 4} if present & {1, 2, 3, 4} else set()))
    out["per_tier"] = {  # the world's four tiers; a user's tasks are tier 0 (USER_TIER)
        str(tier): block([i for i in ids if tier_of[i] == tier]) for tier in tiers
    }
    return out


def summarize_run(run_dir: str | os.PathLike[str], tokenizer: str | None = None) -> dict[str, Any]:
    """Recompute a finished evaluation's summary from its ``trajectories.jsonl`` (e.g. after
    adding a statistic); the settings come from its ``eval.json``. Episodes logged before the
    hop metrics existed get them from their observations (:mod:`provrl.rollout.failures`),
    decoded by ``tokenizer`` (a model name or dir; default: the evaluated policy's)."""
    run = Path(run_dir)
    try:
        old = json.loads((run / "eval.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{run / 'eval.json'}: not an evaluation's summary ({e})") from None
    trajs = read_all(run / "trajectories.jsonl")
    ids = {t.task_id for t in trajs}
    if old.get("tasks_file"):
        pool = read_task_file(old["tasks_file"], old.get("split") or "test")
    else:
        pool = load_split(old["world"], old["split"])
    tasks = [t for t in pool if t.task_id in ids]
    if any(t.oracle for t in tasks) and any("hops" not in t.metrics for t in trajs):
        from provrl.models.loading import load_tokenizer

        # an oracle's traces were tokenized for SmolLM2 unless the eval said otherwise
        policy = "smollm2-135m" if old["policy"] == "oracle" else old["policy"]
        tok = load_tokenizer(tokenizer or policy)
        by_id = {t.task_id: t for t in tasks}
        backfill_hop_metrics(trajs, by_id, lambda ids: tok.decode(ids, skip_special_tokens=True))
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
    engine_cfg: EngineConfig | None = None,
    progress: bool = True,
    dtype: str = "float32",
    plot: bool = True,
    make_engine: EngineFactory | None = None,
) -> dict[str, Any]:
    """Evaluate ``policy`` (``oracle``, a model name or a checkpoint dir) on a split of the
    world, or on the tasks of ``tasks_file`` (provrl task records or plain QA records,
    :func:`provrl.env.tasks.read_task_file`) with whatever search backend ``cfg.search``
    names. The oracle's traces are tokenized with ``tokenizer`` (a model name or dir: the
    policy they are meant to teach). ``plot`` draws ``run_dir/eval.png`` (pass@j, the K
    histogram). The environment and its engine are built by :mod:`provrl.rollout.setup`:
    ``make_engine(lm, engine_cfg, version=0)`` (None: the in-process
    :func:`provrl.engine.make_engine`; the pipeline passes the run's engine factory)."""
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
    tools = agent_tools(world_dir, cfg, exclude_answers={t.answer_entity for t in tasks})
    backend = tools.backend
    t0 = time.perf_counter()
    trajs: list[Trajectory] = []
    log = run / "trajectories.jsonl"
    if policy == "oracle":
        from provrl.models.loading import load_tokenizer

        log.unlink(missing_ok=True)  # deterministic and instant: always redone whole
        bar = _progress(len(tasks), policy, progress)
        tok = load_tokenizer(tokenizer)
        with TrajectoryWriter(log) as writer:
            for t in tasks:
                r = run_oracle(t, backend, cfg.search.k, a.protocol, reasoning=a.reasoning)
                tr = oracle_trajectory(
                    t, r, tok, a, tools.identity, traj_id=f"{t.task_id}-oracle", shots=tools.shots
                )
                writer.write(tr)
                trajs.extend([tr] * ev.k)
                bar.update(1)
        bar.close()
        policy_id = Identity(
            "oracle", "oracle-v1", {"deterministic": True, "tokenizer": tokenizer_identity(tok)}
        )
    else:
        from provrl.models.loading import load_model

        # resume: samples already in the log (same ids, same seeds) are reused, never rerun
        done = list(read_trajectories(log)) if log.is_file() else []
        lm = load_model(policy, dtype=dtype)
        policy_id = env_policy_identity(lm)
        foreign = [
            t
            for t in done
            if (t.policy.fingerprint, t.tools.fingerprint)
            != (policy_id.fingerprint, tools.identity.fingerprint)
        ]
        if foreign:
            raise ValueError(
                f"{log}: holds trajectories of another policy or tool configuration "
                f"({foreign[0].traj_id}); evaluate into a new run directory"
            )
        with (
            open_engine(
                lm, cfg, engine_cfg=engine_cfg, dtype=dtype, make_engine=make_engine
            ) as engine,
            TrajectoryWriter(log) as writer,
            Collector(
                build_env(engine, lm, world_dir, cfg, tools=tools),
                concurrency=ev.concurrency,
                seed=ev.seed,
                writer=writer,
                progress=f"eval {policy}" if progress else None,
            ) as col,
        ):
            for g in col.run(tasks, ev.k, done=done):
                trajs.extend(g.trajectories)
    wall = time.perf_counter() - t0
    summary = summarize(tasks, trajs, ev.k)
    summary = {
        "policy": policy,
        "policy_fingerprint": policy_id.fingerprint,
        "tools_fingerprint": tools.identity.fingerprint,
        "world": str(world_dir) if world_dir is not None else None,
        "tasks_file": str(tasks_file) if tasks_file is not None else None,
        "search": {
            "backend": backend.name,
            "url": cfg.search.url if cfg.search.backend == "http" else None,
            "index": cfg.search.index or None,
        },
        "split": ev.split if tasks_file is None else None,  # a task file is no world split
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
        summary["plot"] = str(plot_eval(summary, run / "eval.png"))
    write_json(run / "eval.json", summary)  # strict JSON: a statistic that does not exist is null
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
        mw.log(0, flat, prefix=f"eval/{ev.split if tasks_file is None else 'tasks'}")
    return summary


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, policy: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"eval {policy}", unit="traj", dynamic_ncols=True)
