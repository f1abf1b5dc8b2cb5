"""Request validation every backend applies before anything is queued (docs/engine.md §1):
one :class:`~provrl.engine.api.EngineError` line naming the request and the field."""

from __future__ import annotations

from collections.abc import Sequence

from provrl.engine.api import EngineError
from provrl.provenance import SamplingParams


def check_ids(rid: str, ids: Sequence[int], what: str, vocab_size: int) -> None:
    """Every id in ``[0, vocab_size)``."""
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise EngineError(
                f"request {rid!r}: {what}[{i}] = {t} is outside the vocabulary [0, {vocab_size})"
            )


def check_params(rid: str, p: SamplingParams, vocab_size: int) -> None:
    """``max_new_tokens ≥ 1``, ``temperature ≥ 0``, ``top_p ∈ (0, 1]``, ``top_k ≥ 0``, stop
    ids in the vocabulary."""
    if p.max_new_tokens <= 0:
        raise EngineError(f"request {rid!r}: max_new_tokens={p.max_new_tokens} must be ≥ 1")
    if not p.temperature >= 0:
        raise EngineError(f"request {rid!r}: temperature={p.temperature} must be ≥ 0")
    if not 0 < p.top_p <= 1:
        raise EngineError(f"request {rid!r}: top_p={p.top_p} must be in (0, 1]")
    if p.top_k < 0:
        raise EngineError(f"request {rid!r}: top_k={p.top_k} must be ≥ 0")
    check_ids(rid, list(p.stop_token_ids), "stop_token_ids", vocab_size)


def check_prompt(rid: str, ids: Sequence[int], max_context: int, vocab_size: int) -> None:
    """A non-empty prompt of ids in the vocabulary that leaves room to generate."""
    if not ids:
        raise EngineError(f"request {rid!r}: empty prompt")
    check_ids(rid, ids, "prompt_ids", vocab_size)
    if len(ids) >= max_context:
        raise EngineError(
            f"request {rid!r}: prompt has {len(ids)} tokens; max_context is "
            f"{max_context} (no room to generate)"
        )


def check_continuation(rid: str, context: int, extra: int, max_context: int) -> None:
    """A continuation of ``extra`` tokens after ``context`` that leaves room to generate."""
    if context + extra >= max_context:
        raise EngineError(
            f"request {rid!r}: context would be {context + extra} tokens; max_context is "
            f"{max_context} (no room to generate)"
        )
