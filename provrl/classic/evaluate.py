"""Deterministic-policy evaluation on fresh, seeded environments.

One protocol for every agent (provrl's and the peers' in benchmarks/): ``episodes``
environments, environment i reset with seed ``seed + i``, each run for exactly one
episode with ``act(raw_observations) -> actions``; the result is the undiscounted return
of each episode.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

Act = Callable[[np.ndarray], np.ndarray]


def run_episodes(act: Act, env_id: str, episodes: int = 10, seed: int = 10_000) -> np.ndarray:
    """Undiscounted return of one episode in each of ``episodes`` seeded environments."""
    envs = gym.make_vec(env_id, num_envs=episodes, vectorization_mode="sync")
    try:
        obs, _ = envs.reset(seed=seed)  # environment i gets seed + i
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        while running.any():
            action = act(obs)
            if isinstance(envs.single_action_space, gym.spaces.Box):
                space = envs.single_action_space
                action = np.clip(action, space.low, space.high)
            obs, reward, term, trunc, _ = envs.step(action)
            returns += reward * running
            running &= ~(term | trunc)
        return returns
    finally:
        envs.close()


def mean_ci(
    x: np.ndarray | list[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``x`` with a bootstrap confidence interval.

    The interval is scipy's BCa bootstrap of the mean over the entries of ``x`` (one per
    training seed in benchmarks/): ``resamples`` resamples with replacement, fixed ``seed``.
    Identical entries give the degenerate interval (mean, mean)."""
    from scipy.stats import bootstrap

    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"mean_ci: need a 1-d sample of at least 2 values, got shape {a.shape}")
    m = float(a.mean())
    if np.ptp(a) == 0:
        return m, m, m
    res = bootstrap(
        (a,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="BCa",
        rng=np.random.default_rng(seed),
    )
    return m, float(res.confidence_interval.low), float(res.confidence_interval.high)
