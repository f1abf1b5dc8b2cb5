"""Rollout engine: continuous batching, exact per-token provenance, hot-load.

``from provrl.engine import LocalEngine, Router, EngineConfig`` — see docs/engine.md.
``make_engine(lm, cfg, version=v)`` builds the backend ``cfg.backend`` names (``local`` or
``vllm``); an :class:`EngineFactory` is what a run builds its engines with.

Names load on first use (``LocalEngine`` and ``Router`` import torch), so that importing
``provrl.engine`` — and with it ``provrl --help`` — stays instant.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "Engine": "provrl.engine.api",
    "EngineError": "provrl.engine.api",
    "EngineFactory": "provrl.engine.api",
    "FinishReason": "provrl.engine.api",
    "HotLoadMode": "provrl.engine.api",
    "HotLoadReport": "provrl.engine.api",
    "ThreadedEngine": "provrl.engine.api",
    "TurnOutput": "provrl.engine.api",
    "generate": "provrl.engine.api",
    "EngineConfig": "provrl.engine.config",
    "make_engine": "provrl.engine.factory",
    "LocalEngine": "provrl.engine.local",
    "Router": "provrl.engine.router",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
