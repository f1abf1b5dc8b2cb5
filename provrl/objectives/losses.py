"""Policy losses: PPO clip ∘ correction, loss aggregation, KL penalty — NaN-safe.

The per-token loss is (see :mod:`provrl.objectives.corrections` for r_t, c_t, M_t)

.. math::

    \\ell_t = -c_t\\,\\min\\big(r_t A_t,\\ \\operatorname{clip}(r_t, 1-\\epsilon_{low},
    1+\\epsilon_{high})\\,A_t\\big) \\;+\\; \\beta\\,\\widehat{KL}_t(\\pi_\\theta\\|\\pi_{ref})
    \\;-\\; c_H\\,H(\\pi_\\theta(\\cdot|h_t))

(with dual clip, :func:`dual_clip`, the min is further bounded below by c·A_t where
A_t < 0; the entropy bonus c_H is off by default) and the batch loss is a weighted sum L = Σ_{b,t} ω_{bt} ℓ_{bt} with token weights ω from
:func:`loss_token_weights`. Computing ω once for a whole minibatch and summing
micro-batch losses gives exactly the minibatch loss (gradient accumulation is exact).

Safety: ratios are exponentials of clamped log differences; tokens whose inputs are NaN or
±inf are counted and removed from the mask *before* any arithmetic, so neither the loss nor
the gradient ever sees them.

Exactness at the edges: for the *sequence-level* corrections (:data:`SEQUENCE_CORRECTIONS`:
seq_tis, seq_mis, geo_mask, gspo) a token cannot simply leave the product. If one action
token of a trajectory has π = 0 (log π = −inf) then w(τ) = Π_t ρ_t = 0 exactly; q = 0 or a
NaN makes w(τ) undefined. Dropping only that token would weight the trajectory by the
product of the *other* ratios (a weight sum of 2e where the exact one is 0). So such a
trajectory is masked whole (policy and KL terms) — it contributes exactly 0, which is its
exact weight when π = 0 — and counted in ``num_seq_dropped``; its finite tokens count as
masked. Token-level corrections keep dropping only the offending token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from provrl.objectives.config import LossAggregation, ObjectiveConfig
from provrl.objectives.corrections import correct
from provrl.objectives.kl import kl_estimate

SEQUENCE_CORRECTIONS = ("seq_tis", "seq_mis", "geo_mask", "gspo")
"""Corrections whose weight or ratio is a product (or mean) over the whole trajectory."""


def loss_token_weights(
    mask: torch.Tensor, mode: LossAggregation, *, norm_tokens: int | None = None
) -> torch.Tensor:
    """Token weights ω ``[B, T]`` (0 off the mask) of the three aggregations.

    .. math::

        \\text{token\\_mean:}\\quad \\omega_{bt} = \\frac{m_{bt}}{\\sum_{b',t'} m_{b't'}}
        \\qquad
        \\text{seq\\_mean\\_token\\_mean:}\\quad \\omega_{bt} = \\frac{m_{bt}}{N_{seq}\\,|\\tau_b|}
        \\qquad
        \\text{seq\\_sum\\_norm:}\\quad \\omega_{bt} = \\frac{m_{bt}}{B\\,L}

    N_seq counts rows with at least one action token; L = ``norm_tokens`` is the Dr. GRPO
    constant normaliser (it does not depend on the sampled lengths, so long and short
    answers get the same per-token weight — no length bias)."""
    m = mask.to(torch.float32)
    if mode == "token_mean":
        return m / m.sum().clamp_min(1.0)
    if mode == "seq_mean_token_mean":
        per_seq = m.sum(-1, keepdim=True)
        n_seq = (per_seq > 0).sum().clamp_min(1)
        return m / per_seq.clamp_min(1.0) / n_seq
    if mode == "seq_sum_norm":
        if norm_tokens is None or norm_tokens <= 0:
            raise ValueError("seq_sum_norm aggregation needs a positive norm_tokens (L)")
        return m / (mask.shape[0] * norm_tokens)
    raise ValueError(f"unknown aggregation {mode!r}")


def aggregate(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """L = Σ ω_{bt} ℓ_{bt}, where entries with ω = 0 are ignored even if NaN/inf."""
    keep = weights != 0
    return torch.where(keep, values, torch.zeros_like(values)).mul(weights).sum()


def aggregate_loss(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation,
    *,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """``aggregate(values, loss_token_weights(mask, mode))`` for a whole batch at once."""
    return aggregate(values, loss_token_weights(mask, mode, norm_tokens=norm_tokens))


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float | None,
    eps_high: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate (Schulman et al. 2017) and where the clip is active.

    .. math:: o_t = \\min\\big(r_t A_t,\\ \\operatorname{clip}(r_t, 1-\\epsilon_{low},
              1+\\epsilon_{high})\\,A_t\\big)

    ``None`` for an ε removes that side of the clip. The second tensor marks tokens whose
    gradient the clip zeroes (r_t > 1+ε_high with A_t > 0, or r_t < 1−ε_low with A_t < 0)."""
    unclipped = ratio * advantages
    if eps_low is None and eps_high is None:
        return unclipped, torch.zeros_like(ratio, dtype=torch.bool)
    lo = None if eps_low is None else 1.0 - eps_low
    hi = None if eps_high is None else 1.0 + eps_high
    clipped = ratio.clamp(min=lo, max=hi) * advantages
    return torch.minimum(unclipped, clipped), clipped.detach() < unclipped.detach()


