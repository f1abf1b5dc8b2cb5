"""Statistics the benchmarks judge by: equivalence of paired measurements (TOST), its power
and the sample size it needs. Pure functions of numbers; scipy does the distributions.

**Equivalence, not "no difference found".** A test of difference that fails to reject says
nothing when it has little power: 2 seeds × 16 tasks cannot tell 0.72 from 0.75. The two
one-sided tests (TOST; Schuirmann 1987) reverse the burden: with paired differences
d_i = b_i − a_i (one per unit, e.g. per task), mean d̄ and standard error s/√n,

    H0: |μ_d| ≥ Δ   against   H1: |μ_d| < Δ          (Δ > 0: the stated margin)
    t_lower = (d̄ + Δ)/(s/√n),  t_upper = (d̄ − Δ)/(s/√n),  both with n − 1 degrees of freedom
    p = max(P(T ≥ t_lower), P(T ≤ t_upper)),          equivalent ⇔ p < α

which is the same as: the (1 − 2α) confidence interval of μ_d lies inside (−Δ, Δ).

**Power.** For a true difference of 0 and per-unit standard deviation σ, the normal
approximation of TOST's power at n units is 2Φ(Δ√n/σ − z_{1−α}) − 1 (0 when negative), so
reaching power 1 − β needs n ≥ ((z_{1−α} + z_{1−β/2}) σ/Δ)² units (Chow, Shao & Wang,
*Sample Size Calculations in Clinical Research*, §3.2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Equivalence:
    """The result of :func:`tost_paired`."""

    equivalent: bool
    """p < alpha: the mean paired difference lies within ±margin."""
    p_value: float
    """max of the two one-sided p-values."""
    mean_diff: float
    """d̄ = mean(b − a)."""
    ci: tuple[float, float]
    """The (1 − 2α) confidence interval of the mean difference (t distribution)."""
    margin: float
    alpha: float
    n: int
    """Pairs (units)."""
    sd_diff: float
    """Sample standard deviation of the differences (ddof = 1)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ci": list(self.ci)}


def tost_paired(
    a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05
) -> Equivalence:
    """TOST for the paired samples ``a``, ``b`` (unit i measured under both conditions) with
    equivalence margin ``margin`` on the mean of b − a (module docstring). With every
    difference equal (s = 0) the interval is that value and the answer is exact."""
    from scipy import stats

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"tost_paired: a and b must be 1-d of one length, got {x.shape}, {y.shape}")  # fmt: skip
    if x.size < 2:
        raise ValueError(f"tost_paired: need at least 2 pairs, got {x.size}")
    if not margin > 0 or not 0 < alpha < 0.5:
        raise ValueError(f"tost_paired: need margin > 0 and 0 < alpha < 0.5, got {margin}, {alpha}")  # fmt: skip
    d = y - x
    n, mean, sd = int(d.size), float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        inside = abs(mean) < margin
        return Equivalence(inside, 0.0 if inside else 1.0, mean, (mean, mean), margin, alpha, n, 0.0)  # fmt: skip
    p_lower = float(stats.ttest_1samp(d, -margin, alternative="greater").pvalue)
    p_upper = float(stats.ttest_1samp(d, margin, alternative="less").pvalue)
    half = float(stats.t.ppf(1 - alpha, n - 1)) * sd / math.sqrt(n)
    p = max(p_lower, p_upper)
    return Equivalence(p < alpha, p, mean, (mean - half, mean + half), margin, alpha, n, sd)


def tost_power(n: int, sd: float, margin: float, alpha: float = 0.05) -> float:
    """TOST's power at ``n`` pairs when the true mean difference is 0 (normal
    approximation, module docstring)."""
    from scipy.stats import norm

    if sd <= 0:
        return 1.0
    return max(0.0, 2 * float(norm.cdf(margin * math.sqrt(n) / sd - norm.ppf(1 - alpha))) - 1)


def tost_sample_size(sd: float, margin: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Pairs TOST needs for ``power`` when the true mean difference is 0:
    ⌈((z_{1−α} + z_{1−β/2}) σ/Δ)²⌉, at least 2."""
    from scipy.stats import norm

    if sd <= 0:
        return 2
    beta = 1 - power
    z = float(norm.ppf(1 - alpha) + norm.ppf(1 - beta / 2))
    return max(2, math.ceil((z * sd / margin) ** 2))


def equivalence_report(
    a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05, power: float = 0.8
) -> dict[str, Any]:
    """:func:`tost_paired` with its power at this n and the n that ``power`` needs, both at
    the observed standard deviation of the differences."""
    r = tost_paired(a, b, margin, alpha)
    return r.as_dict() | {
        "power_at_n": round(tost_power(r.n, r.sd_diff, margin, alpha), 4),
        "n_for_power": tost_sample_size(r.sd_diff, margin, alpha, power),
        "target_power": power,
    }
