"""Exact policy updates on tabular MDPs: TRPO's Algorithm 1 (minorise–maximise), the practical
average-KL trust region with step size δ, and policy iteration (δ → ∞).

All three maximise the surrogate over the policy simplex at every state; they differ only in
how the step is limited. With ``p = π(·|s)`` and a score vector ``b ∈ R^A``, the per-state
problem

    max_{q ∈ Δ_A}  ⟨q, b⟩ − λ·D_KL(p ‖ q)                                   (KL-tilt)

is concave, and its KKT conditions give the unique solution in closed form up to one scalar:

    q_a = λ p_a / (ν − b_a),   ν > max_a b_a,   Σ_a q_a = 1.

Writing ν = max b + Δ·x with the spread Δ = max b − min b > 0 and the normalised gaps
g_a = (max b − b_a)/Δ ∈ [0, 1], the solution family is q_a(x) ∝ p_a/(x + g_a), x ∈ (0, ∞), with

    λ(x) = Δ / Z(x),  Z(x) = Σ_a p_a/(x + g_a),   D_KL(p ‖ q(x)) = Σ_a p_a log(Z(x)(x + g_a)),

λ(x) increasing and D_KL(x) decreasing in x (x → ∞: q → p; x → 0: q → greedy). Every solver below
finds x per state by vectorised bisection in log x, then one scalar by Brent's method. Actions
with p_a = 0 are handled exactly by :class:`Tilt` (they cost no KL; see its docstring).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import numpy as np
from scipy.optimize import brentq

from provrl.theory.exact import (
    evaluate,
    greedy_policy,
    kl_divergence,
    mean_advantage,
    penalty_coefficient,
    tv_distance,
)
from provrl.theory.mdp import TabularMDP, chain_mdp, gridworld_mdp, random_mdp

LOG_X_LO, LOG_X_HI = -500.0, 60.0  # x ∈ [e^-500, e^60]: q from ~greedy to ~p
BISECT_ITERS = 64  # (60 + 500)/2^64 < 4e-17 in log x
T_MAX = 50.0  # largest per-state KL Algorithm 1 may choose (q_a down to ~e^-50 p_a)


def _log1p_minus_x(y: np.ndarray) -> np.ndarray:
    """log(1 + y) − y without cancellation for small |y| (Taylor series, Horner, below 1e-3)."""
    small = np.abs(y) < 1e-3
    ys = np.where(small, y, 0.0)
    series = ys * ys * (-1 / 2 + ys * (1 / 3 + ys * (-1 / 4 + ys * (1 / 5 + ys * (-1 / 6)))))
    yl = np.where(small, 0.0, y)
    return np.where(small, series, np.log1p(yl) - yl)


@dataclass(frozen=True)
class Tilt:
    """The per-state solution family of (KL-tilt) for scores ``b[s, a]`` and a policy ``p``.

    On the support of p: q_a(x) = p_a / (x_eff + g_a) / Z(x), λ(x) = Δ/Z(x), with
    g_a = (M − b_a)/Δ, M = max_{a: p_a>0} b_a, x_eff = max(x, x_esc). Actions outside the support
    cost no KL (0·log 0 = 0): if the best of them scores b_o > M, the KKT point has ν = max(ν*, b_o),
    i.e. x_esc = (b_o − M)/Δ, and the leftover mass 1 − Z(x_eff)/Z(x) goes to that action.
    ``Δ = max(M, b_o) − min_{support} b``; states with Δ = 0 cannot improve: q = p."""

    p: np.ndarray  # [S, A]
    g: np.ndarray  # [S, A] normalised gaps on the support, 0 elsewhere
    spread: np.ndarray  # [S] Δ
    active: np.ndarray  # [S] bool: Δ > 0
    x_esc: np.ndarray  # [S] escape threshold (0: no better action outside the support)
    esc_action: np.ndarray  # [S] best action outside the support

    @staticmethod
    def of(p: np.ndarray, b: np.ndarray) -> Tilt:
        supp = p > 0
        M = np.where(supp, b, -np.inf).max(-1)
        low = np.where(supp, b, np.inf).min(-1)
        outside = np.where(supp, -np.inf, b)
        b_out = outside.max(-1)
        spread = np.maximum(M, b_out) - low
        scale = np.abs(b).max(-1)
        active = spread > 1e-14 * np.maximum(scale, np.finfo(np.float64).tiny)
        safe = np.where(active, spread, 1.0)
        g = np.where(active[:, None] & supp, (M[:, None] - b) / safe[:, None], 0.0)
        escape = active & (b_out > M)
        x_esc = np.where(escape, (b_out - M) / safe, 0.0)
        return Tilt(
            p=p, g=g, spread=spread, active=active, x_esc=x_esc, esc_action=outside.argmax(-1)
        )

    def Z(self, x: np.ndarray) -> np.ndarray:
        """Z(x) = Σ_a p_a/(x + g_a)."""
        return (self.p / (x[:, None] + self.g)).sum(-1)

    def policy(self, x: np.ndarray) -> np.ndarray:
        """q(x) on the support, the escape mass on ``esc_action``; q = p on inactive states."""
        escaping = x < self.x_esc
        x_eff = np.maximum(x, self.x_esc)
        w = self.p / (np.where(escaping, x_eff, x)[:, None] + self.g)
        q = w / np.where(escaping, self.Z(x), w.sum(-1))[:, None]
        leftover = np.where(escaping, np.maximum(1.0 - q.sum(-1), 0.0), 0.0)
        q[np.arange(q.shape[0]), self.esc_action] += leftover
        return np.where(self.active[:, None], q, self.p)

    def multiplier(self, x: np.ndarray) -> np.ndarray:
        """λ(x) = Δ/Z(x), the KL price at which q(x) solves (KL-tilt); 0 on inactive states."""
        return np.where(self.active, self.spread / self.Z(x), 0.0)

    def kl(self, x: np.ndarray) -> np.ndarray:
        """D_KL(p ‖ q(x)) = Σ_a p_a log1p(y_a), y_a = Z(x)(x_eff + g_a) − 1. Near q = p (no
        escape, all |y_a| < 0.1) it is evaluated as Σ p (log1p(y) − y) + Σ p y with
        Σ_a p_a y_a = Σ_b p_b (ḡ − g_b)²/((x + ḡ)(x + g_b)) ≥ 0, ḡ = Σ p g, so tiny KLs
        (down to ~1e-30) keep full relative precision (no cancellation)."""
        xc = x[:, None]
        Z = self.Z(x)[:, None]
        x_eff = np.maximum(x, self.x_esc)[:, None]
        y = Z * (x_eff + self.g) - 1.0
        near = (np.abs(y).max(-1) < 0.1) & (x >= self.x_esc)
        yn = np.where(near[:, None], y, 0.0)
        g_bar = (self.p * self.g).sum(-1, keepdims=True)
        xn = np.where(near[:, None], xc, 1.0)  # the near branch only; avoids 0/0 at x → 0
        num = self.p * (g_bar - self.g) ** 2
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_y = np.where(num > 0, num / ((xn + g_bar) * (xn + self.g)), 0.0).sum(-1)
        kl_near = (self.p * _log1p_minus_x(yn)).sum(-1) + mean_y
        kl_far = (self.p * np.log1p(np.where(near[:, None], 0.0, y))).sum(-1)
        kl = np.where(near, kl_near, kl_far)
        return np.where(self.active, np.maximum(kl, 0.0), 0.0)

    def solve_x(self, fn: str, target: np.ndarray) -> np.ndarray:
        """Per-state x with ``fn(x) = target``, ``fn`` ∈ {"kl", "Z"} (both decreasing in x),
        by vectorised bisection in log x on [e^-500, e^60] (clipped to the ends)."""
        S = self.p.shape[0]
        lo, hi = np.full(S, LOG_X_LO), np.full(S, LOG_X_HI)
        f = self.kl if fn == "kl" else self.Z
        for _ in range(BISECT_ITERS):
            mid = 0.5 * (lo + hi)
            too_big = f(np.exp(mid)) > target  # decreasing in x: go right
            lo = np.where(too_big, mid, lo)
            hi = np.where(too_big, hi, mid)
        return np.exp(0.5 * (lo + hi))


@dataclass(frozen=True)
class StepInfo:
    """What one exact update chose: the per-state KL level ``t`` (Algorithm 1) or the KL price
    ``lam`` (average-KL TRPO), and the resulting D_KL^max / average KL."""

    t: float
    lam: float
    kl_max: float
    kl_mean: float


def mm_step(
    pi: np.ndarray, rho: np.ndarray, A: np.ndarray, C: float
) -> tuple[np.ndarray, StepInfo]:
    """Algorithm 1: π' = argmax_π' L_π(π') − C·D_KL^max(π, π'), exactly.

    L is linear in π' and D_KL^max is a max of convex functions, so the problem is concave but
    not separable. Epigraph form: maximise Σ_s ρ(s)⟨π'_s, A_s⟩ − C·t s.t. D_KL(π_s‖π'_s) ≤ t.
    KKT: each state solves (KL-tilt) with b = ρ(s)A_s and its own price μ_s, every state with
    Δ_s > 0 sits on its constraint D_KL(π_s‖π'_s) = t, and Σ_s μ_s = C. So for a trial t the
    states are independent (bisection on x_s so that D_KL_s(x_s) = t, then μ_s = λ_s(x_s)),
    and Σ_s μ_s(t) decreases in t: one Brent root finds t*. States unreachable from μ₀
    (ρ(s) = 0) keep π' = π."""
    tilt = Tilt.of(pi, rho[:, None] * A)
    if not tilt.active.any() or C <= 0:
        return pi.copy(), StepInfo(t=0.0, lam=float(C), kl_max=0.0, kl_mean=0.0)

    @cache  # brentq evaluates the end points again, checked below
    def excess(log_t: float) -> float:  # log Σ_s μ_s(t) − log C, decreasing in t
        t = np.full(pi.shape[0], np.exp(log_t))
        mu = tilt.multiplier(tilt.solve_x("kl", t))
        return float(np.log(mu.sum()) - np.log(C))

    lo, hi = np.log(1e-300), np.log(T_MAX)
    if excess(hi) >= 0:
        log_t = hi
    elif excess(lo) <= 0:
        log_t = lo
    else:
        log_t = brentq(excess, lo, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps, maxiter=200)
    t = float(np.exp(log_t))
    q = tilt.policy(tilt.solve_x("kl", np.full(pi.shape[0], t)))
    kl = kl_divergence(pi, q)
    d = rho / rho.sum()  # = (1 − γ)ρ_π, the state distribution of the average KL
    return q, StepInfo(t=t, lam=float(C), kl_max=float(kl.max()), kl_mean=float(d @ kl))


def trpo_step(
    pi: np.ndarray, d: np.ndarray, A: np.ndarray, delta: float
) -> tuple[np.ndarray, StepInfo]:
    """Practical TRPO, solved exactly in policy space (no CG / line search needed in a table):

        max_π' Σ_s d(s) Σ_a π'(a|s) A_π(s, a)   s.t.   Σ_s d(s) D_KL(π_s ‖ π'_s) ≤ δ,

    with d = (1−γ)ρ_π. One multiplier β for the single constraint; d(s) cancels between the
    objective and the constraint, so every state solves (KL-tilt) with b = A_s and the same
    price λ = β: x_s solves Δ_s/Z_s(x_s) = β. The average KL decreases in β; Brent finds
    Σ_s d(s) D_KL_s = δ. ``delta = inf`` is policy iteration (the greedy policy)."""
    if np.isinf(delta):
        return greedy_policy(A), StepInfo(t=np.inf, lam=0.0, kl_max=np.inf, kl_mean=np.inf)
    if delta <= 0:
        raise ValueError(f"trpo_step: delta must be > 0, got {delta}")
    tilt = Tilt.of(pi, A)
    if not tilt.active.any():
        return pi.copy(), StepInfo(t=0.0, lam=np.inf, kl_max=0.0, kl_mean=0.0)
    ref = float(tilt.spread.max())

    def q_of(log_lam: float) -> np.ndarray:
        lam = ref * np.exp(log_lam)
        target = np.where(tilt.active, tilt.spread / lam, 1.0)
        return tilt.policy(tilt.solve_x("Z", target))

    @cache  # brentq evaluates the end points again, checked below
    def excess(log_lam: float) -> float:  # log avg-KL − log δ, decreasing in λ
        kl = float(d @ kl_divergence(pi, q_of(log_lam)))
        return np.log(max(kl, 1e-300)) - np.log(delta)

    lo, hi = -450.0, 50.0
    if excess(lo) <= 0:
        log_lam = lo  # even the ~greedy step stays inside the trust region
    elif excess(hi) >= 0:
        log_lam = hi
    else:
        log_lam = brentq(excess, lo, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps, maxiter=200)
    q = q_of(log_lam)
    kl = kl_divergence(pi, q)
    return q, StepInfo(
        t=float(kl.max()),
        lam=ref * float(np.exp(log_lam)),
        kl_max=float(kl.max()),
        kl_mean=float(d @ kl),
    )


def mm_objective(
    pi: np.ndarray, pi_new: np.ndarray, J: float, rho: np.ndarray, A: np.ndarray, C: float
) -> float:
    """M_π(π') = L_π(π') − C·D_KL^max(π, π') (the minoriser: J(π') ≥ M_π(π'), J(π) = M_π(π))."""
    L = J + float(rho @ mean_advantage(A, pi_new, pi))
    return L - C * float(kl_divergence(pi, pi_new).max())


@dataclass
class Trace:
    """J and step statistics per iteration (index 0 = the initial policy)."""

    method: str
    J: list[float] = field(default_factory=list)
    kl_max: list[float] = field(default_factory=list)
    kl_mean: list[float] = field(default_factory=list)
    alpha: list[float] = field(default_factory=list)
    lower_bound: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def run_updates(
    mdp: TabularMDP,
    pi0: np.ndarray,
    iters: int,
    *,
    method: str,
    delta: float = np.inf,
    c_scale: float = 1.0,
) -> Trace:
    """Iterate one update rule from ``pi0`` for ``iters`` steps.

    ``method="mm"``: Algorithm 1 with penalty ``c_scale·C`` (the guarantee needs c_scale ≥ ½:
    by Pinsker D_TV² ≤ ½ D_KL, so C/2 already minorises); ``"trpo"``: average-KL step δ;
    ``"pi"``: policy iteration. ``lower_bound[i]`` is M_{π_{i−1}}(π_i) (Algorithm 1 only)."""
    if method not in ("mm", "trpo", "pi"):
        raise ValueError(f"run_updates: method must be mm, trpo or pi, got {method!r}")
    pi = np.asarray(pi0, dtype=np.float64)
    name = {"mm": f"MM (C×{c_scale:g})", "trpo": f"TRPO δ={delta:g}", "pi": "policy iteration"}
    trace = Trace(method=name[method])
    ev = evaluate(mdp, pi)
    trace.J.append(float(ev.J))
    for _ in range(iters):
        eps = float(np.abs(ev.A).max())
        if method == "mm":
            C = c_scale * float(penalty_coefficient(eps, mdp.gamma))
            new, info = mm_step(pi, ev.rho, ev.A, C)
            trace.lower_bound.append(mm_objective(pi, new, float(ev.J), ev.rho, ev.A, C))
        else:  # policy iteration is the δ → ∞ step
            step = delta if method == "trpo" else np.inf
            new, info = trpo_step(pi, (1.0 - mdp.gamma) * ev.rho, ev.A, step)
        trace.alpha.append(float(tv_distance(pi, new).max()))
        trace.kl_max.append(info.kl_max)
        trace.kl_mean.append(info.kl_mean)
        pi = new
        ev = evaluate(mdp, pi)
        trace.J.append(float(ev.J))
    return trace


def optimal_return(mdp: TabularMDP, max_iters: int = 1000) -> tuple[float, np.ndarray]:
    """J* and an optimal deterministic policy by policy iteration to a fixed point."""
    pi = np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions)
    ev = evaluate(mdp, pi)
    for _ in range(max_iters):
        new = greedy_policy(ev.Q)
        # keep the current action where it is already greedy (avoids tie cycling)
        keep = ev.Q[np.arange(mdp.n_states), pi.argmax(-1)] >= ev.Q.max(-1) - 1e-12
        new = np.where(keep[:, None] & (pi.max(-1, keepdims=True) == 1.0), pi, new)
        if np.array_equal(new, pi):
            break
        pi = new
        ev = evaluate(mdp, pi)
    return float(ev.J), pi