def dual_clip(
    surrogate: torch.Tensor, advantages: torch.Tensor, c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al. 2020): for A_t < 0 the pessimistic surrogate is bounded
    below by c·A_t, c > 1, so a token whose ratio exploded cannot dominate the loss.

        o_t^dual = max(o_t, c·A_t)  if A_t < 0,   o_t otherwise

    Returns the surrogate and where the bound is active (those tokens get no gradient)."""
    bound = c * advantages
    active = (advantages < 0) & (surrogate.detach() < bound.detach())
    return torch.where(active, bound, surrogate), active


def entropy_bonus(entropy: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """H̄ = Σ ω_{bt} H_t: the entropy of π_θ(·|h_t) aggregated with the loss's token weights
    (the loss subtracts c_H · H̄, so gradient descent raises the entropy)."""
    return aggregate(entropy, weights)


@dataclass
class LossOutput:
    """The differentiable loss and what went into it (counts are over action tokens)."""

    loss: torch.Tensor
    """Scalar Σ ω ℓ: policy term + β · KL term − c_H · entropy term."""
    pg_loss: float
    """Policy-gradient part of ``loss``."""
    kl_loss: float
    """KL part of ``loss`` before multiplying by β (0 when the penalty is off)."""
    num_tokens: int
    """Action tokens in the input mask."""
    num_nonfinite: int
    """Action tokens dropped because an input (logp, logprox, logq, A, ref) was NaN/inf."""
    num_masked: int
    """Finite action tokens the correction dropped (its M_t = 0, or their trajectory was
    dropped whole)."""
    num_seq_dropped: int
    """Trajectories a sequence-level correction dropped whole because one of their action
    tokens had π = 0, q = 0 or a NaN (module docstring); 0 for token-level corrections."""
    num_clipped: int
    """Kept tokens whose gradient the PPO clip zeroed."""
    weight_sum: float
    """Σ c_t over kept tokens (mean weight = weight_sum / kept)."""
    weight_max: float
    """max c_t over kept tokens."""
    entropy: float = 0.0
    """H̄ of the entropy bonus before multiplying by c_H (0 when the bonus is off)."""


def finite_mask(mask: torch.Tensor, *tensors: torch.Tensor | None) -> torch.Tensor:
    """``mask`` with every token removed where one of ``tensors`` is NaN or ±inf."""
    keep = mask.clone()
    for t in tensors:
        if t is not None:
            keep &= torch.isfinite(t.detach())
    return keep


def policy_loss(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_weights: torch.Tensor,
    cfg: ObjectiveConfig,
    *,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """The full per-token loss of the module docstring, aggregated with ``token_weights``.

    ``advantages`` is per token ``[B, T]`` (a trajectory's A broadcast over its actions).
    ``logp_ref`` (log π_ref, detached) is needed when ``cfg.kl_coef > 0``; ``entropy``
    (H(π_θ(·|h_t)) with grad) when ``cfg.entropy_coef > 0``."""
    if cfg.kl_coef > 0 and logp_ref is None:
        raise ValueError("kl_coef > 0 needs logp_ref (reference-policy logprobs)")
    finite = finite_mask(mask, logp, logprox, logq, advantages)
    usable = finite_mask(finite, logp_ref if cfg.kl_coef > 0 else None)  # every input finite
    dropped = torch.zeros(mask.shape[:-1], dtype=torch.bool, device=mask.device)
    if cfg.correction in SEQUENCE_CORRECTIONS:
        # a zero-probability or NaN token makes w(τ) 0 or undefined: the whole row goes
        dropped = (mask & ~finite).any(-1)
    ok = usable & ~dropped[..., None]
    zeros = torch.zeros_like(logp)
    # Sanitise before any arithmetic: where() with a NaN in the unselected branch would
    # still poison the gradient of exp(), so the NaNs must never reach it.
    logp_s = torch.where(ok, logp, zeros)
    logprox_s = torch.where(ok, logprox.detach(), zeros)
    logq_s = torch.where(ok, logq.detach(), zeros)
    adv_s = torch.where(ok, advantages.detach(), zeros)

    corr = correct(
        cfg.correction,
        logp_s,
        logprox_s,
        logq_s,
        ok,
        cap=cfg.is_cap,
        low=cfg.mask_low,
        high=cfg.mask_high,
        clamp=cfg.log_ratio_clamp,
    )
    surrogate, clipped = clipped_surrogate(corr.ratio, adv_s, cfg.clip_eps_low, cfg.clip_eps_high)
    if cfg.dual_clip is not None:
        surrogate, dual = dual_clip(surrogate, adv_s, cfg.dual_clip)
        clipped = clipped | dual
    pg = aggregate(-corr.weight * surrogate, torch.where(corr.mask, token_weights, 0.0))
    loss = pg
    ent_val = 0.0
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy of π_θ (with grad)")
        ent_ok = ok & torch.isfinite(entropy.detach())
        h = entropy_bonus(
            torch.where(ent_ok, entropy, zeros), torch.where(ent_ok, token_weights, 0.0)
        )
        loss = loss - cfg.entropy_coef * h
        ent_val = float(h.detach())
    kl_val = 0.0
    if cfg.kl_coef > 0:
        assert logp_ref is not None
        ref_s = torch.where(ok, logp_ref.detach(), zeros)
        kl_t = kl_estimate(logp_s, ref_s, cfg.kl_estimator, log_ratio_clamp=cfg.log_ratio_clamp)
        kl = aggregate(kl_t, torch.where(ok, token_weights, 0.0))
        loss = loss + cfg.kl_coef * kl
        kl_val = float(kl.detach())
    kept_w = corr.weight.detach()[corr.mask]
    return LossOutput(
        loss=loss,
        pg_loss=float(pg.detach()),
        kl_loss=kl_val,
        num_tokens=int(mask.sum()),
        num_nonfinite=int((mask & ~usable).sum()),
        num_masked=int((usable & ~corr.mask).sum()),  # corr.mask ⊆ ok: dropped rows count
        num_seq_dropped=int(dropped.sum()),
        num_clipped=int((clipped & corr.mask).sum()),
        weight_sum=float(kept_w.sum()),
        weight_max=float(kept_w.max()) if kept_w.numel() else 0.0,
        entropy=ent_val,
    )
