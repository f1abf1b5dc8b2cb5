"""The RL stage: GRPO (or PPO / TRPO, as ``rl`` configures the trainer) on the kept pool.

Two orchestrations of the same three roles — collector (actor), trainer (learner), engine:

**sync** (strict on-policy)::

    repeat steps times:
        roll out G groups × k samples under θ_u          (engine at version u)
        assert every action token has version u
        θ_{u+1} = trainer.step(batch)
        save checkpoint u+1; engine.load_weights(θ_{u+1}, mode="drain")   # caches reset

**async** (hot-load)::

    the collector keeps ``concurrency`` agent loops running, starting groups while
        admission allows (n < (s + 1 + L) · G, :mod:`provrl.pipeline.admission`);
    whenever the trainer is idle and G completed groups within the lag bound are ready:
        θ_{u+1} = trainer.step(batch)                    (a background thread)
    when a step finishes: save checkpoint u+1, then engine.load_weights(θ_{u+1}, mode="keep")
        — between two decode steps; in-flight requests keep their KV and continue under u+1.

Every trajectory carries per-token (version, log q, kept mass, KV versions), so the trainer's
importance weights use the probabilities the tokens were actually sampled with, whatever mix
of versions a trajectory holds.

Resume (``RUN/rl`` after a ``kill -9``): the newest complete checkpoint gives θ, the optimizer,
the version and the set of trained trajectories; the trajectory log is read back — complete
untrained groups go back to the ready queue (subject to the lag rule), incomplete ones are
finished without rerunning the samples that exist, and new groups continue from the data
cursor. A version is hot-loaded only after its checkpoint is complete, so no trajectory can
carry a version that a resumed run would produce again.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from provrl._sys import release_memory, rss_mb, write_json
from provrl.distributed.factory import fleet_summary
from provrl.engine.api import EngineFactory
from provrl.env.tasks import Task
from provrl.failpoints import failpoint
from provrl.pipeline.admission import group_lag, may_start, split_stale
from provrl.pipeline.engines import engine_factory, make_learner
from provrl.pipeline.rundir import COMPLETE, RunDir
from provrl.provenance import Trajectory
from provrl.rollout.collector import Collector, Group
from provrl.rollout.setup import build_env
from provrl.run_config import RunConfig


class TaskOrder:
    """The data cursor: group number n ↦ (task, round). Round r visits every task once in a
    seeded random order, so n = r · N + position of the task in round r's order."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("the RL task pool is empty (the filter kept no task)")
        self.tasks, self.seed = list(tasks), seed
        self._orders: dict[int, list[int]] = {}

    def order(self, r: int) -> list[int]:
        if r not in self._orders:
            rng = np.random.default_rng([self.seed, r, 7919])
            self._orders[r] = [int(i) for i in rng.permutation(len(self.tasks))]
        return self._orders[r]

    def __getitem__(self, n: int) -> tuple[Task, int]:
        r, i = divmod(n, len(self.tasks))
        return self.tasks[self.order(r)[i]], r

    def index(self, task_id: str, r: int) -> int:
        pos = {self.tasks[j].task_id: p for p, j in enumerate(self.order(r))}
        return r * len(self.tasks) + pos[task_id]


@dataclass
class RLState:
    """What a checkpoint stores besides weights and optimizer (``state.json``)."""

    version: int = 0
    steps: int = 0
    trained: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    trainer_busy_s: float = 0.0


def batch_stats(groups: Sequence[Group], trainer_version: int) -> dict[str, Any]:
    """Outcome and provenance statistics of one training batch."""
    trajs = [t for g in groups for t in g.trajectories]
    em = np.array([t.metrics.get("exact_match", 0.0) for t in trajs])
    calls = np.array([t.metrics.get("num_tool_calls", 0.0) for t in trajs])
    lags: Counter[int] = Counter()
    mixed = 0
    for t in trajs:
        v = t.version[t.is_action]
        lags.update((trainer_version - v).tolist())
        mixed += len(np.unique(v)) > 1
    return {
        "accuracy": float(em.mean()),
        "tool_calls": float(calls.mean()),
        "tool_calls_solved": float(calls[em > 0].mean()) if (em > 0).any() else float("nan"),
        "malformed": float(np.mean([t.metrics.get("malformed_calls", 0.0) for t in trajs])),
        "action_tokens": float(np.mean([t.num_actions for t in trajs])),
        "mixed_version_trajectories": mixed,
        "lag_histogram": {str(k): int(v) for k, v in sorted(lags.items())},
        "max_lag": max(lags) if lags else 0,
        "groups_K": [g.successes for g in groups],
        "trained": [t.traj_id for t in trajs],
    }


