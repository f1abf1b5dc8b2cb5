"""The KV-staleness audit: how far a keep-mode hot-load moved the recorded logprobs.

After a ``keep`` hot-load, a token sampled under version v attended to KV computed under
older versions (``kv_min < v``), so its recorded log q is the *cached* execution's, which
need not equal a recomputation under v (docs/provenance.md). For a fraction
``EngineConfig.audit_fraction`` of the finished turns that hold such tokens, the engine
recomputes them from scratch — a fresh KV under the same weights v, the same sampling
parameters — and accumulates ``|log q_fresh − log q_recorded|`` into its counters::

    kv_staleness_samples / _sum_abs / _max_abs     (stats(): kv_staleness_mean_abs)
    kv_staleness_support_misses                    recorded token outside the fresh support

An audit is dropped if the weights move on before it runs (v can no longer be recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from provrl.engine.config import EngineConfig
from provrl.engine.scheduler import EngineCounters, Request, StepBuilder
from provrl.provenance import SamplingParams


@dataclass
class Audit:
    """Recompute a finished turn's stale-KV tokens from scratch under the same version."""

    ids: list[int]
    positions: list[int]  # indices into ids of the audited sampled tokens
    recorded: list[float]
    params: SamplingParams
    version: int


def stale_tokens(req: Request, version: int) -> list[int]:
    """Indices into the turn of the tokens sampled under ``version`` that attended to KV of
    an older version."""
    t = req.turn
    return [
        i for i, (v, lo) in enumerate(zip(t.version, t.kv_min, strict=True)) if lo < v == version
    ]


def choose(req: Request, version: int, cfg: EngineConfig, rng: np.random.Generator) -> Audit | None:
    """The audit of ``req``'s finished turn, for a fraction ``cfg.audit_fraction`` of the
    turns that have stale-KV tokens (at most ``cfg.audit_max_tokens`` of them); else None."""
    if cfg.audit_fraction <= 0:
        return None
    stale = stale_tokens(req, version)
    if not stale or rng.random() >= cfg.audit_fraction:
        return None
    stale = stale[: cfg.audit_max_tokens]
    t = req.turn
    end = req.turn_start + len(t.tokens)
    return Audit(
        ids=req.ids[:end],
        positions=[req.turn_start + i for i in stale],
        recorded=[t.logprob[i] for i in stale],
        params=req.params,
        version=version,
    )


def audit_step(a: Audit, slot: int) -> StepBuilder:
    """One prefill of ``ids[:max(positions)]`` into the scratch ``slot`` from position 0;
    logit row t−1 predicts ``ids[t]`` for every audited position t."""
    n = max(a.positions)
    step = StepBuilder()
    step.chunk(slot, a.ids, 0, n)
    step.logit_rows = [t - 1 for t in a.positions]
    return step


def sampling_inputs(a: Audit) -> tuple[torch.Tensor, ...]:
    """(tokens, temperature, top_k, top_p) of the audited tokens, as the sampler got them
    (top_p in float64, as in the plan)."""
    k = len(a.positions)
    return (
        torch.tensor([a.ids[t] for t in a.positions]),
        torch.full((k,), a.params.temperature),
        torch.full((k,), a.params.top_k, dtype=torch.int64),
        torch.full((k,), a.params.top_p, dtype=torch.float64),
    )


def record(c: EngineCounters, fresh: torch.Tensor, recorded: list[float]) -> None:
    """Accumulate ``|fresh − recorded|`` into the staleness counters (a non-finite fresh
    logprob is a support miss)."""
    diff = (fresh.double() - torch.tensor(recorded, dtype=torch.float64)).abs()
    finite = diff[torch.isfinite(diff)]
    c.kv_staleness_support_misses += int((~torch.isfinite(diff)).sum())
    c.kv_staleness_samples += int(finite.numel())
    c.kv_staleness_sum_abs += float(finite.sum())
    if finite.numel():
        c.kv_staleness_max_abs = max(c.kv_staleness_max_abs, float(finite.max()))
