r"""What a way of obtaining the behaviour probability costs, against the exact recorded q.

Issue 34's attribution table. All tensors are ``[B, T]`` (one row per trajectory, padded)
with ``mask`` the action tokens:

* ``logp``   — log π_θ(a_t|h_t), the target policy (the trainer's, at the update);
* ``logq``   — log q_{v_t}(a_t|h_t), the exact recorded behaviour probability;
* ``logb``   — log b(a_t|h_t), what a method uses in its place: π_{v_start} recomputed
  (one version per rollout), π_{v_t} recomputed per token on a fresh KV, or log π_θ
  itself (treated as on-policy).

With ρ_t = π_θ/b and ρ*_t = π_θ/q the per-token ratios, the errors of the log-weights are

.. math::

    e_t = \log ρ_t − \log ρ^*_t = \log q_{v_t}(a_t|h_t) − \log b(a_t|h_t)

    E(τ) = \log w_b(τ) − \log w(τ) = Σ_{t∈τ} e_t

and the table reports, for the method, mean and max |e_t| over action tokens, mean and
max |E(τ)| over trajectories, the Kish ESS fraction of its trajectory weights w_b(τ)
(:func:`provrl.objectives.diagnostics.effective_sample_size`), and the share of its
weights a cap C would clip: tokens with ρ_t > C (per-token truncation, ``tis``) and
trajectories with w_b(τ) > C (``seq_tis``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from provrl.objectives.corrections import sequence_log_weight
from provrl.objectives.diagnostics import effective_sample_size


def log_weight_errors(
    logq: torch.Tensor, logb: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_t = log q − log b on action tokens [N], E(τ) = Σ_t e_t per row [B]), float64.
    A token where both are −inf has e_t = 0; where only one is, e_t = ±inf."""
    q, b = logq.double(), logb.double()
    same = (q == b) | (torch.isinf(q) & torch.isinf(b) & (q.sign() == b.sign()))
    e = torch.where(same, torch.zeros_like(q), q - b)
    return e[mask], torch.where(mask, e, torch.zeros_like(e)).sum(-1)


def clip_share(log_w: torch.Tensor, cap: float) -> float:
    """The share of the weights exp(``log_w``) above ``cap``: what min(w, C) would change."""
    if log_w.numel() == 0:
        return 0.0
    return float((log_w.double() > math.log(cap)).double().mean())


def attribution_row(
    logp: torch.Tensor,
    logq: torch.Tensor,
    logb: torch.Tensor,
    mask: torch.Tensor,
    cap: float = 2.0,
) -> dict[str, Any]:
    """One row of the table for the method whose behaviour log-probabilities are ``logb``
    (module docstring; tensors ``[B, T]``)."""
    e_tok, e_traj = log_weight_errors(logq, logb, mask)
    log_rho = (logp.double() - logb.double())[mask]
    log_w = sequence_log_weight(logp, logb, mask)
    ess = effective_sample_size(log_w)
    a_tok, a_traj = e_tok.abs(), e_traj.abs()
    return {
        "tokens": int(mask.sum()),
        "trajectories": int(logp.shape[0]),
        "token_abs_err_mean": float(a_tok.mean()) if a_tok.numel() else 0.0,
        "token_abs_err_max": float(a_tok.max()) if a_tok.numel() else 0.0,
        "traj_abs_err_mean": float(a_traj.mean()) if a_traj.numel() else 0.0,
        "traj_abs_err_max": float(a_traj.max()) if a_traj.numel() else 0.0,
        "ess_frac": ess["ess_frac"],
        "clip_share_token": clip_share(log_rho, cap),
        "clip_share_traj": clip_share(log_w, cap),
        "cap": cap,
    }
