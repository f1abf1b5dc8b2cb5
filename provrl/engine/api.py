"""The rollout-engine interface that the agent loop and the orchestrator program against.

Token ids in, token ids out: no text round trips. A *request* is one conversation: it is
created by :meth:`Engine.submit` with a prompt, generates one turn, then waits (its KV cache
kept) until :meth:`Engine.submit_continue` appends more context (the tool output, as
non-action tokens) and generates the next turn on the same cache, or until
:meth:`Engine.release` frees it. Every sampled token comes back with its provenance stamps
(docs/provenance.md): version, exact behaviour logprob, kept mass, KV versions, replica.

Backends: ``provrl.engine.local`` (PyTorch, CPU/GPU), ``provrl.engine.vllm_backend`` and the
replica router, which is itself an :class:`Engine`; an :class:`EngineFactory` builds one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

from provrl.engine.config import EngineConfig
from provrl.provenance import SamplingParams

if TYPE_CHECKING:  # models.loading imports torch; the engine API stays light
    from provrl.models.loading import LoadedModel

HotLoadMode = Literal["keep", "recompute", "drain"]
"""``keep``: swap weights between decode steps, keep in-flight requests and their KV.
``recompute``: same, then re-prefill every in-flight request's KV under the new weights.
``drain``: strict on-policy — stop admitting, finish in-flight turns, reset caches, swap."""

FinishReason = Literal["eos", "stop", "length", "context", "cancelled", "error"]


class EngineError(ValueError):
    """A request was rejected (empty prompt, id out of vocabulary, max tokens ≤ 0, context
    overflow, unknown request id). Other requests are never disturbed."""


@dataclass
class TurnOutput:
    """What one generation call (one agent turn) sampled, with per-token provenance.

    All arrays have one entry per sampled token (every one of them an action)."""

    request_id: str
    token_ids: list[int]
    logprob: np.ndarray  # float32, log q_{v_t}(a_t|h_t) after temperature/top-k/top-p
    kept_mass: np.ndarray  # float32, mass kept by truncation before renormalising
    version: np.ndarray  # int32, weight version that computed each token's distribution
    kv_min: np.ndarray  # int32, oldest weight version in the KV each token attended to
    kv_max: np.ndarray  # int32, newest weight version in that KV
    replica: int
    finish_reason: FinishReason
    stop_match: str | int | None = None
    """The stop string or stop token id that ended the turn, if any."""
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``queue``, ``prefill``, ``decode`` for this call."""


@dataclass
class HotLoadReport:
    """What a weight swap did."""

    mode: HotLoadMode
    old_version: int
    new_version: int
    update_ms: float
    """Time requests were paused for the swap itself (keep/recompute) or the whole drain."""
    in_flight: int
    """Requests alive across the swap (must all survive: none are dropped)."""
    recomputed_tokens: int = 0

    @classmethod
    def combine(
        cls, reports: Sequence[HotLoadReport], mode: HotLoadMode, version: int
    ) -> HotLoadReport:
        """One report for a fleet's swap to ``version``: the oldest version left, the longest
        pause, the summed in-flight and recomputed counts."""
        return cls(
            mode=mode,
            old_version=min(r.old_version for r in reports),
            new_version=version,
            update_ms=max(r.update_ms for r in reports),
            in_flight=sum(r.in_flight for r in reports),
            recomputed_tokens=sum(r.recomputed_tokens for r in reports),
        )


@runtime_checkable
class Engine(Protocol):
    """What every rollout backend provides. Thread-safe: many agent loops call it at once."""

    @property
    def version(self) -> int:
        """Current weight version (the one new tokens are sampled under)."""
        ...

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Future[TurnOutput]:
        """Start a request: prefill ``prompt_ids`` and sample one turn."""
        ...

    def submit_continue(
        self, request_id: str, extra_ids: Sequence[int], params: SamplingParams
    ) -> Future[TurnOutput]:
        """Append ``extra_ids`` (non-action context) to a waiting request and sample the
        next turn on the same KV cache (no re-prefill of the prefix)."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a running turn (its future resolves with finish_reason='cancelled')."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a request and free its KV cache."""
        ...

    def load_weights(
        self,
        weights: Mapping[str, Any] | str | os.PathLike[str],
        version: int,
        mode: HotLoadMode = "keep",
    ) -> HotLoadReport:
        """Swap in new weights (a state dict or a safetensors file/dir) as ``version``."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters and gauges: running / waiting requests, tokens generated, tokens/s, …"""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ThreadedEngine(Protocol):
    """An engine whose forwards run on this process's cores (the local engine, a router of
    local replicas), so a caller can change how many of them it uses while it runs."""

    def set_threads(self, n: int) -> None:
        """torch intra-op threads for every forward from the next engine step on (n ≥ 1)."""
        ...


class EngineFactory(Protocol):
    """Builds the rollout engine that serves ``lm`` (whose weights are ``version``) with the
    settings of ``cfg`` (one replica's :class:`~provrl.engine.config.EngineConfig`).

    A run builds its factory once, from the run config, and every stage that rolls out (the
    probe, eval, sync and async RL) calls it; ``engine.backend`` is the one switch:
    ``local`` / ``vllm`` → :func:`provrl.engine.make_engine` (in this process), ``ray`` →
    :class:`provrl.distributed.RayEngines` (replicas as Ray actors)."""

    def __call__(
        self, lm: LoadedModel, cfg: EngineConfig | None = None, *, version: int = 0
    ) -> Engine: ...


def generate(engine: Engine, prompt_ids: Sequence[int], params: SamplingParams) -> TurnOutput:
    """Blocking single-turn convenience: submit, wait, release."""
    out = engine.submit(prompt_ids, params).result()
    engine.release(out.request_id)
    return out
