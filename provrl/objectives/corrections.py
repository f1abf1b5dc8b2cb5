"""Importance ratios and off-policy corrections, one pure function each.

Notation (all tensors ``[B, T]``, one row per trajectory, one column per token):

* ``logp``    — log π_θ(a_t|h_t), differentiable (the policy being optimised);
* ``logprox`` — log π_prox(a_t|h_t), detached: the trainer's policy *before* this update
  (AReaL's proximal policy; PPO's "old" policy). On the first optimizer step of a batch
  π_prox = π_θ in value;
* ``logq``    — log q_{v_t}(a_t|h_t), the *recorded* behaviour logprob: the distribution
  the engine actually sampled token t from (version v_t, after temperature / top-k /
  top-p). Never recomputed — this is provrl's point;
* ``mask``    — action tokens (prompt, tool and padding tokens never enter a ratio).

Every correction returns a :class:`Correction` ``(ratio, weight, mask)`` and the policy
loss (:func:`provrl.objectives.losses.policy_loss`) is, per token,

.. math::

    \\ell_t = -\\,c_t \\, \\min\\big(r_t A_t,\\; \\operatorname{clip}(r_t, 1-\\epsilon_{low},
    1+\\epsilon_{high}) A_t\\big)  \\quad\\text{on tokens with } M_t = 1

so the PPO clip (acting on the differentiable ratio r_t) composes with every correction
(acting through the detached weight c_t and the mask M_t). With the per-token behaviour
ratio ρ_t = π_prox/q_{v_t} (detached) and the trajectory weight
w(τ) = Π_t ρ_t (computed as exp Σ_t log ρ_t):

==============  ==============================  =====================  ===================
correction      r_t (clipped, grad)             c_t (detached)         M_t
==============  ==============================  =====================  ===================
on_policy       π_θ/π_prox                      1                      1
token_is        π_θ/q                           1                      1
tis             π_θ/π_prox                      min(ρ_t, C)            1
icepop          π_θ/π_prox                      ρ_t                    α ≤ ρ_t ≤ β
seq_tis         π_θ/π_prox                      min(w(τ), C)           1
seq_mis         π_θ/π_prox                      w(τ)                   α ≤ w(τ) ≤ β
geo_mask        π_θ/π_prox                      1                      α ≤ ρ̄(τ) ≤ β
decoupled       π_θ/π_prox                      ρ_t                    ρ_t ≤ C
gspo            s(τ) = (π_θ(τ)/q(τ))^{1/|τ|}    1                      1
==============  ==============================  =====================  ===================

ρ̄(τ) = exp(mean_t log ρ_t) is the geometric-mean ratio. ``C = None`` disables truncation.
Ratios are always exponentials of clamped log differences; nothing here multiplies
probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from provrl.objectives.config import CorrectionName

CORRECTIONS: tuple[str, ...] = CorrectionName.__args__  # type: ignore[attr-defined]

DEFAULT_LOG_RATIO_CLAMP = 20.0
"""|log ratio| is clamped here before exponentiating: e^20 ≈ 5e8 never overflows float32."""


@dataclass(frozen=True)
class Correction:
    """What a correction contributes to the per-token loss (see the module docstring)."""

    ratio: torch.Tensor
    """r_t ``[B, T]``: the differentiable ratio the PPO clip acts on (1 off the mask)."""
    weight: torch.Tensor
    """c_t ``[B, T]``: detached, non-negative importance weight (0 off the mask)."""
    mask: torch.Tensor
    """M_t ``[B, T]`` bool: tokens that enter the loss (a subset of the action mask)."""


# ----------------------------------------------------------------------------- building blocks
def log_ratio(
    logp_num: torch.Tensor,
    logp_den: torch.Tensor,
    mask: torch.Tensor,
    *,
    clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> torch.Tensor:
    """Per-token log ratio log(p_num/p_den) = log p_num − log p_den, 0 off the mask, clamped
    to ±``clamp``. Off-mask entries may hold NaN/inf: they are replaced before subtracting,
    so neither the value nor the gradient sees them."""
    num = torch.where(mask, logp_num, torch.zeros_like(logp_num))
    den = torch.where(mask, logp_den, torch.zeros_like(logp_den))
    return (num - den).clamp(-clamp, clamp)


def token_ratio(
    logp_num: torch.Tensor,
    logp_den: torch.Tensor,
    mask: torch.Tensor,
    *,
    clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> torch.Tensor:
    """ρ_t = p_num(a_t|h_t) / p_den(a_t|h_t) = exp(clamp(log p_num − log p_den)); 1 off mask."""
    return log_ratio(logp_num, logp_den, mask, clamp=clamp).exp()


def sequence_log_weight(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log w(τ) = Σ_{t ∈ actions} [log π(a_t|h_t) − log q_{v_t}(a_t|h_t)], per row ``[B]``.

    Accumulated in float64 and *not* clamped per token (a product of many moderate ratios
    is exact in log space); each q_{v_t} is the behaviour version that sampled token t, so
    a trajectory whose version changes mid-sequence gets its exact weight."""
    num = torch.where(mask, logp, torch.zeros_like(logp)).double()
    den = torch.where(mask, logq, torch.zeros_like(logq)).double()
    return (num - den).sum(-1)


