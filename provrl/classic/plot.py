"""Learning-curve PNG: mean return of the episodes finished in each iteration vs env steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_learning_curve(
    steps: list[int],
    returns: list[float],
    path: str | Path,
    title: str,
    eval_return: float | None = None,
    smooth: int = 5,
) -> Path:
    """Write the curve (raw and a ``smooth``-iteration moving average) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    x, y = np.asarray(steps), np.asarray(returns, dtype=float)
    ax.plot(x, y, color="tab:blue", alpha=0.3, lw=1, label="episodes ended in iteration")
    if len(y) >= smooth > 1:
        kernel = np.ones(smooth) / smooth
        ax.plot(x[smooth - 1 :], np.convolve(y, kernel, mode="valid"), color="tab:blue", lw=2)
    if eval_return is not None:
        ax.axhline(eval_return, color="tab:green", ls="--", label="final deterministic eval")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
