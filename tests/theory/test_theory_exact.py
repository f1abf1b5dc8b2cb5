"""Exact evaluation, the performance-difference identity and Theorem 1's bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.theory.bound_check import check_bounds, propose_pairs
from provrl.theory.config import BoundCheckConfig
from provrl.theory.exact import (
    compare,
    evaluate,
    kl_divergence,
    tv_bound_loose,
    tv_bound_tight,
)
from provrl.theory.mdp import TabularMDP, chain_mdp, gridworld_mdp, random_mdp


def _policy(rng, S, A, temp=1.0):
    z = np.exp(temp * rng.normal(size=(S, A)))
    return z / z.sum(-1, keepdims=True)


def _mdps(rng, n):
    out = []
    for i in range(n):
        g = float(rng.choice([0.5, 0.9, 0.99]))
        S, A = int(rng.integers(2, 15)), int(rng.integers(2, 5))
        kind = i % 3
        if kind == 0:
            out.append(random_mdp(rng, S, A, g))
        elif kind == 1:
            out.append(random_mdp(rng, S, A, g, branching=2, reward="sparse", start="single"))
        else:
            out.append(random_mdp(rng, S, A, g, reward="signed"))
    return out


def test_one_state_closed_form():
    """One state, two actions, r = (1, 0): V = p/(1−γ), A(·, a) = r_a − p, ρ = 1/(1−γ)."""
    g, p = 0.8, 0.3
    m = TabularMDP(np.ones((1, 2, 1)), np.array([[1.0, 0.0]]), g, np.ones(1))
    ev = evaluate(m, np.array([[p, 1 - p]]))
    assert ev.V[0] == pytest.approx(p / (1 - g))
    np.testing.assert_allclose(ev.A[0], [1 - p, -p])
    assert ev.rho[0] == pytest.approx(1 / (1 - g))
    rep = compare(m, np.array([[p, 1 - p]]), np.array([[0.9, 0.1]]))
    assert rep.J_new - rep.J_old == pytest.approx((0.9 - p) / (1 - g))
    assert rep.gap == pytest.approx(0.0, abs=1e-14)  # one state: ρ_π' = ρ_π, L is exact


def test_evaluation_matches_power_series(rng):
    """V, ρ and J from the linear solves against Σ_t γ^t P_π^t (an independent computation)."""
    m = random_mdp(rng, 6, 3, 0.7, branching=3)
    pi = _policy(rng, 6, 3)
    ev = evaluate(m, pi)
    P = np.einsum("sa,sat->st", pi, m.P)
    r = (pi * m.R).sum(-1)
    V, rho, Pt = np.zeros(6), np.zeros(6), np.eye(6)
    for t in range(400):
        V += m.gamma**t * Pt @ r
        rho += m.gamma**t * m.mu0 @ Pt
        Pt = Pt @ P
    np.testing.assert_allclose(ev.V, V, rtol=1e-12)
    np.testing.assert_allclose(ev.rho, rho, rtol=1e-12)
    assert ev.rho.sum() == pytest.approx(1 / (1 - m.gamma))
    assert pytest.approx(rho @ r) == ev.J
    # Bellman: Q(s, a) = r(s, a) + γ Σ P V and V = Σ_a π Q
    np.testing.assert_allclose((pi * ev.Q).sum(-1), ev.V, rtol=1e-12)
    np.testing.assert_allclose((pi * ev.A).sum(-1), 0.0, atol=1e-12)


def test_batched_equals_unbatched(rng):
    m = gridworld_mdp(3, 3, 0.9)
    pis = np.stack([_policy(rng, 9, 4) for _ in range(5)])
    batch = evaluate(m, pis)
    for i in range(5):
        one = evaluate(m, pis[i])
        np.testing.assert_allclose(batch.V[i], one.V, rtol=1e-13)
        np.testing.assert_allclose(batch.rho[i], one.rho, rtol=1e-13)


def test_performance_difference_identity_to_1e9(rng):
    """J(π') − J(π) = Σ_s ρ_π'(s) Σ_a π'(a|s) A_π(s, a), from the primitives, on 200 MDPs."""
    worst = 0.0
    for m in _mdps(rng, 200):
        pi, new = _policy(rng, m.n_states, m.n_actions), _policy(rng, m.n_states, m.n_actions)
        old_ev, new_ev = evaluate(m, pi), evaluate(m, new)
        rhs = new_ev.rho @ (new * old_ev.A).sum(-1)
        worst = max(worst, abs((new_ev.J - old_ev.J) - rhs))
        surrogate = old_ev.J + old_ev.rho @ (new * old_ev.A).sum(-1)
        rep = compare(m, pi, new)
        # the cancellation-free gap equals the naive J(π') − L_π(π')
        assert rep.gap == pytest.approx(new_ev.J - surrogate, abs=1e-9)
        assert rep.surrogate == pytest.approx(surrogate, abs=1e-9)
    assert worst < 1e-9


def test_bounds_hold_on_random_and_adversarial_pairs(rng):
    """Both TV bounds and the KL bound, computed here from the primitives, on ~600 pairs
    including the adversarial families (small high-advantage changes, near-deterministic)."""
    n = 0
    for m in [*_mdps(rng, 40), chain_mdp(6, 0.95), gridworld_mdp(3, 3, 0.9)]:
        pis, news, fams = propose_pairs(rng, m, 3)
        for pi, new in zip(pis, news, strict=True):
            old_ev, new_ev = evaluate(m, pi), evaluate(m, new)
            L = old_ev.J + old_ev.rho @ (new * old_ev.A).sum(-1)
            alpha = 0.5 * np.abs(pi - new).sum(-1).max()
            eps = np.abs(old_ev.A).max()
            g = m.gamma
            tight = 4 * eps * g * alpha**2 / ((1 - g) * (1 - g * (1 - alpha)))
            loose = 4 * eps * g * alpha**2 / (1 - g) ** 2
            C = 4 * eps * g / (1 - g) ** 2
            slack = 1e-9 * (1 + abs(new_ev.J))
            assert abs(new_ev.J - L) <= tight + slack
            assert tight <= loose * (1 + 1e-12)
            assert L - C * kl_divergence(pi, new).max() - slack <= new_ev.J
            n += 1
        assert set(fams) == {"random", "local", "high_adv", "near_det", "cpi"}
    assert n >= 600


def test_checker_reports_zero_violations_and_catches_a_wrong_bound():
    res = check_bounds(BoundCheckConfig(mdps=40, search_steps=8), progress=False)
    s = res.summary
    assert s["violations"] == 0, s["first_violation"]
    assert s["pairs"] == 40 * 11
    assert s["identity_max_abs_error"] < 1e-9
    assert 0 < s["tightness"]["tv_tight"]["max"] <= 1
    # the adversarial search finds tighter pairs than random pairs do (median)
    by = s["tightness_tv_tight_by_family"]
    assert by["search"]["q50"] > by["random"]["q50"]
    # the same check flags the misreading α → d_π-average TV: the checker can fail
    assert s["misreading_violations"]["tv_tight_with_mean_tv"] > 0


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-6, 1.0),
    st.floats(0.01, 0.999),
    st.floats(1e-3, 10.0),
)
def test_tight_bound_never_exceeds_loose(alpha, gamma, eps):
    assert tv_bound_tight(eps, gamma, alpha) <= tv_bound_loose(eps, gamma, alpha) * (1 + 1e-12)
    # and it is the closed form of Σ_t γ^t 4εα(1 − (1−α)^t)
    t = np.arange(20000)
    series = (gamma**t * 4 * eps * alpha * (1 - (1 - alpha) ** t)).sum()
    if gamma < 0.99:
        assert tv_bound_tight(eps, gamma, alpha) == pytest.approx(series, rel=1e-9)
