"""Rollout engine: continuous batching, exact per-token provenance, hot-load.

``from provrl.engine import LocalEngine, Router, EngineConfig`` — see docs/engine.md.
"""

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
]
