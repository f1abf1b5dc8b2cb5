"""The planted faulty engines of the conformance tests.

Faults in the sampler's reported numbers replace ``provrl.engine.local.sample`` (the
function the scheduler thread calls each step) for one test (the ``plant_sampler``
fixture); faults in versions and weights wrap or subclass :class:`LocalEngine`; a recompute
that recomputes nothing replaces ``provrl.engine.hotload.recompute_steps``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from provrl.engine import LocalEngine, TurnOutput
from provrl.engine import sampling as S


# ----------------------------------------------------------------------------- sampler faults
def raw_logprobs(logits, temperature, top_k, top_p, u) -> S.Sampled:
    """Samples correctly, reports log softmax(ℓ)(a): before temperature and truncation."""
    s = S.sample(logits, temperature, top_k, top_p, u)
    raw = torch.log_softmax(logits.float(), -1).gather(-1, s.token[:, None]).squeeze(-1)
    return S.Sampled(s.token, raw, s.kept_mass)


def unrenormalised(logits, temperature, top_k, top_p, u) -> S.Sampled:
    """Samples from the truncated law, reports log π_τ(a): top-k/top-p ignored in q."""
    s = S.sample(logits, temperature, top_k, top_p, u)
    return S.Sampled(s.token, s.logprob + torch.log(s.kept_mass), s.kept_mass)


def untempered_kept_mass(logits, temperature, top_k, top_p, u) -> S.Sampled:
    """Samples correctly, but measures the kept mass m' = Σ_S softmax(ℓ) before the
    temperature, and reports log π_τ(a) − log m'."""
    s = S.sample(logits, temperature, top_k, top_p, u)
    V = logits.shape[1]
    _, truncated, _ = S.row_kinds(temperature, top_k, top_p, V)
    kept = s.kept_mass.clone()
    lp = s.logprob.clone()
    for r in torch.nonzero(truncated).flatten().tolist():
        z = logits[r : r + 1].float() / float(temperature[r])
        ks = S.kept_set(z, top_k[r : r + 1], top_p[r : r + 1])
        p1 = torch.softmax(logits[r].double(), -1)[ks.idx[0]]
        m1 = float((p1 * ks.keep[0]).sum())
        lp[r] = s.logprob[r] + torch.log(s.kept_mass[r]) - torch.log(torch.tensor(m1))
        kept[r] = m1
    return S.Sampled(s.token, lp, kept)


# ----------------------------------------------------------------------------- version faults
def mapped(fut: Future, fn: Callable[[Any], Any]) -> Future:
    """A future that resolves with ``fn(result)`` of ``fut`` (or its exception)."""
    out: Future = Future()

    def done(f: Future) -> None:
        try:
            r = fn(f.result())
        except BaseException as e:
            out.set_exception(e)
            return
        out.set_result(r)

    fut.add_done_callback(done)
    return out


class Wrapped:
    """A LocalEngine seen through the bare ``Engine`` interface plus ``on_token`` and the
    fingerprint: no ``load_weights_async``, so the stamps check's mid-turn swap is sent from
    a helper thread and lands where it lands (the split is read from the stamps). Honest
    itself; subclasses plant faults in :meth:`restamp`."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner = inner
        self.loads = 0

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def weights_dtype(self) -> torch.dtype:
        return self.inner.weights_dtype

    def restamp(self, out: TurnOutput) -> TurnOutput:
        return out

    def submit(self, *a: Any, **k: Any) -> Future:
        return mapped(self.inner.submit(*a, **k), self.restamp)

    def submit_continue(self, *a: Any, **k: Any) -> Future:
        return mapped(self.inner.submit_continue(*a, **k), self.restamp)

    def load_weights(self, *a: Any, **k: Any) -> Any:
        self.loads += 1
        return self.inner.load_weights(*a, **k)

    def weights_fingerprint(self) -> dict[str, str]:
        return self.inner.weights_fingerprint()

    def cancel(self, rid: str) -> None:
        self.inner.cancel(rid)

    def release(self, rid: str) -> None:
        self.inner.release(rid)

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class OffByOneStamps(Wrapped):
    """A LocalEngine that, once it has hot-loaded, stamps each token one version too old."""

    def restamp(self, out: TurnOutput) -> TurnOutput:
        if self.loads:
            out.version = out.version - 1
        return out


class StaleKVStampedFresh(Wrapped):
    """A LocalEngine that, once it has hot-loaded, stamps every token's kv_min with its own
    version: a keep hot-load's turn 2 then claims a KV filled under the new version (as an
    engine that re-prefills each turn may) while it reads the old version's."""

    def restamp(self, out: TurnOutput) -> TurnOutput:
        if self.loads:
            out.kv_min = out.version.copy()
        return out


class TurnStartStamps(LocalEngine):
    """A LocalEngine that stamps every token of a turn with the version and KV span of the
    turn's first token: right whenever a turn runs under one version, wrong for the tokens
    after a swap in the middle of the turn."""

    @staticmethod
    def restamp(out: TurnOutput) -> TurnOutput:
        if out.token_ids:
            out.version = np.full_like(out.version, out.version[0])
            out.kv_max = out.version.copy()
            out.kv_min = np.full_like(out.kv_min, out.kv_min[0])
        return out

    def submit(self, *a: Any, **k: Any) -> Future:
        return mapped(super().submit(*a, **k), self.restamp)

    def submit_continue(self, *a: Any, **k: Any) -> Future:
        return mapped(super().submit_continue(*a, **k), self.restamp)


class KeepWaitsForTheTurn(LocalEngine):
    """A LocalEngine whose ``keep`` hot-load waits for the in-flight turns to finish and
    resets the caches (a drain), while reporting ``keep``: no turn ever spans two versions."""

    def load_weights_async(self, weights: Any, version: int, mode: Any = "keep") -> Future:
        fut = super().load_weights_async(weights, version, "drain" if mode == "keep" else mode)
        return mapped(fut, lambda r: dataclasses.replace(r, mode=mode))


def no_recompute(sched: Any) -> Iterator[Any]:
    """``provrl.engine.hotload.recompute_steps`` that re-prefills nothing: a ``recompute``
    hot-load still stamps kv_min = the new version and counts the tokens, but every KV it
    claims to have recomputed is the old version's."""
    return iter(())


SKIPPED = "model.layers.1.mlp.down_proj.weight"


class SkipsATensor(LocalEngine):
    """A LocalEngine whose hot-load keeps its old value of one tensor (:data:`SKIPPED`)."""

    def load_weights(self, weights: Any, version: int, mode: Any = "keep") -> Any:
        sd = dict(weights)
        sd[SKIPPED] = self.weights.targets()[SKIPPED].clone()
        return super().load_weights(sd, version, mode)
