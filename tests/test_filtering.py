"""The filter's rules and retention analytics (pure functions, hand-computed values)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from provrl.filtering import (
    POOLS,
    assign_pools,
    band_probability,
    band_probability_beta,
    fit_beta_binomial,
    k_histogram,
    manifest_problems,
    pool_of,
    retention,
    transitions,
)
from provrl.theory.filtering import expected_keep_probability


def test_default_band_is_zero_below_k():
    k = 8
    assert [pool_of(K, k) for K in range(9)] == ["unsolved"] + ["kept"] * 7 + ["solved"]


def test_custom_band_puts_every_k_in_exactly_one_pool():
    k, lo, hi = 8, 1, 6
    pools = [pool_of(K, k, lo, hi) for K in range(9)]
    assert pools == ["unsolved"] + ["kept"] * 6 + ["solved", "solved"]
    K = {f"t{i}": i % 9 for i in range(40)}
    got = assign_pools(K, k, lo, hi)
    assert set(got) == set(K) and set(got.values()) <= set(POOLS)


def test_bad_band_and_bad_K_are_refused():
    with pytest.raises(ValueError, match="band"):
        pool_of(3, 8, 5, 4)
    with pytest.raises(ValueError, match="K = 9"):
        pool_of(9, 8)


def test_band_probability_matches_binomial_sums():
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    np.testing.assert_allclose(band_probability(p, 8), 1 - p**8 - (1 - p) ** 8, atol=1e-12)
    direct = sum(binom.pmf(j, 8, p) for j in range(1, 7))
    np.testing.assert_allclose(band_probability(p, 8, 1, 6), direct, atol=1e-12)


def test_beta_band_probability_equals_the_theory_closed_form():
    for a, b in [(0.5, 0.5), (2.0, 5.0), (0.3, 3.0)]:
        assert band_probability_beta(a, b, 8) == pytest.approx(
            float(expected_keep_probability(a, b, 8)), abs=1e-12
        )


def test_beta_binomial_fit_recovers_the_prior():
    rng = np.random.default_rng(0)
    a, b, k = 0.8, 2.0, 8
    K = rng.binomial(k, rng.beta(a, b, 4000))
    ah, bh = fit_beta_binomial(K, k)
    assert ah == pytest.approx(a, rel=0.15) and bh == pytest.approx(b, rel=0.15)


def test_retention_report_observed_and_predicted():
    rng = np.random.default_rng(1)
    K = rng.binomial(8, rng.beta(1.0, 1.5, 2000))
    r = retention(K.tolist(), 8)
    assert r["tasks"] == 2000 and sum(r["K_histogram"]) == 2000
    assert sum(r["pools"].values()) == 2000
    obs = np.mean((K > 0) & (K < 8))
    assert r["observed_kept_frac"] == pytest.approx(obs)
    # the fitted prior predicts the observed fraction within a few standard errors
    assert abs(r["predicted_kept_frac"] - obs) < 4 * r["observed_kept_frac_se"]
    assert r["predicted_kept_frac_closed_form"] == pytest.approx(r["predicted_kept_frac"])
    assert r["kept_per_probe_rollout"] == pytest.approx(obs / 8)
    assert set(r["keep_curve"]) == {"4", "8", "16"}
    assert max(r["keep_curve"]["8"]) == pytest.approx(1 - 2 * 0.5**8, abs=1e-6)


def test_transitions_table():
    old = {"a": "unsolved", "b": "unsolved", "c": "kept", "d": "unsolved"}
    new = {"a": "kept", "b": "unsolved", "c": "solved", "d": "kept", "e": "kept"}
    t = transitions(old, new)
    assert t["unsolved"] == {"kept": 2, "unsolved": 1, "solved": 0}
    assert t["kept"]["solved"] == 1
    assert sum(sum(r.values()) for r in t.values()) == 4  # e was not in the old filter


def test_k_histogram():
    assert k_histogram([0, 0, 3, 8], 8) == [2, 0, 0, 1, 0, 0, 0, 0, 1]


def test_manifest_problems_name_what_changed():
    m = {
        "policy": {"fingerprint": "sha256:aa", "dtype": "float32"},
        "tools": {"fingerprint": "sha256:t1"},
        "sampling": {"temperature": 1.0, "top_p": 1.0},
        "prompt": {"protocol": "tag", "shots": 0},
        "reward": {"kind": "em"},
        "k": 8,
    }
    assert manifest_problems(m, m) == []
    other = {**m, "policy": {"fingerprint": "sha256:bb", "dtype": "float32"}}
    assert manifest_problems(m, other)[0].startswith("policy changed")
    other = {
        **m,
        "tools": {"fingerprint": "sha256:t2"},
        "sampling": {"temperature": 0.7, "top_p": 1.0},
    }
    assert [p.split()[0] for p in manifest_problems(m, other)] == ["tools", "sampling"]