def run_rl(
    cfg: RunConfig,
    run: RunDir,
    world_dir: Path,
    tasks: Sequence[Task],
    start_policy: str,
    *,
    progress: bool = True,
    engines: EngineFactory | None = None,
) -> dict[str, Any]:
    """Train ``start_policy`` with RL on ``tasks`` (see the module docstring); returns the
    stage summary. Resumes from ``RUN/rl`` when it holds a checkpoint or a log. ``engines``:
    the run's engine factory (default: :func:`~provrl.pipeline.engines.engine_factory`)."""
    import torch

    from provrl.models import load_model
    from provrl.report.metrics import MetricsWriter
    from provrl.trajlog import TrajectoryWriter, read_trajectories

    loop, rl_dir = cfg.pipeline.loop, run.stage("rl")
    latest = run.latest_checkpoint()
    state = RLState()
    policy_path = start_policy
    if latest is not None:
        state = RLState(**json.loads((latest[1] / "state.json").read_text()))
        policy_path = str(latest[1])
    torch.manual_seed(cfg.seed + state.version)
    lm = load_model(policy_path, dtype=cfg.model.dtype, device=cfg.model.device)
    engine_threads, trainer_threads = cfg.engine.threads, 0
    if loop.mode == "async" and loop.split_cores:
        half = max(1, torch.get_num_threads() // 2)
        engine_threads, trainer_threads = half, half
    engine_cfg = cfg.engine.model_copy(
        update={
            "max_seqs": max(cfg.engine.max_seqs, loop.concurrency),
            "seed": cfg.seed + state.version,
            "threads": engine_threads,
        }
    )
    engines = engines or engine_factory(cfg)  # engine.backend: local | vllm | ray
    engine = engines(lm, engine_cfg, version=state.version)
    env = build_env(engine, lm, world_dir, cfg.env, extra={"start": start_policy})
    metrics = MetricsWriter.from_logging(rl_dir, cfg.logging, config=cfg.model_dump(mode="json"))
    learner = make_learner(  # engine.backend: ray → a trainer actor; else this process
        lm,
        cfg,
        engine,
        version=state.version,
        metrics=metrics,
        threads=trainer_threads,
        optimizer_state=None if latest is None else latest[1],
    )

    order = TaskOrder(tasks, cfg.pipeline.tasks.seed + 1)
    by_id = {t.task_id: t for t in tasks}
    trained, dropped = set(state.trained), set(state.dropped)
    log_path = rl_dir / "trajectories.jsonl"
    logged: list[Trajectory] = list(read_trajectories(log_path)) if log_path.is_file() else []
    G, k = loop.groups_per_step, loop.k

    # --- rebuild the queue from the log: untrained groups, and the data cursor ---------------
    partial: dict[str, list[Trajectory]] = defaultdict(list)
    cursor = 0
    for t in logged:
        key = str(t.meta.get("group", ""))
        if t.traj_id in trained or t.traj_id in dropped or "#r" not in key:
            continue
        partial[key].append(t)
    for t in logged:
        r = int(t.meta.get("round", 0))
        if t.task_id in by_id:
            cursor = max(cursor, order.index(t.task_id, r) + 1)
    resumed = {"trajectories_in_log": len(logged), "untrained_groups": len(partial)}

    steps_log = rl_dir / "steps.jsonl"
    t_session = time.perf_counter()  # this process: the engine's counters start here
    t_start = t_session - state.wall_s  # the stage: wall time accumulates across resumes
    trainer_busy = state.trainer_busy_s
    ready: list[Group] = []
    n_dropped_groups = 0
    outstanding = 0  # groups started (or resubmitted) and not yet trained or dropped

    def save(result_version: int) -> None:
        """Checkpoint u+1 (weights, optimizer, RNG, trained ids) — complete before hot-load."""
        final = rl_dir / f"ckpt-v{result_version}"
        learner.save(final, kind="rl", version=result_version, start_policy=start_policy)
        state.version, state.wall_s = result_version, time.perf_counter() - t_start
        state.trainer_busy_s = trainer_busy
        write_json(final / "state.json", state.__dict__)
        (final / COMPLETE).write_text("")
        run.prune_checkpoints(keep=1)

    def record(step_metrics: dict[str, Any], stats: dict[str, Any]) -> None:
        line = {
            "step": state.steps,
            "version": state.version,
            **stats,
            **step_metrics,
            "wall_s": time.perf_counter() - t_start,
            "rss_mb": rss_mb(),
        }
        with open(steps_log, "a") as f:
            f.write(json.dumps(line, default=float) + "\n")
        metrics.log(
            state.steps,
            {k: v for k, v in stats.items() if isinstance(v, int | float)},
            prefix="rl_batch",
        )

    def train(groups: list[Group]) -> tuple[Any, dict[str, Any]]:
        stats = batch_stats(groups, learner.version)
        result = learner.step([t for g in groups for t in g.trajectories])
        return result, stats

    def finish_step(result: Any, stats: dict[str, Any], groups: list[Group], mode: str) -> None:
        nonlocal trainer_busy, outstanding
        outstanding -= len(groups)
        trainer_busy += float(result.metrics.get("step_s", 0.0))
        state.trained.extend(t.traj_id for g in groups for t in g.trajectories)
        state.steps += 1
        save(result.version)  # before the engine may sample a single token of it
        record(dict(result.metrics), stats)
        failpoint("rl.saved")  # version u+1 saved, not yet loaded anywhere
        engine.load_weights(result.weights, result.version, mode=mode)  # type: ignore[arg-type]
        failpoint("rl.hotloaded")
        release_memory()
        bar.update(1)
        bar.set_postfix(acc=f"{stats['accuracy']:.2f}", calls=f"{stats['tool_calls']:.2f}")

    from tqdm import tqdm

    bar = tqdm(
        total=loop.steps,
        initial=state.steps,
        desc=f"rl ({loop.mode})",
        unit="step",
        dynamic_ncols=True,
        disable=not progress,
    )
    with (
        TrajectoryWriter(log_path) as writer,
        Collector(env, concurrency=loop.concurrency, seed=cfg.seed, writer=writer) as col,
    ):
        for key, trajs in partial.items():
            task_id, round_ = key.split("#r")
            if loop.mode == "sync" or task_id not in by_id:
                # strict on-policy never trains what an earlier version sampled
                state.dropped.extend(t.traj_id for t in trajs)
                continue
            col.submit(by_id[task_id], k, round=int(round_), done=trajs)
            outstanding += 1

        def next_group() -> None:
            nonlocal cursor, outstanding
            task, r = order[cursor]
            col.submit(task, k, round=r)
            cursor += 1
            outstanding += 1

        if loop.mode == "sync":
            while state.steps < loop.steps:
                while col.queued + col.in_flight < G * k and len(ready) < G:
                    next_group()
                while len(ready) < G:
                    ready.extend(col.poll(0.2))
                batch, ready = ready[:G], ready[G:]
                for g in batch:  # strict on-policy: every token from the weights being updated
                    for t in g.trajectories:
                        vs = t.version[t.is_action]
                        if len(vs) and (vs != learner.version).any():
                            raise AssertionError(
                                f"sync: {t.traj_id} has versions {sorted(set(vs.tolist()))}, "
                                f"trainer is at {learner.version}"
                            )
                result, stats = train(batch)
                finish_step(result, stats, batch, "drain")
        else:
            background = ThreadPoolExecutor(
                1,
                thread_name_prefix="learner",
                initializer=lambda: _set_threads(trainer_threads),
            )
            fut: Future[tuple[Any, dict[str, Any]]] | None = None
            in_training: list[Group] = []
            try:
                while state.steps < loop.steps:
                    while col.queued < loop.concurrency and may_start(outstanding, G, loop.max_lag):
                        next_group()
                    ready.extend(col.poll(0.05))
                    if fut is not None and fut.done():
                        result, stats = fut.result()
                        finish_step(result, stats, in_training, loop.hotload)
                        fut, in_training = None, []
                    if fut is None and state.steps < loop.steps:
                        fresh, stale = split_stale(ready, learner.version, loop.max_lag)
                        for g in stale:
                            state.dropped.extend(t.traj_id for t in g.trajectories)
                            n_dropped_groups += 1
                            outstanding -= 1
                        ready = fresh
                        if len(ready) >= G:
                            in_training, ready = ready[:G], ready[G:]
                            assert all(
                                group_lag(g, learner.version) <= loop.max_lag for g in in_training
                            )
                            fut = background.submit(train, in_training)
            finally:
                background.shutdown(wait=True)
        col.drain()
        collector = col.summary()
    bar.close()
    eng = engine.stats()
    fleet = fleet_summary(engine, eng)  # engine.backend: ray — versions per replica, faults
    trainer_info = learner.info()
    learner.close()
    engine.close()
    metrics.close()
    wall = time.perf_counter() - t_start
    session = time.perf_counter() - t_session
    summary = {
        "mode": loop.mode,
        "steps": state.steps,
        "final_version": state.version,
        "checkpoint": str(run.latest_checkpoint()[1]) if run.latest_checkpoint() else start_policy,  # type: ignore[index]
        "trajectories_trained": len(state.trained),
        "groups_dropped_stale": n_dropped_groups + len(dropped),
        "resumed": resumed,
        "wall_s": wall,
        "stage_wall_s": wall,
        "session_wall_s": session,
        "trainer_busy_s": trainer_busy,
        "trainer_idle_frac": max(0.0, 1 - trainer_busy / wall) if wall else 0.0,
        # the engine's counters cover this process only (a resumed run starts a new engine)
        "engine_busy_frac": min(1.0, eng.get("busy_s", 0.0) / eng.get("replicas", 1.0) / session)
        if session
        else 0.0,
        "threads": {"engine": engine_threads, "trainer": trainer_threads},
        "trainer": trainer_info,
        "engine": {
            k: eng[k] for k in ("tokens_generated", "hotloads", "evictions", "busy_s") if k in eng
        },
        "collector": collector,
    }
    if fleet is not None:
        summary["ray"] = fleet
    return summary


def _set_threads(n: int) -> None:
    """torch intra-op threads of the calling thread (0: leave the default)."""
    import torch

    if n:
        torch.set_num_threads(n)


def read_steps(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-step records of a run's RL stage (``RUN/rl/steps.jsonl``)."""
    p = Path(run_dir) / "rl" / "steps.jsonl"
    if not p.is_file():
        return []
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(p.read_text().splitlines()):
                break  # a torn last line after a kill
            raise ValueError(f"{p}:{i}: unreadable step record ({e})") from e
    return out
