"""Simulated network latency for search calls (real web search takes seconds).

Log-normal body with median m and shape σ, optionally with a Pareto tail:

    lognormal:  L = m · exp(σ·Z),  Z ~ N(0, 1)          (median m, heavy right tail)
    pareto:     with probability p_tail:  L = q95 · U^(−1/α),  U ~ U(0, 1]
                otherwise:                L = m · exp(σ·Z)
                where q95 = m · exp(1.645·σ) is the body's 95th percentile
                (P(L > x) ∝ x^(−α) beyond q95: α ≤ 2 has infinite variance)

Every draw is clipped to ``max_s``; then the whole law is dilated by ``time_scale`` = s
(L' = s·L, so F'(x) = F(x/s) and every quantile is s times its unscaled value). The distribution function of the mixture, below
``max_s`` (Φ the standard normal's; p = 0 for lognormal)::

    F(x) = (1 − p)·Φ(ln(x/m)/σ) + p·(1 − (q95/x)^α)·[x ≥ q95],    F(x) = 1 for x ≥ max_s

:func:`cdf` and :func:`quantile` compute it and its inverse exactly; :func:`fit_lognormal_pareto`
solves for (m, σ) whose mixture has a given p50 and p95 (how ``env.search.latency.preset``
was calibrated to published figures, docs/env.md §3).

:class:`WithLatency` wraps any backend: it sleeps the drawn latency before answering, and
if the draw exceeds the call's timeout it sleeps the timeout and raises
:class:`TimeoutError` (what a client with a deadline sees).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
from scipy import optimize, stats

from provrl.env.config import LatencyConfig
from provrl.env.search import Hit, SearchBackend

Z95 = 1.6448536269514722


def draw(cfg: LatencyConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` latencies (seconds) under ``cfg`` from ``rng`` (the module docstring's model)."""
    if cfg.kind == "none":
        return np.zeros(n)
    out = cfg.median_s * np.exp(cfg.sigma * rng.standard_normal(n))
    if cfg.kind == "pareto":
        tail = rng.random(n) < cfg.tail_prob
        q95 = cfg.median_s * math.exp(Z95 * cfg.sigma)
        u = 1.0 - rng.random(n)  # (0, 1]
        out = np.where(tail, q95 * u ** (-1.0 / cfg.tail_alpha), out)
    return np.minimum(out, cfg.max_s) * cfg.time_scale


class LatencyModel:
    """Thread-safe sampler of call latencies (seconds): :func:`draw` from one seeded stream."""

    def __init__(self, cfg: LatencyConfig) -> None:
        self.cfg = cfg
        self._rng = np.random.default_rng(cfg.seed)
        self._lock = threading.Lock()

    def sample(self, n: int | None = None) -> float | np.ndarray:
        with self._lock:
            out = draw(self.cfg, self._rng, 1 if n is None else n)
        return float(out[0]) if n is None else out


def cdf(cfg: LatencyConfig, x: float) -> float:
    """P(L ≤ x) under ``cfg`` (the module docstring's F, clip at ``max_s`` included)."""
    if x < 0:
        return 0.0
    x = x / cfg.time_scale
    if cfg.kind == "none" or x >= cfg.max_s:
        return 1.0
    if x == 0:
        return 0.0
    p = cfg.tail_prob if cfg.kind == "pareto" else 0.0
    body = float(stats.norm.cdf(math.log(x / cfg.median_s) / cfg.sigma))
    q95 = cfg.median_s * math.exp(Z95 * cfg.sigma)
    tail = 1.0 - (q95 / x) ** cfg.tail_alpha if x >= q95 else 0.0
    return (1.0 - p) * body + p * tail


def quantile(cfg: LatencyConfig, q: float) -> float:
    """The q-quantile of L under ``cfg``: the least x with F(x) ≥ q (``max_s`` when the
    clip holds more than 1 − q of the mass)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile: q={q} is not in (0, 1)")
    if cfg.kind == "none":
        return 0.0
    if cfg.time_scale != 1.0:
        return cfg.time_scale * quantile(cfg.model_copy(update={"time_scale": 1.0}), q)
    if cdf(cfg, math.nextafter(cfg.max_s, 0.0)) < q:
        return cfg.max_s
    lo = cfg.median_s * 1e-12
    return float(optimize.brentq(lambda x: cdf(cfg, x) - q, lo, cfg.max_s, xtol=1e-12, rtol=1e-12))


def fit_lognormal_pareto(
    p50: float, p95: float, tail_prob: float, tail_alpha: float, max_s: float = 1e9
) -> tuple[float, float]:
    """(median m, shape σ) of the body whose mixture (``tail_prob`` in a Pareto tail of index
    ``tail_alpha``) has 50th percentile ``p50`` and 95th ``p95`` — solved in log space from
    the pure log-normal's (p50, ln(p95/p50)/1.645)."""
    if not 0 < p50 < p95:
        raise ValueError(f"fit: need 0 < p50 < p95, got p50={p50}, p95={p95}")

    def cfg(v: np.ndarray) -> LatencyConfig:
        return LatencyConfig(kind="pareto", median_s=math.exp(v[0]), sigma=math.exp(v[1]),
                             tail_prob=tail_prob, tail_alpha=tail_alpha, max_s=max_s)  # fmt: skip

    def gap(v: np.ndarray) -> list[float]:
        c = cfg(v)
        return [math.log(quantile(c, 0.5) / p50), math.log(quantile(c, 0.95) / p95)]

    start = np.array([math.log(p50), math.log(math.log(p95 / p50) / Z95)])
    v, _info, ok, msg = optimize.fsolve(gap, start, full_output=True, xtol=1e-12)
    if ok != 1 or max(abs(g) for g in gap(v)) > 1e-6:
        raise ValueError(f"fit: no body gives p50={p50}, p95={p95} with this tail ({msg})")
    c = cfg(v)
    return c.median_s, c.sigma


class WithLatency:
    """A backend whose calls take a simulated latency (and may time out)."""

    def __init__(
        self, inner: SearchBackend, model: LatencyModel, timeout_s: float | None = None
    ) -> None:
        self.inner = inner
        self.model = model
        self.timeout_s = timeout_s
        self.name = f"{inner.name}+latency"

    def _wait(self) -> None:
        lat = float(self.model.sample())  # type: ignore[arg-type]
        if self.timeout_s is not None and lat > self.timeout_s:
            time.sleep(self.timeout_s)
            raise TimeoutError(f"search took longer than {self.timeout_s:g} s")
        time.sleep(lat)

    def search(self, query: str, k: int) -> list[Hit]:
        self._wait()
        return self.inner.search(query, k)

    def open(self, doc_id: str) -> str | None:
        self._wait()
        return self.inner.open(doc_id)

    def fingerprint(self) -> str:
        c = self.model.cfg
        return f"{self.inner.fingerprint()}|latency:{c.kind}:{c.median_s:g}:{c.sigma:g}:{c.tail_prob:g}:{c.tail_alpha:g}"
