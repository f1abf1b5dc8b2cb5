"""Running observation normalisation: ŝ = clip((s − μ) / √(σ² + ε), −c, c).

μ and σ² are the mean and variance of every observation seen so far, merged batch by batch
with Chan et al.'s parallel update (exact, not an exponential average): for a stored
(μ_a, σ²_a, n_a) and a new batch (μ_b, σ²_b, n_b), with Δ = μ_b − μ_a and n = n_a + n_b::

    μ  = μ_a + Δ n_b / n
    σ² = (σ²_a n_a + σ²_b n_b + Δ² n_a n_b / n) / n

The trainer freezes the statistics during a rollout and updates them after the policy
step, so the observations the update sees are exactly the ones the policy acted on.
"""

from __future__ import annotations

import numpy as np


class RunningMeanStd:
    """Mean and variance of a stream of vectors, and the normaliser built from them."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        self.mean = np.zeros(dim, dtype=np.float64)
        self.var = np.ones(dim, dtype=np.float64)
        self.count = 0.0
        self.clip = clip
        self.eps = eps

    def update(self, batch: np.ndarray) -> None:
        """Merge a batch ``[..., dim]`` into the statistics (Chan's parallel formula)."""
        x = np.asarray(batch, dtype=np.float64).reshape(-1, self.mean.shape[0])
        n_b = x.shape[0]
        if n_b == 0:
            return
        mean_b, var_b = x.mean(0), x.var(0)
        if self.count == 0:
            self.mean, self.var, self.count = mean_b, var_b, float(n_b)
            return
        n_a = self.count
        n = n_a + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * n_b / n
        self.var = (self.var * n_a + var_b * n_b + delta**2 * n_a * n_b / n) / n
        self.count = n

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """ŝ = clip((x − μ) / √(σ² + ε), −clip, clip) as float32."""
        z = (x - self.mean) / np.sqrt(self.var + self.eps)
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, list[float] | float]:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": self.count}
