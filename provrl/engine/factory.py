"""Build the configured rollout engine: ``make_engine(lm, cfg, version=...)``.

``cfg.backend`` picks the implementation of :class:`~provrl.engine.api.Engine`:
``local`` → :class:`~provrl.engine.local.LocalEngine` (the default, exact everywhere),
``vllm`` → :class:`~provrl.engine.vllm_backend.VLLMEngine` (needs vLLM installed;
docs/engine.md §10 says which provenance fields it records exactly). Both are imported
only when built, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any

from provrl.engine.api import Engine
from provrl.engine.config import EngineConfig


def make_engine(
    lm: Any, cfg: EngineConfig | None = None, *, version: int = 0, replica: int = 0
) -> Engine:
    """The engine ``cfg.backend`` names, serving ``lm`` (a :class:`LoadedModel`) whose
    current weights are ``version``."""
    cfg = cfg or EngineConfig()
    if cfg.backend == "vllm":
        from provrl.engine.vllm_backend import VLLMEngine

        return VLLMEngine(lm, cfg, replica=replica, version=version)
    from provrl.engine.local import LocalEngine

    return LocalEngine(lm, cfg, replica=replica, version=version)
