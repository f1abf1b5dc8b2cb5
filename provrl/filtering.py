"""Probe-and-filter: which tasks are worth RL *for this policy with these tools* (pure functions).

Every task is probed k times (``provrl probe``, :mod:`provrl.pipeline.probe`); K = successes,
K | p ~ Binomial(k, p) for the task's pass rate p. A GRPO group that is all-success or
all-failure has zero advantage, so the filter keeps the tasks in a band of intermediate K::

    kept      lo ≤ K ≤ hi          (default lo = 1, hi = k − 1: 0 < K < k)
    unsolved  K < lo               (default K = 0 — *not* "unlearnable": re-probed later)
    solved    K > hi               (default K = k)

Every task lands in exactly one pool. The verdict belongs to one policy and one tool
configuration: the probe's *manifest* records both (content hashes), and
:func:`manifest_problems` says why a verdict is stale for another policy or other tools.

Retention analytics (``provrl filter --report``). Fit a Beta(a, b) prior to the per-task K by
maximum likelihood of the beta-binomial, Pr(K = j) = C(k, j)·B(j + a, k − j + b)/B(a, b)
(:func:`provrl.theory.filtering.beta_binomial_pmf`), then predict

    Pr(kept) = Σ_{j=lo}^{hi} Pr(K = j)  (= 1 − B(a+k, b)/B(a, b) − B(a, b+k)/B(a, b) by default)

beside the observed kept fraction; the curve Pr(lo ≤ K ≤ hi | p) for k = 4, 8, 16; and the
tasks kept per probe rollout spent, Pr(kept)/k — the price of a larger k.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from provrl.theory.filtering import (
    beta_binomial_pmf,
    expected_keep_probability,
    keep_probability,
    prob_above_given_all_fail,
)

POOLS = ("kept", "unsolved", "solved")


class FilterError(ValueError):
    """A probe or filter directory that cannot be used (names the file)."""


# ----------------------------------------------------------------------------- pools
def band(k: int, lo: int = 1, hi: int | None = None) -> tuple[int, int]:
    """The kept band [lo, hi] for k probes (hi defaults to k − 1); checked."""
    hi = k - 1 if hi is None else hi
    if not 0 <= lo <= hi <= k:
        raise ValueError(f"filter band {lo} ≤ K ≤ {hi} is not within 0 … k = {k}")
    return lo, hi


def pool_of(K: int, k: int, lo: int = 1, hi: int | None = None) -> str:
    """``kept`` if lo ≤ K ≤ hi, ``unsolved`` if K < lo, ``solved`` if K > hi."""
    lo, hi = band(k, lo, hi)
    if not 0 <= K <= k:
        raise ValueError(f"K = {K} successes is not within 0 … k = {k}")
    return "unsolved" if lo > K else "solved" if hi < K else "kept"


def assign_pools(
    K: Mapping[str, int], k: int, lo: int = 1, hi: int | None = None
) -> dict[str, str]:
    """task id → pool, for every task (each in exactly one)."""
    return {task: pool_of(int(n), k, lo, hi) for task, n in K.items()}


def k_histogram(Ks: Iterable[int], k: int) -> list[int]:
    """Number of tasks with K = 0, 1, …, k."""
    return np.bincount(np.asarray(list(Ks), dtype=np.int64), minlength=k + 1).tolist()


def transitions(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Re-probe transition table: old pool → new pool → number of tasks (tasks in both)."""
    table = {a: dict.fromkeys(POOLS, 0) for a in POOLS}
    for task, a in old.items():
        if task in new:
            table[a][new[task]] += 1
    return table


# ----------------------------------------------------------------------------- retention
def fit_beta_binomial(Ks: Sequence[int] | np.ndarray, k: int) -> tuple[float, float]:
    """Maximum-likelihood Beta(a, b) prior of the pass rates behind observed K ~ BetaBin(k, a, b)
    (optimised over log a, log b; a, b clamped to [1e-3, 1e3], which also bounds the
    degenerate all-zero or all-k cases)."""
    from scipy.optimize import minimize

    K = np.asarray(Ks, dtype=np.int64)
    if K.size == 0:
        raise ValueError("no probed tasks to fit a prior to")
    counts = np.bincount(K, minlength=k + 1)
    j = np.arange(k + 1)

    def nll(x: np.ndarray) -> float:
        a, b = np.exp(np.clip(x, -6.9, 6.9))
        pmf = beta_binomial_pmf(j, k, a, b)
        return float(-(counts * np.log(np.maximum(pmf, 1e-300))).sum())

    m = float(np.clip(K.mean() / k, 0.02, 0.98))
    x0 = np.log([2 * m, 2 * (1 - m)])
    res = minimize(nll, x0, method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9})
    a, b = np.exp(np.clip(res.x, -6.9, 6.9))
    return float(a), float(b)


def band_probability_beta(a: float, b: float, k: int, lo: int = 1, hi: int | None = None) -> float:
    """Pr(lo ≤ K ≤ hi) under p ~ Beta(a, b): Σ_j beta-binomial pmf."""
    lo, hi = band(k, lo, hi)
    return float(beta_binomial_pmf(np.arange(lo, hi + 1), k, a, b).sum())


