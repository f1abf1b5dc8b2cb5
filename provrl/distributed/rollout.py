"""The one switch the orchestration calls: the rollout engine the run config asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from provrl.engine.api import Engine
from provrl.engine.config import EngineConfig

if TYPE_CHECKING:
    from provrl.run_config import RunConfig


def make_rollout_engine(
    lm: Any, cfg: RunConfig, engine_cfg: EngineConfig | None = None, *, version: int = 0
) -> Engine:
    """``backend: local`` → one in-process :class:`~provrl.engine.LocalEngine`;
    ``backend: ray`` → ``ray.replicas`` Ray actors behind the router
    (:class:`~provrl.distributed.engine.RayEngine`), whose ``load_weights`` publishes each
    version once and applies ``ray.schedule``. ``engine_cfg`` defaults to ``cfg.engine``;
    ``lm`` holds the weights of ``version``."""
    engine_cfg = engine_cfg or cfg.engine
    if cfg.backend == "ray":
        from provrl.distributed.engine import RayEngine

        return RayEngine(lm, engine_cfg, cfg.ray, version=version)
    from provrl.engine.local import LocalEngine

    return LocalEngine(lm, engine_cfg, version=version)
