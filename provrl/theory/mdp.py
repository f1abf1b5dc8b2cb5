"""Finite discounted MDPs ``(S, A, P, r, γ, μ₀)`` and the generators the theory lab uses.

Arrays, not objects: ``P[s, a, s'] = Pr(s_{t+1}=s' | s_t=s, a_t=a)``, ``R[s, a] = E[r_t | s, a]``,
``mu0[s] = Pr(s_0 = s)``. Every generator is vectorised (no Python loop over states) and takes
a ``numpy.random.Generator`` so results are reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROW_TOL = 1e-9


@dataclass(frozen=True)
class TabularMDP:
    """A finite MDP with expected rewards ``R[s, a]`` and discount ``0 < γ < 1``."""

    P: np.ndarray
    R: np.ndarray
    gamma: float
    mu0: np.ndarray
    name: str = "mdp"
    info: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        P, R, mu0 = (np.asarray(x, dtype=np.float64) for x in (self.P, self.R, self.mu0))
        object.__setattr__(self, "P", P)
        object.__setattr__(self, "R", R)
        object.__setattr__(self, "mu0", mu0)
        where = f"TabularMDP {self.name!r}"
        if P.ndim != 3 or P.shape[0] != P.shape[2]:
            raise ValueError(f"{where}: field P must have shape [S, A, S], got {P.shape}")
        S, A, _ = P.shape
        if R.shape != (S, A):
            raise ValueError(f"{where}: field R must have shape [S, A] = {(S, A)}, got {R.shape}")
        if mu0.shape != (S,):
            raise ValueError(f"{where}: field mu0 must have shape [S] = {(S,)}, got {mu0.shape}")
        if not 0.0 < float(self.gamma) < 1.0:
            raise ValueError(f"{where}: field gamma must lie in (0, 1), got {self.gamma}")
        for name, arr in (("P", P), ("R", R), ("mu0", mu0)):
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{where}: field {name} has non-finite entries")
        if P.min() < 0 or mu0.min() < 0:
            raise ValueError(f"{where}: fields P and mu0 must be non-negative")
        row_err = np.abs(P.sum(-1) - 1.0)
        if row_err.max() > ROW_TOL:
            s, a = np.unravel_index(int(row_err.argmax()), row_err.shape)
            raise ValueError(
                f"{where}: field P[{s}, {a}, :] sums to {P[s, a].sum():.12g}, expected 1"
            )
        if abs(mu0.sum() - 1.0) > ROW_TOL:
            raise ValueError(f"{where}: field mu0 sums to {mu0.sum():.12g}, expected 1")

    @property
    def n_states(self) -> int:
        return int(self.P.shape[0])

    @property
    def n_actions(self) -> int:
        return int(self.P.shape[1])


def _dirichlet(
    rng: np.random.Generator, shape: tuple[int, ...], concentration: float
) -> np.ndarray:
    """Independent Dirichlet(concentration·1) vectors along the last axis."""
    g = rng.gamma(concentration, size=shape)
    g = np.maximum(g, np.finfo(np.float64).tiny)
    return g / g.sum(-1, keepdims=True)


def random_mdp(
    rng: np.random.Generator,
    n_states: int,
    n_actions: int,
    gamma: float,
    *,
    branching: int | None = None,
    reward: str = "dense",
    start: str = "dirichlet",
    concentration: float = 1.0,
) -> TabularMDP:
    """A random MDP.

    - ``branching=None``: dense transitions ``P[s, a] ~ Dirichlet(concentration·1_S)``;
      ``branching=b``: each ``(s, a)`` reaches ``b`` distinct random states (sparse).
    - ``reward="dense"``: ``R[s, a] ~ U(0, 1)``; ``"sparse"``: ``R ∈ {0, 1}`` with about 10%
      of pairs rewarded (at least one); ``"signed"``: ``R ~ U(-1, 1)``.
    - ``start="dirichlet"``: ``μ₀ ~ Dirichlet(1)``; ``"single"``: ``μ₀ = e_0``.
    """
    S, A = int(n_states), int(n_actions)
    if S < 1 or A < 1:
        raise ValueError(f"random_mdp: n_states and n_actions must be ≥ 1, got {S}, {A}")
    if branching is None or branching >= S:
        P = _dirichlet(rng, (S, A, S), concentration)
    else:
        if branching < 1:
            raise ValueError(f"random_mdp: branching must be ≥ 1, got {branching}")
        targets = rng.random((S, A, S)).argsort(-1)[..., :branching]
        P = np.zeros((S, A, S))
        np.put_along_axis(P, targets, _dirichlet(rng, (S, A, branching), concentration), -1)
    if reward == "dense":
        R = rng.random((S, A))
    elif reward == "signed":
        R = rng.uniform(-1.0, 1.0, (S, A))
    elif reward == "sparse":
        R = (rng.random((S, A)) < 0.1).astype(np.float64)
        R.flat[rng.integers(S * A)] = 1.0
    else:
        raise ValueError(f"random_mdp: reward must be dense, sparse or signed, got {reward!r}")
    if start == "dirichlet":
        mu0 = _dirichlet(rng, (S,), 1.0)
    elif start == "single":
        mu0 = np.eye(S)[0]
    else:
        raise ValueError(f"random_mdp: start must be dirichlet or single, got {start!r}")
    kind = "dense" if branching is None or branching >= S else f"sparse{branching}"
    return TabularMDP(
        P,
        R,
        gamma,
        mu0,
        name=f"random-{kind}-{reward}-S{S}A{A}",
        info={"family": f"random_{kind.rstrip('0123456789')}", "reward": reward},
    )


def chain_mdp(n_states: int, gamma: float, *, p_forward: float = 0.6) -> TabularMDP:
    """RiverSwim-style chain: action 0 = "left" (always succeeds), action 1 = "right" (moves
    right with ``p_forward``, stays with ``(1 − p_forward)/2 + …``, drifts left otherwise).
    Small reward 0.005 for "left" at state 0, reward 1 for "right" at the last state; start in
    state 0. The myopic policy (always left) is far from optimal — a classic exploration trap."""
    S = int(n_states)
    if S < 2:
        raise ValueError(f"chain_mdp: n_states must be ≥ 2, got {S}")
    if not 0.0 < p_forward <= 1.0:
        raise ValueError(f"chain_mdp: p_forward must lie in (0, 1], got {p_forward}")
    s = np.arange(S)
    left, right = np.maximum(s - 1, 0), np.minimum(s + 1, S - 1)
    P = np.zeros((S, 2, S))
    P[s, 0, left] = 1.0
    p_back = (1.0 - p_forward) / 2.0
    one = np.ones(S, dtype=np.int64)
    np.add.at(P, (s, one, right), p_forward)
    np.add.at(P, (s, one, s), 1.0 - p_forward - p_back)
    np.add.at(P, (s, one, left), p_back)
    R = np.zeros((S, 2))
    R[0, 0] = 0.005
    R[S - 1, 1] = 1.0
    return TabularMDP(
        P, R, gamma, np.eye(S)[0], name=f"chain-S{S}", info={"family": "chain", "reward": "sparse"}
    )


GRID_MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])  # up, down, left, right


def gridworld_mdp(width: int, height: int, gamma: float, *, slip: float = 0.1) -> TabularMDP:
    """Gridworld with 4 moves (up, down, left, right). With probability ``slip`` the move is
    replaced by a uniformly random one; moves into the border leave the agent in place. Any
    action in the goal cell (bottom-right) pays 1 and teleports to the start (top-left); the
    cell left of the goal is a pit that pays −1 and teleports to the start too."""
    W, H = int(width), int(height)
    if W * H < 3:
        raise ValueError(f"gridworld_mdp: need at least 3 cells, got {W}x{H}")
    if not 0.0 <= slip <= 1.0:
        raise ValueError(f"gridworld_mdp: slip must lie in [0, 1], got {slip}")
    S, A = W * H, 4
    rows, cols = np.divmod(np.arange(S), W)
    nr = np.clip(rows[:, None] + GRID_MOVES[None, :, 0], 0, H - 1)
    nc = np.clip(cols[:, None] + GRID_MOVES[None, :, 1], 0, W - 1)
    dest = nr * W + nc  # [S, 4]: where each intended move lands
    # Pr(actual move m | intended a) = (1 − slip)·[m = a] + slip/4
    move_prob = (1.0 - slip) * np.eye(A) + slip / A  # [a, m]
    P = np.zeros((S, A, S))
    s_idx = np.repeat(np.arange(S), A * A)
    a_idx = np.tile(np.repeat(np.arange(A), A), S)
    m_idx = np.tile(np.arange(A), S * A)
    np.add.at(P, (s_idx, a_idx, dest[s_idx, m_idx]), move_prob[a_idx, m_idx])
    goal, pit, start = S - 1, S - 2, 0
    R = np.zeros((S, A))
    P[goal] = 0.0
    P[goal, :, start] = 1.0
    R[goal] = 1.0
    P[pit] = 0.0
    P[pit, :, start] = 1.0
    R[pit] = -1.0
    return TabularMDP(
        P,
        R,
        gamma,
        np.eye(S)[start],
        name=f"grid-{W}x{H}",
        info={"family": "gridworld", "reward": "sparse"},
    )
