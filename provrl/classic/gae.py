"""Generalised advantage estimation, GAE(γ, λ) (Schulman et al. 2016).

For a rollout of T steps from N parallel environments (arrays shaped ``[T, N]``)::

    δ_t = r_t + γ (1 − term_t) V(s'_t) − V(s_t)
    Â_t = δ_t + γ λ (1 − done_t) Â_{t+1},          Â_T = 0
    R̂_t = Â_t + V(s_t)                              (the value-function target)

where s'_t is the true next state of step t (the final observation when the episode ended
at t), ``term_t`` marks a true terminal state (no bootstrap: V = 0 beyond it) and
``done_t = term_t or trunc_t`` cuts the recursion at any episode boundary. A time-limit
truncation therefore still bootstraps from V(s'_t), as it must for an infinite-horizon
task cut by a time limit.
"""

from __future__ import annotations

import numpy as np

Array = np.ndarray


def gae(
    rewards: Array,
    values: Array,
    next_values: Array,
    terminated: Array,
    done: Array,
    gamma: float,
    lam: float,
) -> tuple[Array, Array]:
    """GAE advantages Â and λ-returns R̂ = Â + V, both ``[T, N]`` float32 (see module doc)."""
    shape = rewards.shape
    for name, a in (("values", values), ("next_values", next_values)):
        if a.shape != shape:
            raise ValueError(f"gae: {name} has shape {a.shape}, rewards {shape}")
    not_term = 1.0 - terminated.astype(np.float32)
    not_done = 1.0 - done.astype(np.float32)
    deltas = rewards + gamma * not_term * next_values - values
    adv = np.zeros(shape, dtype=np.float32)
    last = np.zeros(shape[1:], dtype=np.float32)
    for t in range(shape[0] - 1, -1, -1):
        last = deltas[t] + gamma * lam * not_done[t] * last
        adv[t] = last
    return adv, (adv + values).astype(np.float32)


def discounted_returns(rewards: Array, done: Array, gamma: float) -> Array:
    """G_t = r_t + γ (1 − done_t) G_{t+1} with G_T = 0 (a reference for GAE with λ = 1, V = 0)."""
    out = np.zeros(rewards.shape, dtype=np.float64)
    g = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in range(rewards.shape[0] - 1, -1, -1):
        g = rewards[t] + gamma * (1.0 - done[t]) * g
        out[t] = g
    return out
