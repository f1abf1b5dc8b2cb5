"""Conformance fixtures: a small config for the tiny model, engines on it, a planted sampler
(the faults themselves are in planted_faults.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from provrl.conformance.config import ConformanceConfig
from provrl.engine import EngineConfig, LocalEngine


@pytest.fixture(autouse=True, scope="package")
def _one_thread() -> Iterator[None]:
    """One intra-op thread (the shared 2-core machine, as in tests/engine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_cfg_conf() -> ConformanceConfig:
    """One prompt, two truncated laws that are testable on the tiny model (its logits are
    nearly flat, so untruncated laws spread over the whole vocabulary), few draws."""
    return ConformanceConfig(
        prompts=["What is the capital of France?"],
        settings=[(1.0, 20, 1.0), (0.5, 16, 0.8)],
        pilot=100,
        samples=400,
        turn_tokens=4,
        effect=0.35,
    )


@pytest.fixture
def engine_on(tiny):
    """``engine_on(cls=LocalEngine, **cfg)`` → an engine on the tiny model, closed after."""
    engines: list[Any] = []

    def make(cls: Any = LocalEngine, **cfg: Any) -> Any:
        cfg = {"max_seqs": 64, "max_context": 128, "eos_stops": False, **cfg}
        e = cls(tiny, EngineConfig(**cfg))
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


@pytest.fixture
def plant_sampler(monkeypatch):
    """``plant_sampler(fn)``: every LocalEngine step samples with ``fn`` for this test."""

    def plant(fn: Any) -> None:
        monkeypatch.setattr("provrl.engine.local.sample", fn)

    return plant
