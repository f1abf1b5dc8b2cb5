r"""The statistics of ``provrl conformance``: pure functions of counts and probabilities.

**The sampling-law test.** At one fixed prefix h an engine draws n tokens a_1 … a_n, i.i.d.
from the law p it actually samples from, and reports q(a_j) = exp(logprob_j) for each.
The null hypothesis is H0: p = q (the reported law is the sampled one).

*Cells* (:func:`make_cells`). The engine reports q only for the tokens it drew, so the
cells come from a separate *pilot* sample — the binning never looks at the tested data.
Every pilot token i with expected count n·q_i ≥ e_min (5, the usual rule) gets a cell of
its own; every other token, seen in the pilot or not, falls in one *rest* cell of mass
::

    q_rest = max(0, 1 − Σ_{own cells} q_i)

If 0 < n·q_rest < e_min, the own cells of smallest mass move into the rest until it is
not (rare tokens are pooled, never dropped). A reported law whose known masses add to
more than 1 is a finding of its own (:func:`mass_excess`).

*G-test* (:func:`g_test`), with O_c the observed and E_c = n·q_c the expected counts::

    G  = 2 Σ_c O_c ln(O_c / E_c)          (a cell with O_c = 0 adds 0)
    G  →  χ²_{C−1} under H0,   p = P(χ²_{C−1} ≥ G)

where C counts the cells of positive mass. A count in a cell of mass 0 (a token outside
the reported support) gives G = ∞, p = 0. Pearson's X² = Σ_c (O_c − E_c)² / E_c
(:func:`pearson`) has the same limit.

*Seen-set test* (:func:`seen_mass_test`). Cells need expected counts ≥ e_min, so a law
whose reported q are all tiny (a raw logprob over a 50k vocabulary) leaves nothing to
test by G. Exact counts have no such limit: with K the set of tokens the pilot drew and
Q_K = Σ_{i∈K} q_i their reported mass, the number X of tested draws that fall in K is,
under H0, exactly Binomial(n, Q_K) (K does not depend on the tested draws). The two-sided
exact binomial p-value catches a law whose drawn tokens carry too little (or too much)
reported mass, whatever n·q_i.

**Multiple testing** (:func:`holm`). m tests (prompts × sampling settings) at family
level α: sort p_(1) ≤ … ≤ p_(m); reject H_(1) … H_(j−1), where j is the first index
with p_(j) > α / (m − j + 1). The family-wise false-alarm rate is ≤ α whatever the
dependence between the tests (Holm 1979).

**Power** (:func:`power`). Against a law p' at Cohen's effect size
w = sqrt(Σ_c (p'_c − q_c)² / q_c), the statistic is approximately noncentral
χ²_{C−1}(λ) with λ = n·w², so

    power = P(χ²_{C−1}(λ) ≥ χ²_{C−1, 1−α'})

at the per-test level α' (Holm's smallest, α/m, for the worst case).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

E_MIN = 5.0
"""The smallest expected count a cell of its own may have (the usual χ² rule)."""


@dataclass(frozen=True)
class Cells:
    """The cells of one sampling-law test: ``tokens[c]`` owns cell c; the last cell of
    ``probs`` (one longer than ``tokens``) is the rest, every other token."""

    tokens: tuple[int, ...]
    probs: np.ndarray  # [C + 1] float64, sums to 1 when the reported law does


@dataclass(frozen=True)
class TestResult:
    """A goodness-of-fit statistic, its degrees of freedom and its p-value."""

    statistic: float
    dof: int
    p_value: float


def mass_excess(known: Mapping[int, float]) -> float:
    """Σ_i q_i − 1 over the tokens whose q is known, floored at 0: > 0 means the reported
    probabilities are not a law (they add to more than one)."""
    return max(0.0, float(sum(known.values())) - 1.0)


def make_cells(known: Mapping[int, float], n: int, e_min: float = E_MIN) -> Cells:
    """The cells for a test of n draws, from the pilot's ``known`` token → q (see the
    module docstring: own cells for n·q_i ≥ e_min, the rest pooled, the rest kept at an
    expected count ≥ e_min unless it is exactly 0)."""
    own = sorted(((q, t) for t, q in known.items() if n * q >= e_min), reverse=True)
    while own:
        rest = 1.0 - sum(q for q, _ in own)
        if not 0.0 < n * rest < e_min or len(own) == 1:
            break
        own.pop()  # the smallest own cell joins the rest
    rest = max(0.0, 1.0 - sum(q for q, _ in own))
    probs = np.array([q for q, _ in own] + [rest], dtype=np.float64)
    return Cells(tuple(t for _, t in own), probs)


def count(cells: Cells, samples: Iterable[int]) -> np.ndarray:
    """Observed counts O_c [C + 1] of ``samples`` in ``cells`` (unknown tokens → rest)."""
    index = {t: c for c, t in enumerate(cells.tokens)}
    rest = len(cells.tokens)
    out = np.zeros(rest + 1, dtype=np.int64)
    for t in samples:
        out[index.get(int(t), rest)] += 1
    return out


def g_test(observed: Sequence[int] | np.ndarray, probs: Sequence[float] | np.ndarray) -> TestResult:  # fmt: skip
    """G = 2 Σ_c O_c ln(O_c / E_c), E_c = n·q_c, against χ²_{C−1} (C = cells of positive
    mass). A count where q_c = 0 gives G = ∞, p = 0; fewer than two such cells, dof 0, p 1."""
    o = np.asarray(observed, dtype=np.float64)
    q = np.asarray(probs, dtype=np.float64)
    if o.shape != q.shape:
        raise ValueError(f"g_test: {o.shape[0]} counts for {q.shape[0]} probabilities")
    if bool(((q <= 0) & (o > 0)).any()):
        return TestResult(float("inf"), max(int((q > 0).sum()) - 1, 0), 0.0)
    live = q > 0
    o, q = o[live], q[live]
    dof = int(q.size) - 1
    e = o.sum() * q / q.sum()
    seen = o > 0
    g = float(2.0 * np.sum(o[seen] * np.log(o[seen] / e[seen])))
    if dof <= 0:
        return TestResult(0.0, 0, 1.0)
    return TestResult(g, dof, float(sps.chi2.sf(g, dof)))


def pearson(observed: Sequence[int] | np.ndarray, probs: Sequence[float] | np.ndarray) -> TestResult:  # fmt: skip
    """X² = Σ_c (O_c − E_c)² / E_c against χ²_{C−1} (same conventions as :func:`g_test`)."""
    o = np.asarray(observed, dtype=np.float64)
    q = np.asarray(probs, dtype=np.float64)
    if bool(((q <= 0) & (o > 0)).any()):
        return TestResult(float("inf"), max(int((q > 0).sum()) - 1, 0), 0.0)
    live = q > 0
    o, q = o[live], q[live]
    dof = int(q.size) - 1
    if dof <= 0:
        return TestResult(0.0, 0, 1.0)
    e = o.sum() * q / q.sum()
    x2 = float(np.sum((o - e) ** 2 / e))
    return TestResult(x2, dof, float(sps.chi2.sf(x2, dof)))


def seen_mass_test(hits: int, n: int, mass: float) -> TestResult:
    """Exact two-sided binomial test of X = ``hits`` ~ Binomial(n, Q_K = ``mass``) (the
    tested draws in the pilot's seen set); statistic X/n − Q_K, dof 0."""
    q = min(max(mass, 0.0), 1.0)
    p = float(sps.binomtest(int(hits), int(n), q).pvalue) if n else 1.0
    return TestResult(hits / n - q if n else 0.0, 0, p)


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level ``alpha``: H_(j) is rejected iff
    p_(i) ≤ α / (m − i + 1) for every i ≤ j (1-based ranks of the sorted p-values)."""
    m = len(p_values)
    reject = [False] * m
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        if p_values[i] > alpha / (m - rank):
            break
        reject[i] = True
    return reject


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: p̃_(j) = min(1, max_{i ≤ j} (m − i + 1)·p_(i)); H_j is
    rejected at level α iff p̃_j ≤ α."""
    m = len(p_values)
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def power(n: int, dof: int, w: float, alpha: float) -> float:
    """P(χ²_dof(λ = n·w²) ≥ χ²_{dof, 1−α}): the chance a test of n draws at level α
    rejects a law at effect size w (0 when dof = 0: nothing is testable)."""
    if dof <= 0:
        return 0.0
    crit = sps.chi2.isf(alpha, dof)
    return float(sps.ncx2.sf(crit, dof, n * w * w))


def effect_size(p_alt: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray) -> float:
    """Cohen's w = sqrt(Σ_c (p'_c − q_c)² / q_c) over the cells of positive q."""
    pa = np.asarray(p_alt, dtype=np.float64)
    qq = np.asarray(q, dtype=np.float64)
    live = qq > 0
    return float(np.sqrt(np.sum((pa[live] - qq[live]) ** 2 / qq[live])))
