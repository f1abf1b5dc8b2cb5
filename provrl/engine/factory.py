"""The in-process engine factory: ``make_engine(lm, cfg, version=...)``.

``cfg.backend`` picks the implementation of :class:`~provrl.engine.api.Engine`:
``local`` → :class:`~provrl.engine.local.LocalEngine` (the default, exact everywhere),
``vllm`` → :class:`~provrl.engine.vllm_backend.VLLMEngine` (needs vLLM installed;
docs/engine.md §10 says which provenance fields it records exactly). Both are imported
only when built, so importing this module costs nothing. ``ray`` is not built here: Ray
replicas are :class:`provrl.distributed.RayEngines`, the factory a run with
``engine.backend: ray`` builds once (``provrl.pipeline.engines.engine_factory``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from provrl.engine.api import Engine, EngineError
from provrl.engine.config import EngineConfig

if TYPE_CHECKING:  # models.loading imports torch
    from provrl.models.loading import LoadedModel


def make_engine(
    lm: LoadedModel, cfg: EngineConfig | None = None, *, version: int = 0, replica: int = 0
) -> Engine:
    """The engine ``cfg.backend`` names, serving ``lm`` whose current weights are
    ``version`` (an :class:`~provrl.engine.api.EngineFactory`)."""
    cfg = cfg or EngineConfig()
    if cfg.backend == "ray":
        raise EngineError(
            "engine.backend=ray: Ray replicas are built by the run's engine factory "
            "(provrl.distributed.RayEngines), not in this process"
        )
    if cfg.backend == "vllm":
        from provrl.engine.vllm_backend import VLLMEngine

        return VLLMEngine(lm, cfg, replica=replica, version=version)
    from provrl.engine.local import LocalEngine

    return LocalEngine(lm, cfg, replica=replica, version=version)
