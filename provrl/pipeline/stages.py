"""The stages of ``provrl run`` between the warm start and RL, and the evaluation stage.

Each is a function of (config, run directory, inputs) that returns the stage summary
(``RUN/{stage}/done.json``); :mod:`provrl.pipeline.run` calls them in order.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from provrl.env.tasks import Task, load_tasks, save_tasks
from provrl.pipeline.rundir import RunDir
from provrl.run_config import RunConfig

POOLS = ("kept", "unsolved", "solved")


def probe(
    cfg: RunConfig, run: RunDir, world_dir: Path, tasks: list[Task], policy: str, progress: bool
) -> dict[str, Any]:
    """k samples per task with the current policy and tools (resumable: samples already in
    the log are not rerun); per-task K and the identities of policy and tools."""
    from provrl.pipeline.collector import Collector, open_policy_env
    from provrl.trajlog import TrajectoryWriter, read_trajectories

    d = run.stage("probe")
    k = cfg.pipeline.rl.k
    log = d / "trajectories.jsonl"
    done = list(read_trajectories(log)) if log.is_file() else []
    env_cfg = _env_for(cfg, concurrency=cfg.pipeline.rl.concurrency)
    K: dict[str, int] = {}
    with (
        open_policy_env(
            policy,
            world_dir,
            env_cfg,
            dtype=cfg.model.dtype,
            engine_cfg=_engine_cfg(cfg, cfg.pipeline.rl.concurrency),
        ) as (env, _),
        TrajectoryWriter(log) as writer,
        Collector(
            env,
            concurrency=cfg.pipeline.rl.concurrency,
            seed=cfg.seed,
            writer=writer,
            progress="probe" if progress else None,
        ) as col,
    ):
        for g in col.run(tasks, k, done=done):
            K[g.task.task_id] = g.successes
        stats = col.summary()
        policy_id, tools_id = env.policy, env.tools
    save_tasks(tasks, d / "tasks.jsonl")
    return {
        "policy": policy,
        "policy_fingerprint": policy_id.fingerprint,
        "tools_fingerprint": tools_id.fingerprint,
        "k": k,
        "K": K,
        "throughput": stats,
    }


def filter_pools(cfg: RunConfig, run: RunDir, probe: dict[str, Any]) -> dict[str, Any]:
    """kept: 0 < K < k; unsolved: K = 0 (re-probed later, never "unlearnable"); solved:
    K = k. Every probed task lands in exactly one pool."""
    d = run.stage("filter")
    k, K = int(probe["k"]), probe["K"]
    tasks = load_tasks(run.root / "probe" / "tasks.jsonl")
    pool_of = {
        t.task_id: "unsolved" if K[t.task_id] == 0 else "solved" if K[t.task_id] == k else "kept"
        for t in tasks
    }
    sizes = {}
    for name in POOLS:
        members = [t for t in tasks if pool_of[t.task_id] == name]
        save_tasks(members, d / f"{name}.jsonl")
        sizes[name] = len(members)
    hist = np.bincount([K[t.task_id] for t in tasks], minlength=k + 1).tolist()
    return {"sizes": sizes, "K_histogram": hist, "k": k}


def load_pool(run: RunDir, name: str) -> list[Task]:
    return load_tasks(run.root / "filter" / f"{name}.jsonl")


def check_fresh(cfg: RunConfig, probe: dict[str, Any], policy: str, world_dir: Path) -> None:
    """Refuse pools probed with another policy or tool configuration (unless
    ``pipeline.allow_stale_pools``)."""
    from provrl.env.agent import tools_identity
    from provrl.env.evaluate import search_backend

    tools = tools_identity(search_backend(world_dir, cfg.env), cfg.env.search, cfg.env.agent)
    problems = []
    if probe["policy"] != policy:
        problems.append(f"policy {probe['policy']} ≠ {policy}")
    if probe["tools_fingerprint"] != tools.fingerprint:
        problems.append("tool configuration changed")
    if problems and not cfg.pipeline.allow_stale_pools:
        raise ValueError(
            "stale filter pools: " + "; ".join(problems) + " (re-probe, or set "
            "pipeline.allow_stale_pools=true)"
        )


def self_sft(
    cfg: RunConfig, run: RunDir, probe: dict[str, Any], policy: str, progress: bool
) -> dict[str, Any]:
    """SFT of ``policy`` on its own successful probe traces, the one with the fewest tool
    calls per task (labelled policy data)."""
    from provrl.train.sft import run_sft

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
) -> dict[str, Any]:
    """Evaluate ``policy`` on the eval slice of the test split, k samples per task, with
    binomial standard errors; resumable (samples in the log are not rerun)."""
    from provrl.env.evaluate import evaluate

    e = cfg.pipeline.eval
    env_cfg = _env_for(cfg, concurrency=e.concurrency)
    env_cfg.agent.temperature = e.temperature
    env_cfg.eval.split, env_cfg.eval.k = "test", e.k
    env_cfg.eval.n, env_cfg.eval.tiers = len(tasks), tuple(cfg.pipeline.tasks.tiers)
    env_cfg.eval.seed = cfg.pipeline.tasks.seed
    out = evaluate(
        policy,
        world_dir,
        env_cfg,
        run.root / "eval" / name,
        progress=progress,
        dtype=cfg.model.dtype,
        engine_cfg=_engine_cfg(cfg, e.concurrency),
    )
    return out | binomial_summary(out)


def binomial_summary(ev: dict[str, Any]) -> dict[str, Any]:
    """Standard errors: accuracy p̂ over n·k samples, SE = √(p̂(1−p̂)/(n·k))."""
    n = ev["samples"] if "samples" in ev else ev["n"] * ev["k"]
    p = ev["accuracy"]
    return {"accuracy_se": math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))}


def _env_for(cfg: RunConfig, *, concurrency: int) -> Any:
    env = cfg.env.model_copy(deep=True)
    env.eval.concurrency = concurrency
    return env


def _engine_cfg(cfg: RunConfig, concurrency: int) -> Any:
    return cfg.engine.model_copy(update={"max_seqs": max(cfg.engine.max_seqs, concurrency)})
