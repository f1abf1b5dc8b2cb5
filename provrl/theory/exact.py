"""Exact TRPO quantities on a tabular MDP, by linear solves (Schulman et al. 2015, §2–3, App. A).

Every function is pure and vectorised: a policy is an array ``pi[..., s, a] = π(a|s)`` with any
leading batch shape (many policies of one MDP are evaluated in one batched solve). Notation:

    P_π[s, s'] = Σ_a π(a|s) P(s'|s, a)            r_π[s] = Σ_a π(a|s) r(s, a)
    V_π = (I − γ P_π)⁻¹ r_π                        Q_π(s, a) = r(s, a) + γ Σ_s' P(s'|s, a) V_π(s')
    A_π = Q_π − V_π                                ρ_π = μ₀ᵀ (I − γ P_π)⁻¹   (Σ_s ρ_π(s) = 1/(1−γ))
    J(π) = μ₀ᵀ V_π = ρ_πᵀ r_π                      Ā(s) = Σ_a π'(a|s) A_π(s, a)
    J(π') − J(π) = Σ_s ρ_π'(s) Ā(s)                L_π(π') = J(π) + Σ_s ρ_π(s) Ā(s)
    α = max_s D_TV(π(·|s), π'(·|s))                ε = max_{s,a} |A_π(s, a)|
    |J(π') − L_π(π')| ≤ 4εγα² / ((1−γ)(1−γ(1−α))) ≤ 4εγα² / (1−γ)²
    J(π') ≥ L_π(π') − C·D_KL^max(π, π'),   C = 4εγ/(1−γ)²
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from provrl.theory.mdp import TabularMDP

Floats = float | np.ndarray  # a scalar or an array of any batch shape


def _check_policy(mdp: TabularMDP, pi: np.ndarray, name: str = "pi") -> np.ndarray:
    pi = np.asarray(pi, dtype=np.float64)
    if pi.shape[-2:] != (mdp.n_states, mdp.n_actions):
        raise ValueError(
            f"policy {name}: shape must end in [S, A] = {(mdp.n_states, mdp.n_actions)}, "
            f"got {pi.shape}"
        )
    if pi.size and (pi.min() < 0 or np.abs(pi.sum(-1) - 1.0).max() > 1e-9):
        raise ValueError(f"policy {name}: rows must be probability vectors (≥ 0, sum 1)")
    return pi


def policy_transition(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """P_π[..., s, s'] = Σ_a π(a|s) P(s'|s, a)."""
    return np.einsum("...sa,sat->...st", pi, mdp.P)


def policy_reward(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """r_π[..., s] = Σ_a π(a|s) r(s, a)."""
    return np.einsum("...sa,sa->...s", pi, mdp.R)


def _resolvent_system(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """I − γ P_π, batched."""
    return np.eye(mdp.n_states) - mdp.gamma * policy_transition(mdp, pi)


def _solve_columns(a: np.ndarray, *b: np.ndarray) -> list[np.ndarray]:
    """Batched ``a x_i = b_i`` for vectors ``b_i[..., n]``, one factorisation of ``a`` for all
    right-hand sides (NumPy ≥ 2 needs them as explicit columns)."""
    cols = np.stack([np.broadcast_to(v, a.shape[:-1]) for v in b], -1)
    x = np.linalg.solve(a, cols)
    return [x[..., i] for i in range(len(b))]


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched ``a x = b`` for vectors ``b[..., n]``."""
    return _solve_columns(a, b)[0]


