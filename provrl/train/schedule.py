"""Learning-rate schedules shared by the SFT and RL trainers (a pure function)."""

from __future__ import annotations

import math


def lr_at(
    step: int, total_steps: int, lr: float, warmup_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Learning rate of optimizer step ``step`` (0-based) out of S = ``total_steps``, with
    η = ``lr``, W = ``warmup_steps``, r = ``min_lr_ratio``:

    * warmup, s < W:  η_s = η · (s + 1) / W
    * then, with p = (s − W) / max(1, S − W − 1) clipped to [0, 1]:
      cosine η_s = η · [r + (1 − r) · ½ (1 + cos π p)];  linear η_s = η · [1 − (1 − r) p];
      constant η_s = η.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    p = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps - 1)))
    if schedule == "cosine":
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))
    if schedule == "linear":
        return lr * (1 - (1 - min_lr_ratio) * p)
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")