def band_probability(p: np.ndarray, k: int, lo: int = 1, hi: int | None = None) -> np.ndarray:
    """Pr(lo ≤ K ≤ hi | p) for K ~ Binomial(k, p) (the default band is 1 − p^k − (1 − p)^k)."""
    from scipy.stats import binom

    lo, hi = band(k, lo, hi)
    if (lo, hi) == (1, k - 1):
        return keep_probability(p, k)
    return np.asarray(binom.cdf(hi, k, p) - binom.cdf(lo - 1, k, p))


def retention(
    Ks: Sequence[int],
    k: int,
    lo: int = 1,
    hi: int | None = None,
    curve_ks: Sequence[int] = (4, 8, 16),
) -> dict[str, Any]:
    """Retention analytics of one probe (see the module docstring)."""
    lo, hi = band(k, lo, hi)
    K = np.asarray(Ks, dtype=np.int64)
    n = int(K.size)
    kept = int(((lo <= K) & (hi >= K)).sum())
    obs = kept / n if n else 0.0
    a, b = fit_beta_binomial(K, k)
    pred = band_probability_beta(a, b, k, lo, hi)
    grid = np.linspace(0.0, 1.0, 101)
    curves, per_k = {}, {}
    for kk in curve_ks:
        # the same band shape at another k: [lo, kk − (k − hi)] (default: 0 < K < kk)
        lo_k, hi_k = min(lo, kk), max(min(lo, kk), kk - (k - hi))
        curves[str(kk)] = band_probability(grid, kk, lo_k, hi_k).round(6).tolist()
        p_keep = band_probability_beta(a, b, kk, lo_k, hi_k)
        per_k[str(kk)] = {
            "band": [lo_k, hi_k],
            "predicted_kept_frac": p_keep,
            "kept_per_probe_rollout": p_keep / kk,
        }
    default_band = (lo, hi) == (1, k - 1)
    return {
        "tasks": n,
        "k": k,
        "band": [lo, hi],
        "K_histogram": k_histogram(K, k),
        "pools": {
            "kept": kept,
            "unsolved": int((lo > K).sum()),
            "solved": int((hi < K).sum()),
        },
        "observed_kept_frac": obs,
        "observed_kept_frac_se": math.sqrt(obs * (1 - obs) / n) if n else 0.0,
        "beta_prior": {"a": a, "b": b, "mean_pass_rate": a / (a + b)},
        "predicted_kept_frac": pred,
        # the theory lab's closed form, equal to the sum above for the default band
        "predicted_kept_frac_closed_form": float(expected_keep_probability(a, b, k))
        if default_band
        else None,
        "kept_per_probe_rollout": kept / (n * k) if n else 0.0,
        # "k failures do not prove unlearnability": Pr(p > 5 % | K = 0) under the fitted prior
        "prob_pass_rate_above_5pct_given_unsolved": float(prob_above_given_all_fail(a, b, k, 0.05)),
        "p_grid": grid.round(4).tolist(),
        "keep_curve": curves,
        "by_k": per_k,
    }


def plot_retention(report: Mapping[str, Any], path: str | Path) -> Path:
    """Two panels: the observed K histogram beside the fitted prior's beta-binomial, and the
    curves Pr(kept | p) for each k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = int(report["k"])
    lo, hi = (int(x) for x in report["band"])
    hist = np.asarray(report["K_histogram"], dtype=float)
    a, b = report["beta_prior"]["a"], report["beta_prior"]["b"]
    j = np.arange(k + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = ["tab:green" if lo <= x <= hi else "tab:gray" for x in j]
    ax1.bar(j, hist, color=colors, label="observed (green: kept)")
    ax1.plot(
        j,
        beta_binomial_pmf(j, k, a, b) * hist.sum(),
        "ko-",
        ms=3,
        label=f"Beta({a:.2g}, {b:.2g}) fit",
    )
    ax1.set_xlabel(f"K (successes of k = {k})")
    ax1.set_ylabel("tasks")
    ax1.set_title(
        f"kept {report['observed_kept_frac']:.2f} observed, {report['predicted_kept_frac']:.2f} predicted"
    )
    ax1.legend(fontsize=8)
    for kk, ys in report["keep_curve"].items():
        ax2.plot(report["p_grid"], ys, label=f"k = {kk}")
    ax2.set_xlabel("task pass rate p")
    ax2.set_ylabel("Pr(kept | p)")
    ax2.set_title("Pr(lo ≤ K ≤ hi | p)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- manifests
STALE_KEYS = (
    "policy.fingerprint",
    "policy.dtype",
    "tools.fingerprint",
    "sampling",
    "prompt",
    "reward",
    "k",
)
"""What makes a filter verdict stale: another policy, other tools, other sampling, another
prompt protocol or reward, another k."""


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def manifest_problems(manifest: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Why a verdict recorded under ``manifest`` does not hold under ``current`` (same
    layout); empty when it does."""
    out = []
    for key in STALE_KEYS:
        a, b = _get(manifest, key), _get(current, key)
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            what = key.split(".")[0]
            out.append(f"{what} changed ({_short(a)} → {_short(b)})")
    return out


def _short(x: Any) -> str:
    s = json.dumps(x, sort_keys=True, default=str)
    return s if len(s) <= 60 else s[:57] + "…"


K_TABLE_HEADER = "K histogram (tasks with K = 0 … k successes)"


def format_k_table(label: str, hist: Sequence[int]) -> str:
    """One line: label, the histogram, and the kept fraction under the default band."""
    n = sum(hist)
    kept = sum(hist[1:-1])
    return f"  {label:<8} {list(hist)}  kept {kept}/{n}" + (f" ({kept / n:.0%})" if n else "")
