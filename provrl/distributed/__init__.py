"""Beyond one process: engine replicas as Ray actors (``engine.backend: ray``,
docs/distributed.md).

:class:`RayEngines` is the :class:`~provrl.engine.api.EngineFactory` of ``engine.backend:
ray``: ``ray.replicas`` :class:`~provrl.distributed.engine.EngineReplica` actors behind the
router (:class:`~provrl.distributed.engine.RayEngine`). The trainer goes with them, as an
actor (:class:`~provrl.distributed.trainer.RayLearner`). A run builds both through
``provrl.pipeline.engines`` from its config. Ray itself is imported only when a RayEngine is
built (``pip install 'provrl[ray]'``). Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "RayConfig": "provrl.distributed.config",
    "RayEngines": "provrl.distributed.factory",
    "fleet_summary": "provrl.distributed.factory",
    "RayEngine": "provrl.distributed.engine",
    "RayLearner": "provrl.distributed.trainer",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
