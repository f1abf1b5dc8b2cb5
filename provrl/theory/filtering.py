"""Filtering analytics: which tasks does probe-k filtering keep? (pure functions)

A task with pass rate p is probed k times; the number of successes is K | p ~ Binomial(k, p).
The filter keeps tasks with 0 < K < k (some but not all probes succeed), so

    Pr(keep | p) = Pr(0 < K < k | p) = 1 − p^k − (1 − p)^k,

maximal at p = ½ (1 − 2^{1−k}). Under a Beta(a, b) prior on p, with B the Beta function,

    E[p^k] = B(a + k, b)/B(a, b),   E[(1 − p)^k] = B(a, b + k)/B(a, b),
    Pr(keep) = 1 − B(a + k, b)/B(a, b) − B(a, b + k)/B(a, b).

The task filter (``provrl/filtering.py``) imports these; everything here is NumPy/SciPy,
vectorised over p, k, a, b by broadcasting.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc, betaln, gammaln


def _check_k(k: np.ndarray | int) -> np.ndarray:
    k_arr = np.asarray(k)
    if np.any(k_arr < 1) or np.any(k_arr != np.floor(k_arr)):
        raise ValueError(f"k (probes per task) must be a positive integer, got {k}")
    return k_arr


def _check_p(p: np.ndarray | float) -> np.ndarray:
    p_arr = np.asarray(p, dtype=np.float64)
    if np.any((p_arr < 0) | (p_arr > 1)) or np.any(np.isnan(p_arr)):
        raise ValueError("p (pass rate) must lie in [0, 1]")
    return p_arr


def _check_ab(a: np.ndarray | float, b: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if np.any(a_arr <= 0) or np.any(b_arr <= 0):
        raise ValueError(f"Beta prior parameters must be > 0, got a={a}, b={b}")
    return a_arr, b_arr


def keep_probability(p: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """Pr(0 < K < k | p) = 1 − p^k − (1 − p)^k (0 for k = 1: one probe is never mixed)."""
    p_arr, k_arr = _check_p(p), _check_k(k)
    return 1.0 - p_arr**k_arr - (1.0 - p_arr) ** k_arr


def all_fail_probability(p: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """Pr(K = 0 | p) = (1 − p)^k — the task goes to the re-probe pool, not the bin."""
    return (1.0 - _check_p(p)) ** _check_k(k)


def expected_keep_probability(
    a: np.ndarray | float, b: np.ndarray | float, k: np.ndarray | int
) -> np.ndarray:
    """E_{p∼Beta(a,b)} Pr(0 < K < k | p) = 1 − B(a+k, b)/B(a, b) − B(a, b+k)/B(a, b)
    (Beta functions in log space, so large k and small a, b stay accurate)."""
    a_arr, b_arr = _check_ab(a, b)
    k_arr = _check_k(k)
    log_b = betaln(a_arr, b_arr)
    all_pass = np.exp(betaln(a_arr + k_arr, b_arr) - log_b)
    all_fail = np.exp(betaln(a_arr, b_arr + k_arr) - log_b)
    return 1.0 - all_pass - all_fail


def expected_all_fail_probability(
    a: np.ndarray | float, b: np.ndarray | float, k: np.ndarray | int
) -> np.ndarray:
    """E_{p∼Beta(a,b)} (1 − p)^k = B(a, b + k)/B(a, b)."""
    a_arr, b_arr = _check_ab(a, b)
    return np.exp(betaln(a_arr, b_arr + _check_k(k)) - betaln(a_arr, b_arr))


def beta_binomial_pmf(
    j: np.ndarray | int, k: np.ndarray | int, a: np.ndarray | float, b: np.ndarray | float
) -> np.ndarray:
    """Pr(K = j) under p ∼ Beta(a, b): C(k, j)·B(j + a, k − j + b)/B(a, b)."""
    a_arr, b_arr = _check_ab(a, b)
    k_arr = _check_k(k)
    j_arr = np.asarray(j)
    if np.any(j_arr < 0) or np.any(j_arr > k_arr):
        raise ValueError(f"j must lie in 0 … k, got j={j}, k={k}")
    log_choose = gammaln(k_arr + 1) - gammaln(j_arr + 1) - gammaln(k_arr - j_arr + 1)
    return np.exp(log_choose + betaln(j_arr + a_arr, k_arr - j_arr + b_arr) - betaln(a_arr, b_arr))


def posterior_after_probe(a: float, b: float, successes: int, k: int) -> tuple[float, float]:
    """Conjugate update: p | K = successes ∼ Beta(a + K, b + k − K)."""
    _check_ab(a, b)
    _check_k(k)
    if not 0 <= successes <= k:
        raise ValueError(f"successes must lie in 0 … k = {k}, got {successes}")
    return a + successes, b + k - successes


def prob_above_given_all_fail(
    a: np.ndarray | float, b: np.ndarray | float, k: np.ndarray | int, p_min: float
) -> np.ndarray:
    """Pr(p > p_min | K = 0) = 1 − I_{p_min}(a, b + k): how likely a task that failed all k
    probes still has pass rate above ``p_min`` ("k failures do not prove unlearnability")."""
    a_arr, b_arr = _check_ab(a, b)
    return 1.0 - betainc(a_arr, b_arr + _check_k(k), float(_check_p(p_min)))


def monte_carlo_keep(
    rng: np.random.Generator,
    k: int,
    samples: int,
    *,
    p: float | None = None,
    a: float = 1.0,
    b: float = 1.0,
) -> float:
    """Monte-Carlo estimate of Pr(0 < K < k): p fixed, or p ∼ Beta(a, b) when ``p`` is None."""
    ps = np.full(samples, p) if p is not None else rng.beta(a, b, samples)
    K = rng.binomial(k, ps)
    return float(np.mean((K > 0) & (k > K)))


def filtering_report(
    ks: list[int], a: float, b: float, mc_samples: int, seed: int
) -> dict[str, object]:
    """Closed forms for each k, checked against Monte-Carlo (fixed seed)."""
    rng = np.random.default_rng(seed)
    grid = [0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9]
    out: dict[str, object] = {"prior": {"a": a, "b": b, "mean": a / (a + b)}, "k": {}}
    rows: dict[str, object] = {}
    for k in ks:
        closed = float(expected_keep_probability(a, b, k))
        mc = monte_carlo_keep(rng, k, mc_samples, a=a, b=b)
        rows[str(k)] = {
            "max_keep_probability_at_p_half": float(keep_probability(0.5, k)),
            "keep_probability_at": {f"{p:g}": float(keep_probability(p, k)) for p in grid},
            "expected_keep_probability_beta": closed,
            "monte_carlo": mc,
            "monte_carlo_se": float(np.sqrt(closed * (1 - closed) / mc_samples)),
            "expected_all_fail_beta": float(expected_all_fail_probability(a, b, k)),
            "prob_p_above_0.05_given_all_fail": float(prob_above_given_all_fail(a, b, k, 0.05)),
        }
    out["k"] = rows
    return out