def geometric_mean_log_ratio(
    logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log ρ̄(τ) = (1/|τ|) Σ_{t ∈ actions} [log π(a_t|h_t) − log q(a_t|h_t)], per row ``[B]``
    (|τ| = number of action tokens; 0 for rows without actions)."""
    n = mask.sum(-1).clamp_min(1)
    return sequence_log_weight(logp, logq, mask) / n


def truncated_weight(log_w: torch.Tensor, cap: float | None) -> torch.Tensor:
    """min(w, C) = exp(min(log w, log C)), computed in log space; C = None → exp(log w),
    with the exponent clamped so it cannot overflow."""
    if cap is not None and cap <= 0:
        raise ValueError(f"truncation cap C must be > 0, got {cap}")
    hi = DEFAULT_LOG_RATIO_CLAMP if cap is None else min(math.log(cap), DEFAULT_LOG_RATIO_CLAMP)
    return log_w.clamp(max=hi).exp()


def band_mask(log_w: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """1[α ≤ w ≤ β], evaluated as log α ≤ log w ≤ log β (α = 0 means no lower bound)."""
    if not 0 <= low < high:
        raise ValueError(f"mask band needs 0 ≤ α < β, got α={low}, β={high}")
    lo = -math.inf if low == 0 else math.log(low)
    hi = math.log(high)
    return (log_w >= lo) & (log_w <= hi)


def _per_token(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-row ``[B]`` value to ``[B, T]`` like ``like``."""
    return x[:, None].expand_as(like).to(like.dtype)


def _behaviour_log_ratio(
    logprox: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor, clamp: float
) -> torch.Tensor:
    """log ρ_t = log π_prox(a_t|h_t) − log q_{v_t}(a_t|h_t), detached (clamped, 0 off mask)."""
    return log_ratio(logprox.detach(), logq.detach(), mask, clamp=clamp)


def _around_prox(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    clamp: float,
) -> Correction:
    """A correction whose clipped ratio is r_t = π_θ/π_prox on ``mask``, with weight c_t."""
    return Correction(token_ratio(logp, logprox.detach(), mask, clamp=clamp), weight, mask)


# ----------------------------------------------------------------------------- corrections
def on_policy(
    logp: torch.Tensor, logprox: torch.Tensor, mask: torch.Tensor, *, clamp: float = 20.0
) -> Correction:
    """Treat the data as sampled by π_prox (ignores the behaviour record).

    .. math:: r_t = \\pi_\\theta / \\pi_{prox},\\quad c_t = 1

    Exact only for strictly on-policy, untruncated sampling; with mixed versions or
    top-p/top-k it is biased (see tests/objectives/test_unbiasedness.py)."""
    return _around_prox(logp, logprox, mask.to(logp.dtype), mask, clamp)


def token_is(
    logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor, *, clamp: float = 20.0
) -> Correction:
    """Per-token ratio against the recorded behaviour; the clip is a trust region around q.

    .. math:: r_t = \\pi_\\theta(a_t|h_t) / q_{v_t}(a_t|h_t),\\quad c_t = 1

    (PPO with the engine's logprobs as "old" logprobs, each token against its own
    version.) Its gradient at θ = θ_prox is ρ_t A_t ∇log π_θ unless clipped."""
    r = token_ratio(logp, logq.detach(), mask, clamp=clamp)
    return Correction(r, mask.to(logp.dtype), mask)


def tis(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None,
    clamp: float = 20.0,
) -> Correction:
    """Truncated importance sampling (Ionides 2008; Yao et al. 2025 "TIS").

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = \\min(\\rho_t, C),\\quad
              \\rho_t = \\pi_{prox}(a_t|h_t)/q_{v_t}(a_t|h_t)

    Truncation trades a bounded bias (only where ρ_t > C) for bounded variance."""
    lr = _behaviour_log_ratio(logprox, logq, mask, clamp)
    c = torch.where(mask, truncated_weight(lr, cap), 0.0)
    return _around_prox(logp, logprox, c, mask, clamp)


def icepop(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
    clamp: float = 20.0,
) -> Correction:
    """IcePop token masking (Ling team, Ring-1T 2025): keep ρ_t inside [α, β], drop the rest.

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = \\rho_t,\\quad
              M_t = 1[\\alpha \\le \\rho_t \\le \\beta]

    Masked tokens get neither gradient nor weight (their mismatch is treated as noise)."""
    lr = _behaviour_log_ratio(logprox, logq, mask, clamp)
    m = mask & band_mask(lr, low, high)
    return _around_prox(logp, logprox, torch.where(m, lr.exp(), 0.0), m, clamp)


def seq_tis(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None,
    clamp: float = 20.0,
) -> Correction:
    """Sequence-level (truncated) importance sampling with the exact trajectory weight.

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = \\min(w(\\tau), C),\\quad
              \\log w(\\tau) = \\sum_t [\\log\\pi_{prox}(a_t|h_t) - \\log q_{v_t}(a_t|h_t)]

    With C = None this is the unbiased off-policy policy gradient E_q[w(τ) A ∇log π(τ)]
    (when supp q ⊇ supp π) — the estimator that needs exact per-token provenance."""
    log_w = sequence_log_weight(logprox.detach(), logq.detach(), mask)
    c = torch.where(mask, _per_token(truncated_weight(log_w, cap), logp), 0.0)
    return _around_prox(logp, logprox, c, mask, clamp)


def seq_mis(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
    clamp: float = 20.0,
) -> Correction:
    """Sequence-level masked importance sampling: weight w(τ), whole trajectory dropped
    when w(τ) leaves [α, β].

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = w(\\tau),\\quad
              M_t = 1[\\alpha \\le w(\\tau) \\le \\beta]"""
    log_w = sequence_log_weight(logprox.detach(), logq.detach(), mask)
    m = mask & _per_token(band_mask(log_w, low, high), mask).bool()
    c = torch.where(m, _per_token(truncated_weight(log_w, None), logp), 0.0)
    return _around_prox(logp, logprox, c, m, clamp)


def geo_mask(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float,
    high: float,
    clamp: float = 20.0,
) -> Correction:
    """Geometric-mean sequence mask: drop trajectories whose per-token average mismatch is
    large, independent of their length.

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = 1,\\quad
              M_t = 1[\\alpha \\le \\bar\\rho(\\tau) \\le \\beta],\\quad
              \\bar\\rho(\\tau) = \\exp\\Big(\\tfrac{1}{|\\tau|}\\sum_t \\log\\rho_t\\Big)"""
    log_g = geometric_mean_log_ratio(logprox.detach(), logq.detach(), mask)
    m = mask & _per_token(band_mask(log_g, low, high), mask).bool()
    return _around_prox(logp, logprox, m.to(logp.dtype), m, clamp)


def decoupled(
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None,
    clamp: float = 20.0,
) -> Correction:
    """Decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025): the trust region is
    around the proximal policy, the behaviour mismatch is a separate weight.

    .. math:: r_t = \\pi_\\theta/\\pi_{prox},\\quad c_t = \\rho_t = \\pi_{prox}/q_{v_t},\\quad
              M_t = 1[\\rho_t \\le C]

    As in AReaL (``behav_imp_weight_cap``), tokens whose behaviour weight exceeds the cap
    are dropped rather than truncated. C = None keeps every token."""
    lr = _behaviour_log_ratio(logprox, logq, mask, clamp)
    m = mask if cap is None else mask & band_mask(lr, 0.0, cap)
    return _around_prox(logp, logprox, torch.where(m, lr.exp(), 0.0), m, clamp)


def gspo(
    logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor, *, clamp: float = 20.0
) -> Correction:
    """GSPO sequence ratio (Zheng et al. 2025), against the recorded behaviour.

    .. math:: r_t = s(\\tau) = \\Big(\\frac{\\pi_\\theta(\\tau)}{q(\\tau)}\\Big)^{1/|\\tau|}
              = \\exp\\Big(\\tfrac{1}{|\\tau|}\\sum_t [\\log\\pi_\\theta(a_t|h_t)
              - \\log q_{v_t}(a_t|h_t)]\\Big),\\quad c_t = 1

    The clip acts on the whole sequence; pair it with ``seq_mean_token_mean`` aggregation to
    get the paper's 1/G Σ_i min(s_i A_i, clip(s_i) A_i), and with small ε (≈ 3e-4 / 4e-4)."""
    n = mask.sum(-1).clamp_min(1)
    lr = log_ratio(logp, logq.detach(), mask, clamp=clamp)
    log_s = lr.sum(-1) / n
    s = _per_token(log_s.clamp(-clamp, clamp).exp(), logp)
    return Correction(torch.where(mask, s, 1.0), mask.to(logp.dtype), mask)


# ----------------------------------------------------------------------------- dispatch
def correct(
    name: str,
    logp: torch.Tensor,
    logprox: torch.Tensor,
    logq: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None = None,
    low: float = 0.5,
    high: float = 2.0,
    clamp: float = DEFAULT_LOG_RATIO_CLAMP,
) -> Correction:
    """Apply the correction called ``name`` (one of :data:`CORRECTIONS`).

    ``cap`` is C (tis, seq_tis, decoupled), ``low``/``high`` are α/β (icepop, seq_mis,
    geo_mask); unused arguments are ignored by the other corrections."""
    table: dict[str, Callable[[], Correction]] = {
        "on_policy": lambda: on_policy(logp, logprox, mask, clamp=clamp),
        "token_is": lambda: token_is(logp, logq, mask, clamp=clamp),
        "tis": lambda: tis(logp, logprox, logq, mask, cap=cap, clamp=clamp),
        "icepop": lambda: icepop(logp, logprox, logq, mask, low=low, high=high, clamp=clamp),
        "seq_tis": lambda: seq_tis(logp, logprox, logq, mask, cap=cap, clamp=clamp),
        "seq_mis": lambda: seq_mis(logp, logprox, logq, mask, low=low, high=high, clamp=clamp),
        "geo_mask": lambda: geo_mask(logp, logprox, logq, mask, low=low, high=high, clamp=clamp),
        "decoupled": lambda: decoupled(logp, logprox, logq, mask, cap=cap, clamp=clamp),
        "gspo": lambda: gspo(logp, logq, mask, clamp=clamp),
    }
    if name not in table:
        raise ValueError(f"unknown correction {name!r}: expected one of {', '.join(CORRECTIONS)}")
    return table[name]()
