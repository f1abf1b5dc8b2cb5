"""mean_ci: the bootstrap interval of a mean over seeds."""

from __future__ import annotations

import numpy as np
import pytest

from provrl.classic.evaluate import mean_ci


def test_mean_ci_brackets_the_mean_and_matches_the_normal_interval_for_large_samples():
    x = np.random.default_rng(0).normal(3.0, 2.0, 400)
    m, lo, hi = mean_ci(x, resamples=4000)
    assert m == pytest.approx(x.mean())
    half = 1.96 * x.std(ddof=1) / np.sqrt(x.size)
    assert lo == pytest.approx(m - half, abs=0.15 * half)
    assert hi == pytest.approx(m + half, abs=0.15 * half)
    assert mean_ci(x, resamples=4000) == (m, lo, hi)  # fixed resampling seed


def test_mean_ci_degenerate_and_bad_input():
    assert mean_ci([500.0] * 10) == (500.0, 500.0, 500.0)
    m, lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert lo < m == 5.5 < hi and hi - lo < 9
    with pytest.raises(ValueError, match="at least 2"):
        mean_ci([1.0])
