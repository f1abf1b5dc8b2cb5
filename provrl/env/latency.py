"""Simulated network latency for search calls (real web search takes seconds).

Log-normal body with median m and shape σ, optionally with a Pareto tail:

    lognormal:  L = m · exp(σ·Z),  Z ~ N(0, 1)          (median m, heavy right tail)
    pareto:     with probability p_tail:  L = q95 · U^(−1/α),  U ~ U(0, 1]
                otherwise:                L = m · exp(σ·Z)
                where q95 = m · exp(1.645·σ) is the body's 95th percentile
                (P(L > x) ∝ x^(−α) beyond q95: α ≤ 2 has infinite variance)

Every draw is clipped to ``max_s``. :class:`WithLatency` wraps any backend: it sleeps the
drawn latency before answering, and if the draw exceeds the call's timeout it sleeps the
timeout and raises :class:`TimeoutError` (what a client with a deadline sees).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from provrl.env.config import LatencyConfig
from provrl.env.search import Hit, SearchBackend

Z95 = 1.6448536269514722


class LatencyModel:
    """Thread-safe sampler of call latencies (seconds)."""

    def __init__(self, cfg: LatencyConfig) -> None:
        self.cfg = cfg
        self._rng = np.random.default_rng(cfg.seed)
        self._lock = threading.Lock()

    def sample(self, n: int | None = None) -> float | np.ndarray:
        c = self.cfg
        size = 1 if n is None else n
        with self._lock:
            if c.kind == "none":
                out = np.zeros(size)
            else:
                out = c.median_s * np.exp(c.sigma * self._rng.standard_normal(size))
                if c.kind == "pareto":
                    tail = self._rng.random(size) < c.tail_prob
                    q95 = c.median_s * math.exp(Z95 * c.sigma)
                    u = 1.0 - self._rng.random(size)  # (0, 1]
                    out = np.where(tail, q95 * u ** (-1.0 / c.tail_alpha), out)
        out = np.minimum(out, c.max_s)
        return float(out[0]) if n is None else out


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
