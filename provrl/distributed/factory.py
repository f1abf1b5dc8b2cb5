"""The engine factory of ``engine.backend: ray`` (:class:`RayEngines`), and what a run's
summary records about the fleet it built (:func:`fleet_summary`)."""

from __future__ import annotations

from typing import Any

from provrl.distributed.config import RayConfig
from provrl.distributed.engine import RayEngine
from provrl.engine.api import Engine
from provrl.engine.config import EngineConfig
from provrl.extras import require
from provrl.models.loading import LoadedModel

FLEET_FAULTS = ("deaths", "restarts", "turns_resubmitted", "turns_failed", "requests_reprefilled")
"""Fault counters the RL stage summary keeps (fleet totals and per replica)."""

PER_REPLICA = ("tokens_generated", "busy_s", "hotloads", "incarnation", *FLEET_FAULTS)
"""Per-replica counters the RL stage summary keeps."""


class RayEngines:
    """``ray.replicas`` engine replicas as Ray actors behind the router
    (:class:`~provrl.distributed.engine.RayEngine`), whose ``load_weights`` publishes each
    version once and applies ``ray.schedule``: the :class:`~provrl.engine.api.EngineFactory`
    of ``engine.backend: ray``. Each replica runs the engine ``cfg`` describes — its
    ``backend`` if that names one (``local``, ``vllm``), else ``ray.engine``."""

    def __init__(self, ray: RayConfig) -> None:
        self.ray = ray

    def __call__(
        self, lm: LoadedModel, cfg: EngineConfig | None = None, *, version: int = 0
    ) -> Engine:
        require("ray", "ray", "engine.backend: ray")  # one line naming the extra, first
        cfg = cfg or EngineConfig()
        kind = self.ray.engine if cfg.backend == "ray" else cfg.backend
        return RayEngine(lm, cfg.model_copy(update={"backend": kind}), self.ray, version=version)


def fleet_summary(engine: Engine, stats: dict[str, float]) -> dict[str, Any] | None:
    """What a run's summary records about a :class:`RayEngine` (None for any other engine):
    the replicas' version changes over time (``timeline``: ``[seconds, replica, version]``,
    restarts included), the fleet's fault counters and the per-replica counters. ``stats``
    is ``engine.stats()``, taken before the engine was closed."""
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
