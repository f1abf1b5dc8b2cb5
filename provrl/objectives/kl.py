"""Per-token KL estimators from one sample (Schulman, "Approximating KL divergence", 2020).

For tokens a ~ p and another policy p', with the log ratio ℓ = log p'(a) − log p(a):

==========  =========================  ===========================================
estimator   value                      property
==========  =========================  ===========================================
k1          −ℓ                         unbiased for KL(p‖p'), high variance, can be < 0
k2          ½ ℓ²                       biased (second order), low variance, ≥ 0
k3          (e^ℓ − 1) − ℓ              unbiased for KL(p‖p'), low variance, ≥ 0
==========  =========================  ===========================================

The same three functions serve the reference-policy penalty (p = π_θ, p' = π_ref) and the
behaviour diagnostics (p = q, p' = π_θ: an estimate of KL(q‖π_θ) from tokens sampled by q).
"""

from __future__ import annotations

import torch

from provrl.objectives.config import KLEstimator


def kl_estimate(
    logp_sampler: torch.Tensor,
    logp_other: torch.Tensor,
    kind: KLEstimator = "k3",
    *,
    log_ratio_clamp: float = 20.0,
) -> torch.Tensor:
    """Per-token estimate of KL(p‖p') from tokens sampled by p, elementwise.

    .. math::

        \\ell = \\operatorname{clamp}(\\log p'(a) - \\log p(a), \\pm c),\\quad
        k_1 = -\\ell,\\quad k_2 = \\tfrac12 \\ell^2,\\quad k_3 = e^{\\ell} - 1 - \\ell

    ``logp_sampler`` is log p(a) (the policy that produced a), ``logp_other`` is log p'(a).
    The exponent is clamped to ±``log_ratio_clamp`` so k3 never overflows. Callers mask
    non-action tokens themselves.
    """
    ell = (logp_other - logp_sampler).clamp(-log_ratio_clamp, log_ratio_clamp)
    if kind == "k1":
        return -ell
    if kind == "k2":
        return 0.5 * ell.square()
    if kind == "k3":
        return torch.expm1(ell) - ell
    raise ValueError(f"unknown KL estimator {kind!r}: expected k1, k2 or k3")
