"""Trust-region diagnostics: is this batch still close enough to π_θ for the surrogate to
predict improvement? (TRPO, Schulman et al. 2015: |J(π') − L_π(π')| ≤ 4εγ/(1−γ)² · α²,
α = max_s D_TV(π(·|s), π'(·|s)).)

All functions are pure and take ``[B, T]`` tensors with the notation of
:mod:`provrl.objectives.corrections` (logp = log π_θ at the proximal point, logq = recorded
behaviour logprob, mask = action tokens). Each returns plain floats for the metrics sink.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from provrl.objectives.corrections import sequence_log_weight
from provrl.objectives.kl import kl_estimate

RATIO_QUANTILES = (0.01, 0.1, 0.5, 0.9, 0.99)


def _finite(mask: torch.Tensor, *xs: torch.Tensor) -> torch.Tensor:
    keep = mask.clone()
    for x in xs:
        keep &= torch.isfinite(x)
    return keep


def behaviour_kl(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per-token KL(q‖π_θ) estimated from the tokens q sampled.

    .. math:: \\widehat{KL}_t = k(\\log q_{v_t}(a_t|h_t), \\log\\pi_\\theta(a_t|h_t))

    with k1 (unbiased, can be negative) and k3 (unbiased, ≥ 0). Reported: mean k1 and k3
    over action tokens, the max per-token k3, and the max over trajectories of the
    per-trajectory mean k3 (the worst *sequence*)."""
    m = _finite(mask, logp, logq)
    if not m.any():
        return {"kl_q_pi_k1": 0.0, "kl_q_pi_k3": 0.0, "kl_q_pi_k3_max": 0.0, "kl_q_pi_seq_max": 0.0}
    lp, lq = logp.double(), logq.double()
    k1 = kl_estimate(lq, lp, "k1")[m]
    k3_full = torch.where(m, kl_estimate(lq, lp, "k3"), 0.0)
    k3 = k3_full[m]
    n = m.sum(-1)
    seq = k3_full.sum(-1)[n > 0] / n[n > 0]
    return {
        "kl_q_pi_k1": float(k1.mean()),
        "kl_q_pi_k3": float(k3.mean()),
        "kl_q_pi_k3_max": float(k3.max()),
        "kl_q_pi_seq_max": float(seq.max()),
    }