def make_mdp(kind: str, states: int, actions: int, gamma: float, seed: int) -> TabularMDP:
    """The MDP of ``provrl theory mm``: gridworld (√states × √states), chain, random (dense)
    or random_sparse (2 successors per (s, a), sparse rewards, single start)."""
    rng = np.random.default_rng(seed)
    if kind == "gridworld":
        side = max(2, round(float(np.sqrt(states))))
        return gridworld_mdp(side, side, gamma)
    if kind == "chain":
        return chain_mdp(states, gamma)
    if kind == "random":
        return random_mdp(rng, states, actions, gamma)
    if kind == "random_sparse":
        return random_mdp(rng, states, actions, gamma, branching=2, reward="sparse", start="single")
    raise ValueError(f"mdp must be gridworld, chain, random or random_sparse, got {kind!r}")


def mm_report(
    mdp: TabularMDP,
    iters: int,
    deltas: list[float],
    c_scales: list[float],
) -> tuple[dict[str, Any], list[Trace], float]:
    """Run Algorithm 1 (each c_scale), average-KL TRPO (each δ) and policy iteration from the
    uniform policy; report J curves, whether J ever decreased, and the final gap to J*."""
    pi0 = np.full((mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions)
    J_star, _ = optimal_return(mdp)
    runs: list[Trace] = [run_updates(mdp, pi0, iters, method="mm", c_scale=c) for c in c_scales]
    runs += [run_updates(mdp, pi0, iters, method="trpo", delta=d) for d in deltas]
    runs.append(run_updates(mdp, pi0, iters, method="pi"))
    summary = {
        "mdp": mdp.name,
        "states": mdp.n_states,
        "actions": mdp.n_actions,
        "gamma": mdp.gamma,
        "J_star": J_star,
        "J_initial": runs[0].J[0],
        "runs": [
            {
                "method": r.method,
                "J_final": r.J[-1],
                "gap_to_optimum": J_star - r.J[-1],
                "min_improvement": float(np.min(np.diff(r.J))),
                "monotone": bool(np.all(np.diff(r.J) >= -1e-10 * max(1.0, abs(J_star)))),
                **r.as_dict(),
            }
            for r in runs
        ],
    }
    return summary, runs, J_star
