"""Filtering analytics against Monte-Carlo (fixed seeds) and numerical integration."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from provrl.theory.filtering import (
    all_fail_probability,
    beta_binomial_pmf,
    expected_all_fail_probability,
    expected_keep_probability,
    keep_probability,
    monte_carlo_keep,
    posterior_after_probe,
    prob_above_given_all_fail,
)


@pytest.mark.parametrize("k", [4, 8, 16])
@pytest.mark.parametrize("p", [0.02, 0.1, 0.5, 0.8])
def test_keep_probability_against_monte_carlo(k, p):
    rng = np.random.default_rng(k * 100 + int(p * 100))
    n = 100_000
    exact = float(keep_probability(p, k))
    mc = monte_carlo_keep(rng, k, n, p=p)
    se = np.sqrt(exact * (1 - exact) / n)
    assert abs(mc - exact) < 5 * se + 1e-12
    assert exact == pytest.approx(1 - stats.binom.pmf(0, k, p) - stats.binom.pmf(k, k, p))


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.5, 2.0), (3.0, 0.7)])
@pytest.mark.parametrize("k", [4, 8, 16])
def test_beta_expectation_closed_form(a, b, k):
    closed = float(expected_keep_probability(a, b, k))
    quad, _ = integrate.quad(lambda p: keep_probability(p, k) * stats.beta.pdf(p, a, b), 0, 1)
    assert closed == pytest.approx(quad, abs=1e-8)
    mc = monte_carlo_keep(np.random.default_rng(7), k, 100_000, a=a, b=b)
    assert abs(mc - closed) < 5 * np.sqrt(closed * (1 - closed) / 100_000)
    pmf = beta_binomial_pmf(np.arange(k + 1), k, a, b)
    assert pmf.sum() == pytest.approx(1.0)
    assert closed == pytest.approx(1 - pmf[0] - pmf[k])
    assert expected_all_fail_probability(a, b, k) == pytest.approx(pmf[0])


def test_uniform_prior_and_maximum():
    for k in (2, 4, 8, 16):
        assert expected_keep_probability(1.0, 1.0, k) == pytest.approx((k - 1) / (k + 1))
        p = np.linspace(0, 1, 10001)
        assert keep_probability(p, k).max() == pytest.approx(1 - 2.0 ** (1 - k))
    assert keep_probability(0.3, 1) == pytest.approx(0.0)  # one probe is never mixed
    assert all_fail_probability(0.25, 8) == pytest.approx(0.75**8)


def test_posterior_and_unlearnability():
    assert posterior_after_probe(1.0, 1.0, 0, 8) == (1.0, 9.0)
    quad, _ = integrate.quad(lambda p: stats.beta.pdf(p, 0.5, 2.0 + 8), 0.05, 1)
    assert prob_above_given_all_fail(0.5, 2.0, 8, 0.05) == pytest.approx(quad, abs=1e-9)
    # more failures → less likely to be learnable, but never 0
    v = prob_above_given_all_fail(1.0, 1.0, np.array([4, 8, 16]), 0.05)
    assert (np.diff(v) < 0).all() and v[-1] > 0


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="pass rate"):
        keep_probability(1.5, 4)
    with pytest.raises(ValueError, match="positive integer"):
        keep_probability(0.5, 0)
    with pytest.raises(ValueError, match="Beta prior"):
        expected_keep_probability(0.0, 1.0, 4)
    with pytest.raises(ValueError, match="successes"):
        posterior_after_probe(1.0, 1.0, 9, 8)
