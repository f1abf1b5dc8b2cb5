"""The conformance statistics against hand-computed values, and their calibration: on draws
from the exact law, the p-values are close to uniform (a seeded check, not a timed one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from provrl.conformance import stats as st


def test_g_test_by_hand():
    o, q = [30, 50, 20], [0.25, 0.5, 0.25]
    e = [25.0, 50.0, 25.0]
    g = 2 * sum(oi * math.log(oi / ei) for oi, ei in zip(o, e, strict=True))
    r = st.g_test(o, q)
    assert r.statistic == pytest.approx(g)
    assert r.dof == 2
    assert r.p_value == pytest.approx(math.exp(-g / 2))  # χ²_2 survival = e^{-x/2}


def test_pearson_by_hand():
    r = st.pearson([30, 50, 20], [0.25, 0.5, 0.25])
    assert r.statistic == pytest.approx(25 / 25 + 0 + 25 / 25)
    assert r.p_value == pytest.approx(math.exp(-1.0))


def test_a_count_outside_the_support_is_infinite():
    r = st.g_test([10, 0, 1], [0.5, 0.5, 0.0])
    assert r.statistic == math.inf and r.p_value == 0.0
    # an empty zero-mass cell is dropped
    assert st.g_test([10, 10, 0], [0.5, 0.5, 0.0]).dof == 1


def test_one_cell_is_untestable():
    assert st.g_test([7], [1.0]) == st.TestResult(0.0, 0, 1.0)


def test_cells_pool_rare_tokens_into_the_rest():
    known = {1: 0.5, 2: 0.3, 3: 0.004, 4: 0.001}
    c = st.make_cells(known, n=1000)
    assert c.tokens == (1, 2)  # n·q = 4 and 1 < 5: pooled
    assert c.probs == pytest.approx([0.5, 0.3, 0.2])


def test_a_small_rest_takes_the_smallest_own_cell():
    known = {1: 0.6, 2: 0.399, 3: 0.001}  # rest 0.001·1000 = 1 < 5
    c = st.make_cells(known, n=1000)
    assert c.tokens == (1,)
    assert c.probs == pytest.approx([0.6, 0.4])


def test_a_full_support_leaves_a_rest_of_mass_zero():
    c = st.make_cells({1: 0.5, 2: 0.5}, n=100)
    assert c.probs[-1] == 0.0
    assert st.g_test(st.count(c, [1] * 50 + [2] * 49 + [9]), c.probs).p_value == 0.0


def test_count_sends_unknown_tokens_to_the_rest():
    c = st.Cells((5, 7), np.array([0.5, 0.3, 0.2]))
    assert st.count(c, [5, 5, 7, 1, 2]).tolist() == [2, 1, 2]


def test_mass_excess():
    assert st.mass_excess({1: 0.6, 2: 0.5}) == pytest.approx(0.1)
    assert st.mass_excess({1: 0.6}) == 0.0


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.5]
    # sorted: 0.01 ≤ 0.05/4, 0.03 > 0.05/3 → only the first is rejected
    assert st.holm(p, 0.05) == [True, False, False, False]
    assert st.holm([0.001, 0.01, 0.02], 0.05) == [True, True, True]
    adj = st.holm_adjusted(p)
    assert adj == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert [a <= 0.05 for a in adj] == st.holm(p, 0.05)


def test_power_grows_with_n_and_is_alpha_at_zero_effect():
    assert st.power(1000, 5, 0.0, 0.01) == pytest.approx(0.01, rel=1e-6)
    assert st.power(100, 5, 0.2, 0.01) < st.power(1000, 5, 0.2, 0.01) > 0.99
    assert st.power(1000, 0, 0.2, 0.01) == 0.0


def test_effect_size_by_hand():
    assert st.effect_size([0.3, 0.7], [0.5, 0.5]) == pytest.approx(math.sqrt(0.08 + 0.08))


def test_p_values_are_calibrated_on_the_exact_law():
    """200 seeded replicates of the pilot → cells → G-test pipeline on draws from a known
    law: the p-values pass a KS test against U(0, 1), and the false-alarm rate at α = 0.05
    is within binomial noise of 0.05."""
    rng = np.random.default_rng(0)
    law = rng.dirichlet(np.full(40, 0.3))
    p_values = []
    for _ in range(200):
        pilot = rng.choice(law.size, size=300, p=law)
        known = {int(t): float(law[t]) for t in set(pilot.tolist())}
        cells = st.make_cells(known, n=1500)
        p_values.append(st.g_test(st.count(cells, rng.choice(law.size, 1500, p=law)), cells.probs).p_value)  # fmt: skip
    assert sps.kstest(p_values, "uniform").pvalue > 0.01
    assert np.mean(np.array(p_values) < 0.05) < 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)


def test_the_test_rejects_a_shifted_law():
    rng = np.random.default_rng(1)
    law = np.array([0.4, 0.3, 0.2, 0.1])
    shifted = np.array([0.45, 0.3, 0.15, 0.1])  # w ≈ 0.14
    cells = st.make_cells(dict(enumerate(law.tolist())), n=2000)
    r = st.g_test(st.count(cells, rng.choice(4, 2000, p=shifted)), cells.probs)
    assert r.p_value < 1e-4
    assert st.power(2000, 3, st.effect_size(shifted, law), 1e-4) > 0.9


def test_seen_mass_test_by_hand():
    r = st.seen_mass_test(10, 10, 0.5)
    assert r.p_value == pytest.approx(2 * 0.5**10)
    assert r.statistic == pytest.approx(0.5)
    # all draws on tokens whose reported q add to 4e-4: impossible under H0
    assert st.seen_mass_test(400, 400, 4e-4).p_value < 1e-100


def test_seen_mass_test_false_alarms_stay_below_alpha():
    """The exact binomial test is conservative: on draws from the exact law its false-alarm
    rate at α = 0.05 over 300 seeded replicates is within binomial noise of ≤ 0.05."""
    rng = np.random.default_rng(2)
    law = rng.dirichlet(np.full(60, 0.2))
    alarms = 0
    for _ in range(300):
        seen = set(rng.choice(law.size, size=100, p=law).tolist())
        test = rng.choice(law.size, size=400, p=law)
        hits = int(sum(t in seen for t in test.tolist()))
        alarms += st.seen_mass_test(hits, 400, float(law[list(seen)].sum())).p_value < 0.05
    assert alarms / 300 < 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)
