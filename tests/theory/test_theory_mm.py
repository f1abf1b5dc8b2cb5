"""Exact Algorithm 1, average-KL TRPO and policy iteration on tabular MDPs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import minimize

from provrl.theory.exact import evaluate, greedy_policy, kl_divergence, penalty_coefficient
from provrl.theory.mdp import chain_mdp, gridworld_mdp, random_mdp
from provrl.theory.mm import Tilt, mm_objective, mm_step, optimal_return, run_updates, trpo_step


def _policy(rng, S, A):
    z = np.exp(rng.normal(size=(S, A)))
    return z / z.sum(-1, keepdims=True)


def _perturb(rng, q, scale):
    z = np.log(np.maximum(q, 1e-300)) + rng.normal(0, scale, q.shape)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_tilt_solves_the_per_state_problem(rng):
    """q(x) ∝ p/(x + g) maximises ⟨q, b⟩ − λ(x) KL(p‖q) (checked against a generic solver)."""
    p = _policy(rng, 1, 4)
    b = rng.normal(size=(1, 4))
    tilt = Tilt.of(p, b)
    for x in (1e-3, 0.1, 2.0):
        xs = np.array([x])
        q, lam = tilt.policy(xs), tilt.multiplier(xs)[0]

        def obj(z, lam=lam):
            z = np.exp(z - z.max())
            z = z / z.sum()
            return -(z @ b[0] - lam * kl_divergence(p[0], z))

        res = minimize(obj, np.log(p[0]), method="BFGS", options={"gtol": 1e-12})
        assert -obj(np.log(q[0])) >= -res.fun - 1e-10
        # the accurate KL evaluation equals the direct formula where both are accurate
        assert tilt.kl(xs)[0] == pytest.approx(kl_divergence(p[0], q[0]), rel=1e-10)
    # tiny KL keeps relative precision: KL ≈ Var_p(g)/(2x²) as x → ∞
    x = np.array([1e7])
    g_var = p[0] @ tilt.g[0] ** 2 - (p[0] @ tilt.g[0]) ** 2
    assert tilt.kl(x)[0] == pytest.approx(g_var / (2 * x[0] ** 2), rel=1e-6)


def test_tilt_outside_support_escape(rng):
    """A zero-probability action that beats every supported one gets the leftover mass,
    exactly as the KKT point says (checked against SLSQP on the simplex)."""
    p = np.array([[0.5, 0.5, 0.0]])
    b = np.array([[0.0, 0.2, 1.0]])
    tilt = Tilt.of(p, b)
    for lam in (0.05, 0.5, 5.0):
        x = tilt.solve_x("Z", np.array([tilt.spread[0] / lam]))
        q = tilt.policy(x)[0]
        assert q.sum() == pytest.approx(1.0)
        # escape iff ν* < b_o: for a high KL price the step is too small to reach action 2
        assert (q[2] > 0) == (lam < 1.0)

        def neg(z, lam=lam):
            return -(z @ b[0] - lam * kl_divergence(p[0], z))

        res = minimize(
            neg,
            np.array([0.4, 0.4, 0.2]),
            method="SLSQP",
            bounds=[(1e-12, 1)] * 3,
            constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1}],
            options={"ftol": 1e-14, "maxiter": 500},
        )
        assert -neg(q) >= -res.fun - 1e-8
        np.testing.assert_allclose(q, res.x, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mm_step_is_the_exact_maximiser(seed):
    """KKT: every active state sits on D_KL = t*, Σ_s μ_s = C; nothing nearby is better;
    a generic optimiser does not beat it."""
    rng = np.random.default_rng(seed)
    m = random_mdp(rng, 5, 3, 0.9)
    pi = _policy(rng, 5, 3)
    ev = evaluate(m, pi)
    C = float(penalty_coefficient(np.abs(ev.A).max(), m.gamma))
    q, info = mm_step(pi, ev.rho, ev.A, C)
    kl = kl_divergence(pi, q)
    np.testing.assert_allclose(kl, info.t, rtol=1e-8)
    tilt = Tilt.of(pi, ev.rho[:, None] * ev.A)
    mu = tilt.multiplier(tilt.solve_x("kl", np.full(5, info.t)))
    assert mu.sum() == pytest.approx(C, rel=1e-8)
    M = mm_objective(pi, q, float(ev.J), ev.rho, ev.A, C)
    assert float(ev.J) <= M  # M_π(π) = J(π): the step never loses the minoriser
    for scale in (1e-6, 1e-4, 1e-2):
        for _ in range(50):
            assert mm_objective(pi, _perturb(rng, q, scale), float(ev.J), ev.rho, ev.A, C) <= M

    def neg(z):
        z = z.reshape(5, 3)
        z = np.exp(z - z.max(-1, keepdims=True))
        return -mm_objective(pi, z / z.sum(-1, keepdims=True), float(ev.J), ev.rho, ev.A, C)

    res = minimize(
        neg,
        np.log(pi).ravel(),
        method="Nelder-Mead",
        options={"maxiter": 4000, "xatol": 1e-10, "fatol": 1e-14},
    )
    assert -res.fun - 1e-9 <= M


@pytest.mark.parametrize(
    "mdp",
    [gridworld_mdp(3, 3, 0.9), chain_mdp(6, 0.9), random_mdp(np.random.default_rng(5), 8, 3, 0.95)],
    ids=["grid", "chain", "random"],
)
def test_mm_iteration_never_decreases_J(mdp):
    pi0 = np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions)
    for c in (1.0, 0.5):
        tr = run_updates(mdp, pi0, 6, method="mm", c_scale=c)
        J = np.asarray(tr.J)
        assert (np.diff(J) >= -1e-12).all()
        assert J[-1] > J[0]
        # the minoriser is a lower bound: J(π_{i+1}) ≥ M_{π_i}(π_{i+1}) ≥ J(π_i)
        lb = np.asarray(tr.lower_bound)
        assert (J[1:] >= lb - 1e-10).all()
        assert (lb >= J[:-1] - 1e-10).all()


def test_trpo_step_exact_on_the_trust_region(rng):
    m = random_mdp(rng, 4, 3, 0.9)
    pi = _policy(rng, 4, 3)
    ev = evaluate(m, pi)
    d = (1 - m.gamma) * ev.rho
    rows = np.kron(np.eye(4), np.ones(3))
    for delta in (1e-3, 0.05, 0.5):
        q, _info = trpo_step(pi, d, ev.A, delta)
        assert d @ kl_divergence(pi, q) == pytest.approx(delta, rel=1e-9)
        gain = d @ (q * ev.A).sum(-1)

        def neg(z):
            return -(d @ (z.reshape(4, 3) * ev.A).sum(-1))

        def kl_room(z, dl=delta):
            return dl - d @ kl_divergence(pi, z.reshape(4, 3))

        cons = [
            {"type": "eq", "fun": lambda z: rows @ z - 1, "jac": lambda z: rows},
            {"type": "ineq", "fun": kl_room, "jac": lambda z: (d[:, None] * pi).ravel() / z},
        ]
        res = minimize(
            neg,
            pi.ravel(),
            jac=lambda z: -(d[:, None] * ev.A).ravel(),
            method="SLSQP",
            bounds=[(1e-12, 1)] * 12,
            constraints=cons,
            options={"ftol": 1e-15, "maxiter": 200},
        )
        assert gain >= -res.fun - 1e-7


def test_large_delta_approaches_policy_iteration(rng):
    m = random_mdp(rng, 7, 3, 0.9)
    pi = _policy(rng, 7, 3)
    ev = evaluate(m, pi)
    d = (1 - m.gamma) * ev.rho
    greedy = greedy_policy(ev.Q)
    tv = [
        0.5 * np.abs(trpo_step(pi, d, ev.A, dl)[0] - greedy).sum(-1).max()
        for dl in (0.1, 1, 10, 50)
    ]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(tv))
    assert tv[-1] < 1e-6
    np.testing.assert_array_equal(trpo_step(pi, d, ev.A, np.inf)[0], greedy)


def test_policy_iteration_reaches_the_value_iteration_optimum():
    m = random_mdp(np.random.default_rng(9), 10, 3, 0.9, branching=3)
    V = np.zeros(10)
    for _ in range(2000):  # value iteration, independent of the linear solves
        V = (m.R + m.gamma * m.P @ V).max(-1)
    J_star, _pi_star = optimal_return(m)
    assert J_star == pytest.approx(m.mu0 @ V, rel=1e-10)
    pi0 = np.full((10, 3), 1 / 3)
    assert run_updates(m, pi0, 15, method="pi").J[-1] == pytest.approx(J_star, rel=1e-12)
    tr = run_updates(m, pi0, 25, method="trpo", delta=0.1)
    assert (np.diff(tr.J) >= -1e-12).all() and tr.J[-1] > 0.99 * J_star


def test_trpo_runs_past_underflow_to_the_optimum():
    """Long runs make dominated actions underflow to exactly 0; the update stays exact on the
    support (and puts mass back outside it when an unsupported action becomes best)."""
    m = chain_mdp(8, 0.95)
    tr = run_updates(m, np.full((8, 2), 0.5), 30, method="trpo", delta=0.05)
    assert (np.diff(tr.J) >= -1e-12).all()
    assert tr.J[-1] == pytest.approx(optimal_return(m)[0], rel=1e-9)
