"""Advantages for outcome-rewarded groups of trajectories (one scalar per trajectory).

A *group* is the set of G trajectories sampled for one task (prompt); ``group_ids[i]`` names
the group of trajectory i. All functions take and return 1-D tensors of length N (one entry
per trajectory); the trainer broadcasts A_i to every action token of trajectory i.

Groups whose rewards are all equal carry no learning signal: every function here returns
*exactly* 0 for them (not ``(r − mean)/eps`` of float round-off), so they contribute exactly
zero gradient. :func:`zero_signal_fraction` reports how much of a batch they are.
"""

from __future__ import annotations

import torch


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group index g(i) ∈ {0..num_groups−1} for arbitrary integer ids."""
    if group_ids.ndim != 1:
        raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def _check(rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
    if rewards.ndim != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} "
            "must be 1-D of the same length"
        )
    if not torch.isfinite(rewards).all():
        i = int(torch.nonzero(~torch.isfinite(rewards))[0])
        raise ValueError(f"reward of trajectory {i} is not finite ({float(rewards[i])})")


def _group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per trajectory: group size G, group sum Σ_j r_j, group mean, and whether the group's
    rewards are all equal (max = min). Sums are accumulated in float64."""
    g, n_groups = _group_index(group_ids)
    r = rewards.double()
    size = r.new_zeros(n_groups).index_add_(0, g, torch.ones_like(r))
    total = r.new_zeros(n_groups).index_add_(0, g, r)
    hi = r.new_full((n_groups,), -torch.inf).scatter_reduce(0, g, r, reduce="amax")
    lo = r.new_full((n_groups,), torch.inf).scatter_reduce(0, g, r, reduce="amin")
    return size[g], total[g], (total / size)[g], (hi == lo)[g]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_normalise: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO group baseline (Shao et al. 2024), optionally without std scaling (Dr. GRPO).

    .. math::

        A_i = \\frac{r_i - \\bar r_{g(i)}}{s_{g(i)} + \\epsilon}   (std_normalise)
        \\qquad\\text{or}\\qquad A_i = r_i - \\bar r_{g(i)}        (Dr. GRPO, Liu et al. 2025)

    with :math:`\\bar r_g` the group mean and :math:`s_g` the unbiased sample standard
    deviation of group g. Groups with all-equal rewards (including groups of one) get
    :math:`A_i = 0` exactly. Dr. GRPO drops :math:`s_g` because dividing by it up-weights
    near-deterministic (too easy / too hard) groups.
    """
    _check(rewards, group_ids)
    size, _, mean, flat = _group_stats(rewards, group_ids)
    centred = rewards.double() - mean
    if std_normalise:
        g, n_groups = _group_index(group_ids)
        sq = centred.new_zeros(n_groups).index_add_(0, g, centred**2)
        std = (sq[g] / (size - 1).clamp_min(1)).sqrt()
        centred = centred / (std + eps)
    return torch.where(flat, 0.0, centred).to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024).

    .. math::

        A_i = r_i - \\frac{1}{G-1}\\sum_{j \\ne i,\\, g(j)=g(i)} r_j
            = \\frac{G}{G-1}\\,(r_i - \\bar r_{g(i)})

    The baseline excludes r_i, so it is independent of a_i and the estimator is unbiased.
    Groups of one, and groups with all-equal rewards, get :math:`A_i = 0`.
    """
    _check(rewards, group_ids)
    size, total, _, flat = _group_stats(rewards, group_ids)
    r = rewards.double()
    loo_mean = (total - r) / (size - 1).clamp_min(1)
    adv = torch.where((size < 2) | flat, 0.0, r - loo_mean)
    return adv.to(rewards.dtype)


def batch_normalise(
    advantages: torch.Tensor, *, center: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Batch-level normalisation over all N trajectories of the batch.

    .. math::

        A_i \\leftarrow \\frac{A_i - c}{s + \\epsilon},\\qquad
        c = \\bar A \\text{ if center else } 0,\\quad s = \\operatorname{std}(A)

    ``center=False`` (scale only) keeps zero-advantage trajectories at exactly zero, so
    zero-signal groups still give zero gradient; ``center=True`` is the REINFORCE++-style
    whitening. A batch whose advantages are all equal is returned centred but unscaled.
    """
    a = advantages.double()
    if a.numel() < 2:
        return advantages.clone()
    c = a.mean() if center else a.new_zeros(())
    s = a.std()
    if float(a.max() - a.min()) == 0.0:
        return (a - c).to(advantages.dtype)
    return ((a - c) / (s + eps)).to(advantages.dtype)


def zero_signal_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """Fraction of groups (and of trajectories) whose rewards are all equal.

    Such groups have zero advantage under every estimator here, so they cost rollout compute
    but contribute no gradient; a rising value means the task filter should re-probe.
    """
    _check(rewards, group_ids)
    g, n_groups = _group_index(group_ids)
    _, _, _, flat = _group_stats(rewards, group_ids)
    flat_groups = torch.zeros(n_groups, dtype=torch.bool, device=flat.device).index_put_((g,), flat)
    return {
        "zero_signal_group_frac": float(flat_groups.double().mean()) if n_groups else 0.0,
        "zero_signal_traj_frac": float(flat.double().mean()) if flat.numel() else 0.0,
        "num_groups": float(n_groups),
    }
