"""The builder of the RL stage's parts: one function from the run config to what the loop
runs on — the model, the engine (through the run's one factory), the agent environment,
the learner and the metrics sink::

    parts = build_rl_parts(cfg, rl_dir, world_dir, policy=..., start_policy=..., version=v,
                           seed=s)
    parts.lm         the policy's weights (the newest checkpoint's, or the start policy's)
    parts.engine     engine_factory(cfg)(lm, stage_engine_config(cfg, …), version=v)
    parts.env        build_env(engine, lm, world_dir, cfg.env)
    parts.learner    make_learner(lm, cfg, engine, …): this process, or a Ray actor
    parts.metrics    MetricsWriter of RUN/rl (metrics.jsonl, TensorBoard, trackers)

:meth:`RLLoop.open <provrl.pipeline.rl_loop.RLLoop.open>` builds them on what the step log
read back (:class:`~provrl.pipeline.steplog.StepLog`: the newest intact checkpoint, its
version) and hands them to the loop, which owns none of the wiring.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch

from provrl.distributed.factory import fleet_summary
from provrl.engine.api import Engine, EngineFactory, ThreadedEngine
from provrl.engine.router import engine_load
from provrl.models.loading import LoadedModel, load_model
from provrl.pipeline.engines import engine_factory, make_learner, stage_engine_config
from provrl.report.metrics import MetricsWriter
from provrl.rollout.agent import AgentEnv
from provrl.rollout.setup import build_env
from provrl.run_config.run import RunConfig
from provrl.train.learner import Learner, LocalLearner


@dataclass
class RLParts:
    """What the RL loop runs on (:func:`build_rl_parts`)."""

    lm: LoadedModel
    """The policy as loaded in this process (the learner's start, the engine's source)."""
    engine: Engine
    """The rollout engine (local, vLLM or Ray replicas: ``engine.backend``)."""
    env: AgentEnv
    """The agent environment on ``engine``: tools, prompt, reward, identities."""
    learner: Learner
    """The trainer: :class:`~provrl.train.learner.LocalLearner` or a Ray actor."""
    metrics: MetricsWriter
    """The stage's metrics sink."""
    engine_threads: int
    """torch threads of the engine's scheduler thread (0: torch's default)."""
    trainer_threads: int
    """torch threads of the learner thread (0: the process default)."""
    lent_threads: int = 0
    """torch threads of the engine while the learner waits for a batch (0: no lending —
    ``pipeline.loop.lend_cores`` off, or an engine that does not compute in this process)."""
    borrowed_threads: int = 0
    """torch threads of a learner micro-batch while the engine has nothing to compute (0: no
    borrowing — ``pipeline.loop.borrow_cores`` off, or an engine or learner elsewhere)."""
    micro_batches: Counter[str] = field(default_factory=Counter)
    """Learner micro-batches by the threads they ran on: ``own`` or ``borrowed``."""

    def lend_cores(self, learner_busy: bool) -> None:
        """``pipeline.loop.lend_cores``: the engine computes on ``engine_threads`` while the
        learner trains and on ``lent_threads`` while it waits (an in-process engine only)."""
        if self.lent_threads:  # set only for an engine that computes here (build_rl_parts)
            engine = cast(ThreadedEngine, self.engine)
            engine.set_threads(self.engine_threads if learner_busy else self.lent_threads)

    def learner_threads(self) -> int:
        """``pipeline.loop.borrow_cores``: the learner's torch threads for its next
        micro-batch (:attr:`RLTrainer.micro_threads <provrl.train.rl.RLTrainer.micro_threads>`)
        — ``borrowed_threads`` while the engine has no turn generating or queued, else its own
        ``trainer_threads``."""
        idle = engine_load(self.engine) == 0
        self.micro_batches["borrowed" if idle else "own"] += 1
        return self.borrowed_threads if idle else self.trainer_threads

    def summary(self) -> dict[str, Any]:
        """What the parts say about this session, for the stage summary (before
        :meth:`close`): the engine's counters, the Ray fleet's versions per replica (None
        off Ray), the trainer's info and the torch thread split."""
        engine = self.engine.stats()
        return {
            "engine": engine,
            "fleet": fleet_summary(self.engine, engine),
            "trainer": self.learner.info(),
            "threads": {
                "engine": self.engine_threads,
                "trainer": self.trainer_threads,
                "lent": self.lent_threads,
                "borrowed": self.borrowed_threads,
                "micro_batches": dict(self.micro_batches),
            },
        }

    def learner_thread(self) -> ThreadPoolExecutor:
        """The async loop's learner thread, with ``trainer_threads`` torch threads."""
        return ThreadPoolExecutor(
            1, "learner", initializer=_set_threads, initargs=(self.trainer_threads,)
        )

    def close(self) -> None:
        """Close the learner, the engine and the metrics sink (in that order)."""
        self.learner.close()
        self.engine.close()
        self.metrics.close()


