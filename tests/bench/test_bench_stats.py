"""provrl.bench.stats: TOST on paired differences, its power and sample size — against hand
computations and a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from provrl.bench.stats import equivalence_report, tost_paired, tost_power, tost_sample_size


def test_tost_by_hand():
    a = [0.5, 1.0, 0.0, 0.5, 1.0, 0.5, 0.0, 1.0]
    b = [0.5, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 1.0]
    d = np.subtract(b, a)
    n, m, s = 8, d.mean(), d.std(ddof=1)
    se = s / math.sqrt(n)
    for margin in (0.1, 0.5):
        r = tost_paired(a, b, margin)
        p = max(1 - stats.t.cdf((m + margin) / se, n - 1), stats.t.cdf((m - margin) / se, n - 1))
        assert r.p_value == pytest.approx(p, rel=1e-9) and r.mean_diff == pytest.approx(m)
        half = stats.t.ppf(0.95, n - 1) * se
        assert r.ci == pytest.approx((m - half, m + half))
        # equivalent ⇔ the 90 % interval lies inside (−Δ, Δ)
        assert r.equivalent == (-margin < r.ci[0] and r.ci[1] < margin)
    assert not tost_paired(a, b, 0.1).equivalent and tost_paired(a, b, 0.5).equivalent


def test_few_pairs_never_show_equivalence_of_noisy_measurements():
    """2 seeds × 16 tasks judged 'gap ≤ noise' before: the same noise, paired per task,
    is far from showing equivalence within 5 points."""
    rng = np.random.default_rng(0)
    a = rng.choice([0.0, 0.5, 1.0], size=16)
    b = np.clip(a + rng.choice([-0.5, 0.0, 0.5], size=16, p=[0.25, 0.5, 0.25]), 0, 1)
    r = equivalence_report(a, b, margin=0.05)
    assert not r["equivalent"] and r["power_at_n"] < 0.2 and r["n_for_power"] > 100


def test_identical_measurements_are_equivalent_exactly():
    r = tost_paired([0.5, 1.0, 0.0], [0.5, 1.0, 0.0], 0.05)
    assert r.equivalent and r.p_value == 0.0 and r.ci == (0.0, 0.0)
    shifted = tost_paired([0.5, 1.0, 0.0], [0.625, 1.125, 0.125], 0.05)
    assert not shifted.equivalent and shifted.p_value == 1.0  # 0.125 is outside ±0.05


def test_power_and_sample_size_against_a_simulation():
    sd, margin, alpha = 0.4, 0.1, 0.05
    n = tost_sample_size(sd, margin, alpha, power=0.8)
    assert n == math.ceil(((stats.norm.ppf(0.95) + stats.norm.ppf(0.9)) * sd / margin) ** 2)
    assert tost_power(n, sd, margin, alpha) >= 0.8 > tost_power(n - 5, sd, margin, alpha)
    # simulate: true difference 0, normal per-unit differences
    rng = np.random.default_rng(1)
    d = rng.normal(0.0, sd, size=(4000, n))
    m, se = d.mean(1), d.std(1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(1 - alpha, n - 1) * se
    simulated = float(((m - half > -margin) & (m + half < margin)).mean())
    assert simulated == pytest.approx(tost_power(n, sd, margin, alpha), abs=0.03)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="one length"):
        tost_paired([1.0, 2.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        tost_paired([1.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="margin > 0"):
        tost_paired([1.0, 2.0], [1.0, 2.0], 0.0)


def test_async_vs_sync_pairs_tasks_averaged_over_seeds():
    from provrl.bench.async_vs_sync import paired_task_accuracy

    runs = {
        "sync": [{"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 0.5, "b": 0.0, "c": 1.0}],
        "async": [{"a": 1.0, "b": 0.5, "c": 0.5}, {"a": 1.0, "b": 0.5}],  # c: one seed lacks it
    }
    tasks, s, a = paired_task_accuracy(runs)
    assert tasks == ["a", "b"] and s == [0.75, 0.0] and a == [1.0, 0.5]
