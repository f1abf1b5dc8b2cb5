"""Beyond one process: engine replicas as Ray actors (``backend: ray``, docs/distributed.md).

``make_rollout_engine(lm, cfg, engine_cfg, version=v)`` is the one call the orchestration
makes; it returns an in-process engine for ``backend: local`` and a
:class:`~provrl.distributed.engine.RayEngine` for ``backend: ray``. ``make_learner`` is the
same switch for the trainer: in this process, or a Ray actor
(:mod:`provrl.distributed.trainer`). Ray itself is imported
only when a RayEngine is built (``pip install 'provrl[ray]'``).
"""

from __future__ import annotations

from provrl.distributed.config import RayConfig
from provrl.distributed.rollout import fleet_summary, make_learner, make_rollout_engine

__all__ = ["RayConfig", "fleet_summary", "make_learner", "make_rollout_engine"]