def state_values(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """V_π = (I − γ P_π)⁻¹ r_π (Bellman expectation equation, solved exactly)."""
    pi = _check_policy(mdp, pi)
    return _solve(_resolvent_system(mdp, pi), policy_reward(mdp, pi))


def action_values(mdp: TabularMDP, V: np.ndarray) -> np.ndarray:
    """Q(s, a) = r(s, a) + γ Σ_s' P(s'|s, a) V(s')."""
    return mdp.R + mdp.gamma * np.einsum("sat,...t->...sa", mdp.P, V)


def occupancy(mdp: TabularMDP, pi: np.ndarray) -> np.ndarray:
    """Unnormalised discounted occupancy ρ_π(s) = Σ_t γ^t Pr_π(s_t = s):
    ρ_πᵀ (I − γ P_π) = μ₀ᵀ, so ρ_π solves (I − γ P_π)ᵀ ρ = μ₀."""
    pi = _check_policy(mdp, pi)
    return _solve(np.swapaxes(_resolvent_system(mdp, pi), -1, -2), mdp.mu0)


def expected_return(mdp: TabularMDP, V: np.ndarray) -> np.ndarray:
    """J(π) = Σ_s μ₀(s) V_π(s)."""
    return np.einsum("s,...s->...", mdp.mu0, V)


def mean_advantage(A: np.ndarray, pi_new: np.ndarray, pi: np.ndarray | None = None) -> np.ndarray:
    """Ā(s) = E_{a∼π'(·|s)} A_π(s, a). Given ``pi`` (the policy A belongs to), it is evaluated
    as Σ_a (π'(a|s) − π(a|s)) A_π(s, a) — equal because E_{a∼π} A_π(s, a) = 0 — which keeps
    full relative precision when π' is close to π."""
    diff = pi_new if pi is None else pi_new - pi
    return np.einsum("...sa,...sa->...s", diff, A)


def tv_distance(pi: np.ndarray, pi_new: np.ndarray) -> np.ndarray:
    """D_TV(π(·|s), π'(·|s)) = ½ Σ_a |π(a|s) − π'(a|s)|, per state."""
    return 0.5 * np.abs(pi - pi_new).sum(-1)


def kl_divergence(pi: np.ndarray, pi_new: np.ndarray) -> np.ndarray:
    """D_KL(π(·|s) ‖ π'(·|s)) = Σ_a π log(π/π'), per state (0 log 0 = 0; +∞ off π' support)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pi > 0, pi * (np.log(pi) - np.log(pi_new)), 0.0)
    return terms.sum(-1)


def tv_bound_tight(epsilon: Floats, gamma: float, alpha: Floats) -> np.ndarray:
    """App. A coupling bound: |J(π') − L_π(π')| ≤ Σ_t γ^t·4εα(1 − (1−α)^t)
    = 4εγα² / ((1−γ)(1 − γ(1−α)))."""
    e, a = np.asarray(epsilon), np.asarray(alpha)
    return 4.0 * e * gamma * a**2 / ((1.0 - gamma) * (1.0 - gamma * (1.0 - a)))


def tv_bound_loose(epsilon: Floats, gamma: float, alpha: Floats) -> np.ndarray:
    """The looser form used in Theorem 1: 4εγα² / (1−γ)² (since 1 − γ(1−α) ≥ 1 − γ)."""
    return 4.0 * np.asarray(epsilon) * gamma * np.asarray(alpha) ** 2 / (1.0 - gamma) ** 2


def penalty_coefficient(epsilon: Floats, gamma: float) -> np.ndarray:
    """C = 4εγ / (1−γ)² of J(π') ≥ L_π(π') − C·D_KL^max(π, π')."""
    return 4.0 * np.asarray(epsilon) * gamma / (1.0 - gamma) ** 2


@dataclass(frozen=True)
class Evaluation:
    """Exact evaluation of a (batch of) policies: ``V[..., s]``, ``Q``/``A[..., s, a]``,
    ``rho[..., s]`` (unnormalised occupancy), ``J[...]``."""

    V: np.ndarray
    Q: np.ndarray
    A: np.ndarray
    rho: np.ndarray
    J: np.ndarray


def _evaluation(mdp: TabularMDP, pi: np.ndarray, M: np.ndarray, rho: np.ndarray) -> Evaluation:
    """The rest of :func:`evaluate` given M = I − γ P_π and ρ_π: V_π = M⁻¹ r_π, Q_π, A_π, J."""
    V = _solve(M, policy_reward(mdp, pi))
    Q = action_values(mdp, V)
    return Evaluation(V=V, Q=Q, A=Q - V[..., None], rho=rho, J=expected_return(mdp, V))


def evaluate(mdp: TabularMDP, pi: np.ndarray) -> Evaluation:
    """V_π, Q_π, A_π = Q_π − V_π, ρ_π and J(π) by two linear solves."""
    pi = _check_policy(mdp, pi)
    M = _resolvent_system(mdp, pi)
    return _evaluation(mdp, pi, M, _solve(np.swapaxes(M, -1, -2), mdp.mu0))


def _occupancy_difference_rhs(
    mdp: TabularMDP, pi: np.ndarray, pi_new: np.ndarray, rho_new: np.ndarray
) -> np.ndarray:
    """γ (P_π' − P_π)ᵀ ρ_π', with P_π' − P_π = Σ_a (π' − π) P."""
    dP = policy_transition(mdp, pi_new - pi)
    return mdp.gamma * np.einsum("...st,...s->...t", dP, rho_new)


def occupancy_difference(
    mdp: TabularMDP, pi: np.ndarray, pi_new: np.ndarray, rho_new: np.ndarray
) -> np.ndarray:
    """ρ_π' − ρ_π without cancellation: from ρ_π'ᵀ(I − γP_π') = μ₀ᵀ = ρ_πᵀ(I − γP_π),
    (I − γ P_π)ᵀ (ρ_π' − ρ_π) = γ (P_π' − P_π)ᵀ ρ_π', and P_π' − P_π = Σ_a (π' − π) P."""
    rhs = _occupancy_difference_rhs(mdp, pi, pi_new, rho_new)
    return _solve(np.swapaxes(_resolvent_system(mdp, pi), -1, -2), rhs)


@dataclass(frozen=True)
class PairReport:
    """Every quantity of Theorem 1 for policy pairs (π, π'), arrays over the batch shape.

    ``gap = J(π') − L_π(π') = Σ_s (ρ_π' − ρ_π)(s) Ā(s)`` is computed from the occupancy
    difference (no cancellation), so it is accurate even when it is ~1e-12 of J.
    ``tv_mean``/``kl_mean`` are the d_π-averages (d_π = (1−γ)ρ_π) that practical TRPO
    constrains; Theorem 1 needs the maxima ``alpha``/``kl_max``. ``q_max = max_{s,a} |Q_π|``
    sizes the round-off slack of the bound checks."""

    J_old: np.ndarray
    J_new: np.ndarray
    surrogate: np.ndarray
    identity_rhs: np.ndarray
    identity_error: np.ndarray
    gap: np.ndarray
    alpha: np.ndarray
    epsilon: np.ndarray
    kl_max: np.ndarray
    tv_mean: np.ndarray
    kl_mean: np.ndarray
    bound_tight: np.ndarray
    bound_loose: np.ndarray
    C: np.ndarray
    kl_lower_bound: np.ndarray
    q_max: np.ndarray


def compare(mdp: TabularMDP, pi: np.ndarray, pi_new: np.ndarray) -> PairReport:
    """Evaluate π and π' exactly and every term of the performance-difference identity
    J(π') − J(π) = Σ_s ρ_π'(s) Ā(s), the surrogate L_π(π') and both bounds."""
    pi = _check_policy(mdp, pi, "pi")
    pi_new = _check_policy(mdp, pi_new, "pi_new")
    pi, pi_new = np.broadcast_arrays(pi, pi_new)
    new = evaluate(mdp, pi_new)
    # ρ_π and ρ_π' − ρ_π solve the same system (I − γ P_π)ᵀ x = b: one factorisation
    M = _resolvent_system(mdp, pi)
    rho, d_rho = _solve_columns(
        np.swapaxes(M, -1, -2), mdp.mu0, _occupancy_difference_rhs(mdp, pi, pi_new, new.rho)
    )
    old = _evaluation(mdp, pi, M, rho)
    A_bar = mean_advantage(old.A, pi_new, pi)
    identity_rhs = np.einsum("...s,...s->...", new.rho, A_bar)
    surrogate = old.J + np.einsum("...s,...s->...", old.rho, A_bar)
    gap = np.einsum("...s,...s->...", d_rho, A_bar)
    tv, kl = tv_distance(pi, pi_new), kl_divergence(pi, pi_new)
    alpha = tv.max(-1)
    epsilon = np.abs(old.A).max(axis=(-2, -1))
    kl_max = kl.max(-1)
    C = penalty_coefficient(epsilon, mdp.gamma)
    d = (1.0 - mdp.gamma) * old.rho  # normalised state distribution d_π
    tv_mean = np.einsum("...s,...s->...", d, tv)
    kl_mean = np.einsum("...s,...s->...", d, kl)
    with np.errstate(invalid="ignore"):  # C = 0 (no advantage anywhere) and KL = ∞: no penalty
        kl_lower_bound = surrogate - np.where((kl_max > 0) & (C > 0), C * kl_max, 0.0)
    return PairReport(
        J_old=old.J,
        J_new=new.J,
        surrogate=surrogate,
        identity_rhs=identity_rhs,
        identity_error=np.abs((new.J - old.J) - identity_rhs),
        gap=gap,
        alpha=alpha,
        epsilon=epsilon,
        kl_max=kl_max,
        tv_mean=tv_mean,
        kl_mean=kl_mean,
        bound_tight=tv_bound_tight(epsilon, mdp.gamma, alpha),
        bound_loose=tv_bound_loose(epsilon, mdp.gamma, alpha),
        C=C,
        kl_lower_bound=kl_lower_bound,
        q_max=np.abs(old.Q).max(axis=(-2, -1)),
    )


def greedy_policy(Q: np.ndarray) -> np.ndarray:
    """Deterministic π(s) = argmax_a Q(s, a) (ties → lowest index), as one-hot rows."""
    return np.eye(Q.shape[-1])[Q.argmax(-1)]
