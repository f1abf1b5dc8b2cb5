"""The stages of ``provrl run`` between the warm start and RL, and the evaluation stage.

Each is a function of (config, run directory, inputs) that returns the stage summary
(``RUN/{stage}/done.json``); :mod:`provrl.pipeline.run` calls them in order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from provrl.engine.api import EngineFactory
from provrl.env.tasks import Task, load_tasks
from provrl.pipeline.engines import stage_engine_config
from provrl.pipeline.probe import check_fresh as check
from provrl.pipeline.probe import current_manifest, run_filter, run_probe
from provrl.pipeline.rundir import RunDir
from provrl.rollout.evaluate import evaluate
from provrl.run_config.run import RunConfig
from provrl.train.sft import run_sft
from provrl.trajlog import read_all


def probe(
    cfg: RunConfig,
    run: RunDir,
    world_dir: Path,
    tasks: list[Task],
    policy: str,
    progress: bool,
    engines: EngineFactory,
) -> dict[str, Any]:
    """k samples per task with the current policy and tools, into ``RUN/probe`` (a probe
    directory, :mod:`provrl.pipeline.probe`; resumable)."""
    loop = cfg.pipeline.loop
    out = run_probe(
        policy,
        tasks,
        world_dir,
        cfg.env,
        run.stage("probe"),
        k=loop.k,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        engine_cfg=stage_engine_config(cfg, loop.concurrency),
        concurrency=loop.concurrency,
        progress=progress,
        make_engine=engines,
    )
    out.pop("records")  # in RUN/probe/probe.json; the stage marker keeps the summary
    return out


def filter_pools(cfg: RunConfig, run: RunDir) -> dict[str, Any]:
    """The probe's tasks into kept / unsolved / solved (``pipeline.filter`` band), with the
    retention report, into ``RUN/filter``."""
    f = cfg.pipeline.filter
    out = run_filter(
        run.root / "probe", run.stage("filter"), lo=f.min_successes, hi=f.max_successes, report=True
    )
    out.pop("pool_of")
    return out


def load_pool(run: RunDir, name: str) -> list[Task]:
    return load_tasks(run.root / "filter" / f"{name}.jsonl")


def rl_tasks(cfg: RunConfig, run: RunDir) -> list[Task]:
    """The RL stage's tasks: every probed task (kept, unsolved, solved) when the online
    curriculum moves them between pools, else those of ``pipeline.rl_pools``."""
    names = ("kept", "unsolved", "solved") if cfg.pipeline.curriculum.enabled else cfg.pipeline.rl_pools  # fmt: skip
    return [t for name in names for t in load_pool(run, name)]


def check_fresh(cfg: RunConfig, run: RunDir, policy: str, world_dir: Path) -> list[str]:
    """Refuse pools probed with another policy or tool configuration than the RL stage will
    use (unless ``pipeline.allow_stale_pools``)."""
    now = current_manifest(
        policy, world_dir, cfg.env, k=cfg.pipeline.loop.k, seed=cfg.seed, dtype=cfg.model.dtype
    )
    summary = json.loads((run.root / "filter" / "filter.json").read_text())
    return check(summary, now, allow=cfg.pipeline.allow_stale_pools)


def self_sft(
    cfg: RunConfig, run: RunDir, probe: dict[str, Any], policy: str, progress: bool
) -> dict[str, Any]:
    """SFT of ``policy`` on its own successful probe traces, the one with the fewest tool
    calls per task (labelled policy data)."""
    d = run.stage("selfsft")
    sft_cfg = cfg.sft.model_copy(update={"selection": "fewest_tool_calls", "max_per_task": 1})
    out = run_sft(
        [run.root / "probe" / "trajectories.jsonl"],
        policy,
        d / "ckpt",
        sft_cfg,
        run_dir=d,
        dtype=cfg.model.dtype,
    )
    out["source"] = "policy (own probe successes)"
    return out


def evaluate_policy(
    cfg: RunConfig,
    run: RunDir,
    world_dir: Path,
    name: str,
    policy: str,
    tasks: list[Task],
    progress: bool,
    engines: EngineFactory,
) -> dict[str, Any]:
    """Evaluate ``policy`` on the eval slice of the held-out split (``pipeline.eval.split``,
    or the tasks of ``pipeline.eval.file``), k samples per task, with binomial standard
    errors; resumable (samples in the log are not rerun)."""
    e = cfg.pipeline.eval
    env_cfg = _env_for(cfg, concurrency=e.concurrency)
    env_cfg.agent.temperature = e.temperature
    env_cfg.eval.split, env_cfg.eval.k = e.split, e.k
    env_cfg.eval.n, env_cfg.eval.tiers = len(tasks), tuple(cfg.pipeline.tasks.tiers)
    if e.file is not None:  # the user's tasks (tier 0): no tier filter
        env_cfg.eval.tiers = ()
    env_cfg.eval.seed = cfg.pipeline.tasks.seed
    out = evaluate(
        policy,
        world_dir,
        env_cfg,
        run.root / "eval" / name,
        progress=progress,
        dtype=cfg.model.dtype,
        engine_cfg=stage_engine_config(cfg, e.concurrency),
        make_engine=engines,
        tasks_file=e.file,
    )

    trajs = read_all(run.root / "eval" / name / "trajectories.jsonl")
    return out | binomial_summary(out) | solved_efficiency(trajs)


def binomial_summary(ev: dict[str, Any]) -> dict[str, Any]:
    """Standard errors: accuracy p̂ over n·k samples, SE = √(p̂(1−p̂)/(n·k))."""
    n = ev["samples"] if "samples" in ev else ev["n"] * ev["k"]
    p = ev["accuracy"]
    return {"accuracy_se": math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))}


def solved_efficiency(trajs: Sequence[Any]) -> dict[str, Any]:
    """Per-task accuracy (for paired comparisons and the task-clustered standard error
    SE = sd_i(K_i/k)/√n, which the sample-level binomial SE understates), and tool calls of
    solved episodes against the oracle minimum *of the same episodes' tasks* — so a policy
    that starts solving two-hop tasks is not counted as wasting calls."""
    by_task: dict[str, list[float]] = {}
    calls, mins = [], []
    for t in trajs:
        em = float(t.metrics.get("exact_match", 0.0))
        by_task.setdefault(t.task_id, []).append(em)
        if em > 0:
            calls.append(float(t.metrics["num_tool_calls"]))
            mins.append(float(t.metrics["min_searches"]))
    acc = {task: float(np.mean(v)) for task, v in by_task.items()}
    a = np.array(list(acc.values()))
    n = len(a)
    c, m = (float(np.mean(calls)), float(np.mean(mins))) if calls else (math.nan, math.nan)
    return {
        "task_accuracy": acc,
        "accuracy_se_tasks": float(a.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
        "oracle_min_tool_calls_solved": m,
        "excess_tool_calls_solved": c / m - 1 if calls and m > 0 else math.nan,
    }


def paired_difference(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """b − a over the tasks both evaluated: mean and its paired SE sd(d_i)/√n."""
    common = sorted(set(a) & set(b))
    d = np.array([b[t] - a[t] for t in common])
    if len(d) < 2:
        return {"diff": math.nan, "se": math.nan, "tasks": float(len(d))}
    return {
        "diff": float(d.mean()),
        "se": float(d.std(ddof=1) / math.sqrt(len(d))),
        "tasks": float(len(d)),
    }


def _env_for(cfg: RunConfig, *, concurrency: int) -> Any:
    env = cfg.env.model_copy(deep=True)
    env.eval.concurrency = concurrency
    return env