def tv_estimate(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Total-variation distance between q and π_θ, estimated from q's samples.

    .. math:: \\widehat{D}_{TV} = \\tfrac12\\,\\mathbb{E}_{a\\sim q}\\,|1 - \\pi_\\theta(a)/q(a)|
              = \\tfrac12 \\sum_{a \\in supp\\,q} |q(a) - \\pi_\\theta(a)|

    This misses the π_θ mass outside q's support (add :func:`support_excluded_mass` for
    the full TV). ``tv_max`` is the largest per-trajectory mean (α is a max over states)."""
    m = _finite(mask, logp, logq)
    if not m.any():
        return {"tv": 0.0, "tv_seq_max": 0.0}
    d = torch.where(
        m, 0.5 * (torch.exp((logp.double() - logq.double()).clamp(-50, 50)) - 1).abs(), 0
    )
    n = m.sum(-1)
    seq = d.sum(-1)[n > 0] / n[n > 0]
    return {"tv": float(d[m].mean()), "tv_seq_max": float(seq.max())}


def ratio_quantiles(
    logp: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    qs: Sequence[float] = RATIO_QUANTILES,
) -> dict[str, float]:
    """Quantiles (and min / max) of the per-token behaviour ratio ρ_t = π_θ/q_{v_t} over
    action tokens. A healthy near-on-policy batch has all of them close to 1."""
    m = _finite(mask, logp, logq)
    if not m.any():
        return {}
    rho = torch.exp((logp.double() - logq.double())[m].clamp(-50, 50))
    qv = torch.quantile(rho, torch.tensor(list(qs), dtype=torch.float64, device=rho.device))
    out = {f"ratio_q{round(q * 100):02d}": float(v) for q, v in zip(qs, qv, strict=True)}
    out["ratio_min"] = float(rho.min())
    out["ratio_max"] = float(rho.max())
    return out


def effective_sample_size(log_w: torch.Tensor) -> dict[str, float]:
    """Kish effective sample size of the trajectory weights w(τ_i), from log w in log space.

    .. math:: ESS = \\frac{(\\sum_i w_i)^2}{\\sum_i w_i^2}
              = \\exp\\big(2\\,\\mathrm{LSE}(\\log w) - \\mathrm{LSE}(2\\log w)\\big)

    ``ess_frac`` = ESS/N ∈ [0, 1]: 1 when all weights are equal, 1/N when one trajectory
    carries the whole batch. log w = −inf is a weight of exactly 0: it counts in N (and
    in ``num_w_zero``) and adds nothing to either sum. NaN or +inf log w (an undefined
    weight) is left out and counted in ``num_w_undefined`` — never silently. Also
    reported: mean and spread (max − min) of the finite log w."""
    lw = log_w.double()
    zero = lw == -torch.inf
    undefined = torch.isnan(lw) | (lw == torch.inf)
    fin = lw[~zero & ~undefined]
    n = int((~undefined).sum())
    counts = {"num_w_zero": float(zero.sum()), "num_w_undefined": float(undefined.sum())}
    if fin.numel() == 0:
        return {"ess": 0.0, "ess_frac": 0.0, "log_w_mean": 0.0, "log_w_range": 0.0, **counts}
    ess = torch.exp(2 * torch.logsumexp(fin, 0) - torch.logsumexp(2 * fin, 0))
    return {
        "ess": float(ess),
        "ess_frac": float(ess) / n,
        "log_w_mean": float(fin.mean()),
        "log_w_range": float(fin.max() - fin.min()),
        **counts,
    }


def exact_sequence_log_weight(
    logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log w(τ) per row ``[B]`` with the edges exact: −inf when an action token has
    π = 0 (log π = −inf, q > 0) — the product is 0 — and NaN when a token's weight is
    undefined (NaN anywhere, q = 0, or log π = +inf). Otherwise
    :func:`~provrl.objectives.corrections.sequence_log_weight` over the action tokens."""
    lp, lq = logp.double(), logq.double()
    m = _finite(mask, lp, lq)
    lw = sequence_log_weight(lp, lq, m)
    zero = (mask & (lp == -torch.inf) & torch.isfinite(lq)).any(-1)
    undefined = (mask & ~m & ~((lp == -torch.inf) & torch.isfinite(lq))).any(-1)
    lw = torch.where(zero, -torch.inf, lw)
    return torch.where(undefined, torch.nan, lw)