def rl_seeds(cfg: RunConfig) -> tuple[int, int]:
    """(the RL stage's seed — its engine's sampling and its collector —, the curriculum's
    order seed): ``pipeline.loop.seed`` when set, else the run's ``seed`` and an order
    derived from ``pipeline.tasks.seed`` alone."""
    loop = cfg.pipeline.loop
    seed = cfg.seed if loop.seed is None else loop.seed
    return seed, cfg.pipeline.tasks.seed + 1 + (0 if loop.seed is None else 7919 * seed)


def _set_threads(n: int) -> None:
    """torch intra-op threads of the calling thread (0: leave the default)."""
    if n:
        torch.set_num_threads(n)


class ThreadSplit(NamedTuple):
    """torch intra-op threads of the RL stage's two sides (:func:`split_threads`)."""

    engine: int
    """The engine's scheduler thread (0: torch's default)."""
    trainer: int
    """The learner thread (0: the process default)."""
    lent: int
    """The engine's while the learner waits (``lend_cores``; 0: none)."""
    borrowed: int
    """A learner micro-batch's while the engine has nothing to compute (``borrow_cores``; 0:
    none)."""


def split_threads(cfg: RunConfig) -> ThreadSplit:
    """``engine.threads``, the default and no lending or borrowing; or with async
    ``split_cores`` half of torch's intra-op threads each (at least one) and all of them for
    the engine while the learner waits (``lend_cores``), for the learner while the engine has
    nothing to compute (``borrow_cores``)."""
    loop = cfg.pipeline.loop
    if loop.mode == "async" and loop.split_cores:
        cores = torch.get_num_threads()
        half = max(1, cores // 2)
        more = cores if cores > half else 0
        return ThreadSplit(half, half, more if loop.lend_cores else 0, more if loop.borrow_cores else 0)  # fmt: skip
    return ThreadSplit(cfg.engine.threads, 0, 0, 0)


def build_rl_parts(
    cfg: RunConfig,
    rl_dir: Path,
    world_dir: Path,
    *,
    policy: str,
    start_policy: str,
    version: int,
    seed: int,
    optimizer_state: str | os.PathLike[str] | None = None,
    engines: EngineFactory | None = None,
) -> RLParts:
    """Load ``policy`` (the newest checkpoint, or ``start_policy`` at version 0) with torch
    seeded ``seed + version``, start its engine from ``engines`` (default: the run's
    :func:`~provrl.pipeline.engines.engine_factory`) with
    :func:`~provrl.pipeline.engines.stage_engine_config`, build the environment (its policy
    identity names ``start_policy``), the metrics sink of ``rl_dir`` and the learner
    (``optimizer_state``: the checkpoint a resumed run restores the optimizer from)."""
    torch.manual_seed(seed + version)
    lm = load_model(policy, dtype=cfg.model.dtype, device=cfg.model.device)
    engine_threads, trainer_threads, lent_threads, borrowed_threads = split_threads(cfg)
    engine_cfg = stage_engine_config(
        cfg, cfg.pipeline.loop.concurrency, seed=seed + version, threads=engine_threads
    )
    engine = (engines or engine_factory(cfg))(lm, engine_cfg, version=version)
    if not isinstance(engine, ThreadedEngine):  # vLLM's or Ray's processes keep their cores
        lent_threads = borrowed_threads = 0
    metrics = None
    try:
        env = build_env(engine, lm, world_dir, cfg.env, extra={"start": start_policy})
        metrics = MetricsWriter.from_logging(
            rl_dir, cfg.logging, config=cfg.model_dump(mode="json")
        )
        learner = make_learner(  # engine.backend: ray → a trainer actor; else this process
            lm,
            cfg,
            engine,
            version=version,
            metrics=metrics,
            threads=trainer_threads,
            optimizer_state=optimizer_state,
            reference=start_policy,  # π_ref of the KL penalty, also after a resume
        )
    except BaseException:  # a part that fails to build closes the ones already built
        if metrics is not None:
            metrics.close()
        engine.close()
        raise
    parts = RLParts(lm, engine, env, learner, metrics, engine_threads, trainer_threads, lent_threads)  # fmt: skip
    if borrowed_threads and isinstance(learner, LocalLearner):  # a Ray trainer keeps its cores
        parts.borrowed_threads = borrowed_threads
        learner.trainer.micro_threads = parts.learner_threads
    return parts
