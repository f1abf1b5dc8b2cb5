"""The planted faulty engines of the conformance tests.

Faults in the sampler's reported numbers replace ``provrl.engine.local.sample`` (the
function the scheduler thread calls each step) for one test (the ``plant_sampler``
fixture); faults in versions and weights wrap or subclass :class:`LocalEngine`."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from provrl.engine import LocalEngine
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
class OffByOneStamps:
    """A LocalEngine that, once it has hot-loaded, stamps each token one version too old."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner = inner
        self.loads = 0

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def weights_dtype(self) -> torch.dtype:
        return self.inner.weights_dtype

    def _fix(self, fut: Future) -> Future:
        out: Future = Future()

        def done(f: Future) -> None:
            try:
                r = f.result()
            except BaseException as e:
                out.set_exception(e)
                return
            if self.loads:
                r.version = r.version - 1
            out.set_result(r)

        fut.add_done_callback(done)
        return out

    def submit(self, *a: Any, **k: Any) -> Future:
        return self._fix(self.inner.submit(*a, **k))

    def submit_continue(self, *a: Any, **k: Any) -> Future:
        return self._fix(self.inner.submit_continue(*a, **k))

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


SKIPPED = "model.layers.1.mlp.down_proj.weight"


class SkipsATensor(LocalEngine):
    """A LocalEngine whose hot-load keeps its old value of one tensor (:data:`SKIPPED`)."""

    def load_weights(self, weights: Any, version: int, mode: Any = "keep") -> Any:
        sd = dict(weights)
        sd[SKIPPED] = self.weights.targets()[SKIPPED].clone()
        return super().load_weights(sd, version, mode)