def trajectory_ess(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """:func:`effective_sample_size` of w(τ) = Π_t π_θ/q_{v_t} for each row of the batch
    (:func:`exact_sequence_log_weight`: a row with a π = 0 token has w = 0, one with an
    undefined token is counted, not weighted by its other tokens)."""
    return effective_sample_size(exact_sequence_log_weight(logp, logq, mask))


def truncation_stats(kept_mass: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How often the sampler truncated the behaviour distribution (top-k / top-p).

    ``truncated_frac`` = fraction of action tokens with kept_mass < 1; ``q_excluded_mass``
    = mean (1 − kept_mass): the behaviour model's own mass the sampler cut off. Both are
    over the tokens whose kept mass is known; ``kept_mass_unknown_frac`` = fraction of
    action tokens whose engine could not know it (NaN, e.g. vLLM with top-k / top-p)."""
    km = kept_mass[mask].double()
    known = km[~torch.isnan(km)]
    unknown = float(1 - known.numel() / km.numel()) if km.numel() else 0.0
    if known.numel() == 0:
        return {"truncated_frac": 0.0, "q_excluded_mass": 0.0, "kept_mass_unknown_frac": unknown}
    return {
        "truncated_frac": float((known < 1).double().mean()),
        "q_excluded_mass": float((1 - known).mean()),
        "kept_mass_unknown_frac": unknown,
    }


def support_excluded_mass(
    logits: torch.Tensor,
    top_p: torch.Tensor | float = 1.0,
    top_k: torch.Tensor | int = 0,
    temperature: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """Mass of p = softmax(logits/τ) on the tokens a top-k/top-p sampler would exclude.

    Over the vocabulary sorted by probability, p_(1) ≥ p_(2) ≥ …, the sampler keeps

    .. math::

        K = \\{ j : j \\le k \\ \\text{and}\\ \\textstyle\\sum_{i<j} p_{(i)} < P\\cdot
            \\sum_{i \\le k} p_{(i)} \\}

    (top-k first, then the smallest prefix of the renormalised top-k distribution whose
    mass reaches P = top_p; k = 0 means no top-k) and the result is Σ_{j∉K} p_(j)
    (exactly 0 when nothing is excluded).
    ``logits`` is ``[..., V]``; ``top_p`` / ``top_k`` / ``temperature`` broadcast against
    ``logits[..., 0]``. With the logits of π_θ and the behaviour's sampling parameters
    this is π_θ's mass outside the behaviour support — exact when the sampling version's
    logits equal π_θ's, an estimate otherwise. Importance sampling cannot correct for this
    mass: E_q[w f] = E_π[f · 1{τ ⊆ supp q}]."""
    lead = logits.shape[:-1]
    V = logits.shape[-1]
    dev = logits.device
    tp = torch.as_tensor(top_p, dtype=torch.float64, device=dev).expand(lead).reshape(-1)
    tk = torch.as_tensor(top_k, dtype=torch.int64, device=dev).expand(lead).reshape(-1)
    temp = torch.as_tensor(temperature, dtype=torch.float64, device=dev).expand(lead)
    temp = torch.where(temp > 0, temp, 1.0).reshape(-1)
    out = torch.zeros(tp.shape, dtype=torch.float64, device=dev)
    # Only rows whose sampler truncates are sorted: with top_p ≥ 1 and no top-k the kept
    # set is the whole vocabulary and the mass is exactly 0 (a float64 sort of a 256-row
    # chunk of SmolLM2's vocabulary takes seconds on one thread; a batch that mixed
    # truncated and untruncated rows sorted every row).
    cut = (tp < 1) | ((tk > 0) & (tk < V))
    if not bool(cut.any()):
        return out.reshape(lead)
    z, tp, tk, temp = logits.reshape(-1, V)[cut], tp[cut], tk[cut], temp[cut]
    p = torch.softmax(z.double() / temp[:, None], dim=-1)
    ps, _ = torch.sort(p, dim=-1, descending=True)
    k = torch.where((tk > 0) & (tk < V), tk, V)
    rank = torch.arange(V, device=dev).expand_as(ps)
    in_k = rank < k[:, None]
    topk_mass = torch.where(in_k, ps, 0.0).sum(-1, keepdim=True)
    before = torch.cumsum(torch.where(in_k, ps, 0.0), dim=-1) - torch.where(in_k, ps, 0.0)
    keep = in_k & (before < tp[:, None] * topk_mass)
    keep[:, 0] = True
    out[cut] = torch.where(keep, 0.0, ps).sum(-1)
    return out.reshape(lead)


def version_lag_histogram(
    versions: torch.Tensor, mask: torch.Tensor, current_version: int
) -> dict[int, int]:
    """Counts of lag = current_version − v_t over action tokens, as ``{lag: count}``."""
    lag = current_version - versions[mask]
    if lag.numel() == 0:
        return {}
    values, counts = torch.unique(lag, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def lag_summary(hist: dict[int, int], max_listed: int = 4) -> dict[str, float]:
    """Scalars from a lag histogram: mean, max, and the fraction of action tokens at lag
    0, 1, …, ``max_listed`` − 1 and ≥ ``max_listed``."""
    total = sum(hist.values())
    if total == 0:
        return {}
    out = {
        "lag_mean": sum(k * c for k, c in hist.items()) / total,
        "lag_max": float(max(hist)),
    }
    for lag in range(max_listed):
        out[f"lag_frac_{lag}"] = hist.get(lag, 0) / total
    out[f"lag_frac_ge{max_listed}"] = sum(c for k, c in hist.items() if k >= max_listed) / total
    return out


def nonfinite_count(mask: torch.Tensor, **tensors: torch.Tensor) -> dict[str, float]:
    """Number of action tokens where each named tensor is NaN or ±inf."""
    return {
        f"nonfinite_{name}": float((mask & ~torch.isfinite(t)).sum()) for name, t in tensors.items()
    }
