"""The AdamW both trainers step: torch's fused kernel wherever it runs.

``torch.optim.AdamW(fused=True)`` updates every parameter in one kernel per dtype and
device (CPU since torch 2.4, CUDA); on SmolLM2-135M on 2 CPU threads one step takes 0.06 s
against 0.45 s for the default per-parameter loop (docs/perf.md). The update rule is the
same (decoupled weight decay, bias correction)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.optim.AdamW:
    """AdamW over ``params``, fused when every parameter is a floating-point tensor on a
    device the fused kernel supports (CPU or CUDA), else torch's default implementation."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused or None
    )
