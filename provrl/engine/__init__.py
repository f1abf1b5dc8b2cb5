"""Rollout engine: continuous batching, exact per-token provenance, hot-load.

``from provrl.engine import LocalEngine, Router, EngineConfig`` — see docs/engine.md.
``make_engine(lm, cfg, version=v)`` builds the backend ``cfg.backend`` names (``local`` or
``vllm``).

``LocalEngine`` and ``Router`` (which import torch) are loaded on first access, so that
importing ``provrl.engine`` — and with it ``provrl --help`` — stays instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from provrl.engine.api import (
    Engine,
    EngineError,
    FinishReason,
    HotLoadMode,
    HotLoadReport,
    TurnOutput,
    generate,
)
from provrl.engine.config import EngineConfig
from provrl.engine.factory import make_engine

if TYPE_CHECKING:
    from provrl.engine.local import LocalEngine
    from provrl.engine.router import Router

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "FinishReason",
    "HotLoadMode",
    "HotLoadReport",
    "LocalEngine",
    "Router",
    "TurnOutput",
    "generate",
    "make_engine",
]


def __getattr__(name: str) -> Any:
    if name == "LocalEngine":
        from provrl.engine.local import LocalEngine

        return LocalEngine
    if name == "Router":
        from provrl.engine.router import Router

        return Router
    raise AttributeError(f"module 'provrl.engine' has no attribute {name!r}")
