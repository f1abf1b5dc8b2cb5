"""The one switch the orchestration calls: the rollout engine the run config asks for, and
what the run's summary records about it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from provrl.engine.api import Engine
from provrl.engine.config import EngineConfig

if TYPE_CHECKING:
    import os

    from provrl.run_config import RunConfig
    from provrl.train.learner import Learner

FLEET_FAULTS = ("deaths", "restarts", "turns_resubmitted", "turns_failed", "requests_reprefilled")
"""Fault counters the RL stage summary keeps (fleet totals and per replica)."""

PER_REPLICA = ("tokens_generated", "busy_s", "hotloads", "incarnation", *FLEET_FAULTS)
"""Per-replica counters the RL stage summary keeps."""


def make_rollout_engine(
    lm: Any, cfg: RunConfig, engine_cfg: EngineConfig | None = None, *, version: int = 0
) -> Engine:
    """``backend: local`` → the in-process engine ``engine.backend`` names
    (:func:`provrl.engine.make_engine`: a :class:`~provrl.engine.LocalEngine`, or vLLM);
    ``backend: ray`` → ``ray.replicas`` Ray actors behind the router
    (:class:`~provrl.distributed.engine.RayEngine`), whose ``load_weights`` publishes each
    version once and applies ``ray.schedule``. ``engine_cfg`` defaults to ``cfg.engine``;
    ``lm`` holds the weights of ``version``."""
    engine_cfg = engine_cfg or cfg.engine
    if cfg.backend == "ray":
        from provrl.distributed.engine import RayEngine
        from provrl.extras import require

        require("ray", "ray", "backend: ray")  # one line naming the extra, before any import

        return RayEngine(lm, engine_cfg, cfg.ray, version=version)
    from provrl.engine.factory import make_engine

    return make_engine(lm, engine_cfg, version=version)


def make_learner(
    lm: Any,
    cfg: RunConfig,
    engine: Engine,
    *,
    version: int,
    metrics: Any = None,
    threads: int = 0,
    optimizer_state: str | os.PathLike[str] | None = None,
) -> Learner:
    """The RL stage's learner: ``backend: local`` → a
    :class:`~provrl.train.learner.LocalLearner` over ``lm.model`` in this process;
    ``backend: ray`` → a :class:`~provrl.distributed.trainer.RayLearner`, the trainer in a
    Ray actor starting from the model the replicas started from (``engine.model_ref``).
    ``threads``: torch threads the trainer should use (0: ``ray.trainer_threads``, else the
    process default); ``optimizer_state``: the checkpoint directory a resumed run restores
    the optimizer from."""
    if cfg.backend == "ray":
        from provrl.distributed.engine import RayEngine
        from provrl.distributed.trainer import RayLearner

        return RayLearner(
            engine.model_ref if isinstance(engine, RayEngine) else lm,
            cfg.rl,
            cfg.ray,
            version=version,
            seed=cfg.seed + version,
            threads=threads or cfg.ray.trainer_threads,
            metrics=metrics,
            optimizer_state=optimizer_state,
        )
    from provrl.train.learner import LocalLearner

    return LocalLearner(
        lm, cfg.rl, version=version, metrics=metrics, optimizer_state=optimizer_state
    )


def fleet_summary(engine: Engine, stats: dict[str, float]) -> dict[str, Any] | None:
    """What a run's summary records about a :class:`RayEngine` (None for any other engine):
    the replicas' version changes over time (``timeline``: ``[seconds, replica, version]``,
    restarts included), the fleet's fault counters and the per-replica counters. ``stats``
    is ``engine.stats()``, taken before the engine was closed."""
    from provrl.distributed.engine import RayEngine

    if not isinstance(engine, RayEngine):
        return None
    n = len(engine.clients)
    return {
        "replicas": n,
        "threads": engine.cfg.threads,
        "schedule": engine.cfg.schedule,
        "timeline": [[round(t, 3), r, v] for t, r, v in engine.timeline()],
        "faults": {k: int(stats.get(k, 0.0)) for k in FLEET_FAULTS}
        | {"recover_s_max": float(stats.get("recover_s_max", 0.0))},
        "per_replica": [
            {k: float(stats.get(f"r{i}/{k}", 0.0)) for k in PER_REPLICA} for i in range(n)
        ],
        "published_versions": int(stats.get("published_versions", 0.0)),
        "published_mb": float(stats.get("published_mb", 0.0)),
        "last_schedule_ms": engine.last_schedule_ms,
    }
